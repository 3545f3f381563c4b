"""One arm of a comparison: a process that runs one workload one way, over and over.

The controller (:mod:`rig`) starts each arm as ``python arm.py SPEC`` with the interpreter
of the tree under test (``make bench-ab`` runs the old tree's arms with the old tree's
venv) and talks to it over a pipe:

* the arm sets up its *way*, builds the workload, warms it up untimed (imports, caches,
  connections: :class:`workloads.Workload`) and writes ``ready``, with its interpreter
  and the otel_graph it imported;
* on ``go`` it runs the workload again and again, writing one JSON line a run: ``start``,
  ``computed`` (the workload returned) and ``end`` (its telemetry flushed, for an
  instrumented arm) on ``time.monotonic()``, one clock for every process on Linux, and
  ``cpu_s``, user + system seconds of this process and of its child processes (a
  cluster's workers) over the run;
* on ``stop``, read between runs, it writes how many runs it completed, stops the
  workload and exits; an instrumented arm's exit hook delivers what is left, as in any
  script.

The controller pauses and resumes the arm's whole process group (``SIGSTOP``/``SIGCONT``)
to interleave it finely with the other arms; the arm never needs to know.

The ways:

* ``plain``: Dask alone; otel_graph is never imported.
* ``otel_graph``: ``otel_graph.instrument_scheduler(**options)`` once, before the workload
  is built (so a cluster's client is traced the default way, with the SDK built from the
  ``OTEL_*`` variables the controller set); each run ends with ``handle.flush()``, timed,
  so that everything the run recorded was exported.
* ``profiler``: a fresh ``dask.diagnostics.Profiler`` registered around each run.

Every run starts from a collected heap (``gc.collect()``, untimed), in every way, so that
no run pays for a collection the ones before it owed; collections the run's own
allocations cause are timed with it. The SPEC is JSON: ``{"workload": ..., "way": ...,
"options": {...}}``. Only the standard library, psutil (a dependency of otel_graph's) and
Dask are imported here, so the arm runs under any tree's environment.
"""

from __future__ import annotations

import gc
import importlib.metadata
import json
import os
import select
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import psutil

from workloads import WORKLOADS


def cpu_seconds(children: list[psutil.Process]) -> float:
    """User + system seconds of this process (all its threads) and of ``children``."""
    total = time.process_time()
    for child in children:
        try:
            times = child.cpu_times()
        except psutil.Error:  # a child that ended counts no more
            continue
        total += times.user + times.system
    return total


def way_of(name: str, options: dict[str, Any]) -> tuple[Callable[[], AbstractContextManager[object]],
                                                       Callable[[], None]]:
    """The way's context around each run, and what it does after the workload (timed)."""
    if name == "plain":
        return nullcontext, lambda: None
    if name == "profiler":
        from dask.diagnostics import Profiler

        return Profiler, lambda: None
    if name == "otel_graph":
        import otel_graph

        handle = otel_graph.instrument_scheduler(**options)

        def flush() -> None:
            if not handle.flush(timeout_s=300):
                raise SystemExit("arm: flush did not complete within 300 s")

        return nullcontext, flush
    raise SystemExit(f"arm: unknown way {name!r}")


def stop_asked() -> bool:
    if not select.select([sys.stdin], [], [], 0)[0]:
        return False
    line = sys.stdin.readline().strip()
    if line not in ("stop", ""):
        raise SystemExit(f"arm: unknown command {line!r}")
    return True


#: The packages whose versions an A/B prints for each tree.
PACKAGES = ("dask", "distributed", "numpy", "opentelemetry-sdk", "grpcio", "protobuf")


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def main() -> None:
    spec = json.loads(sys.argv[1])
    # The pipe to the controller is this process's own: anything else written to stdout
    # (a library's print) goes to stderr instead of into the answers.
    channel = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    around, after = way_of(spec["way"], spec.get("options", {}))
    workload = WORKLOADS[spec["workload"]]()
    children = psutil.Process().children(recursive=True)
    with around():
        workload.warm()
    after()
    otel_graph = sys.modules.get("otel_graph")
    channel.write(json.dumps({"ready": {"python": sys.executable,
                                        "otel_graph": getattr(otel_graph, "__file__", None),
                                        "versions": versions()}}) + "\n")
    if sys.stdin.readline().strip() != "go":
        raise SystemExit("arm: expected go")
    runs = 0
    while not stop_asked():
        with around():
            gc.collect()
            cpu_start = cpu_seconds(children)
            start = time.monotonic()
            workload.run()
            computed = time.monotonic()
            after()
            end = time.monotonic()
            cpu_end = cpu_seconds(children)
        runs += 1
        channel.write(json.dumps({"start": start, "computed": computed, "end": end,
                                  "cpu_s": cpu_end - cpu_start}) + "\n")
    channel.write(json.dumps({"runs": runs}) + "\n")
    workload.close()


if __name__ == "__main__":
    main()
