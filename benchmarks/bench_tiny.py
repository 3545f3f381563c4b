"""What otel_graph costs many small computes, against plain Dask and dask.diagnostics.Profiler.

Notebooks, dashboards, services answering requests with Dask and test suites make
thousands of computes of a few tasks each; there the cost per compute (a root span,
a trace built and exported) is what users feel, not the cost per task. Workloads,
each timed plain, with otel_graph (its final ``flush()`` included: every span exported
to an OTLP/gRPC receiver in another process) and with ``dask.diagnostics.Profiler``
registered, alternating, in this one process:

* ``tiny-sync-2k``: 2,000 one-task computes, ``delayed(inc)(i).compute(scheduler="sync")``.
  Bar: <= 1.15x.
* ``tiny-array-200``: 200 small array computes, ``da.ones(100, chunks=10).sum().compute()``
  on the threads scheduler (about 25 tasks each). Bar: <= 1.10x.
* ``dask-suite`` (with ``--dask-suite``): part of the test suite shipped in the dask wheel
  (local schedulers, delayed, tracebacks, bag, array core), run by pytest plain and with
  otel_graph instrumenting every test's schedulers (``tests/peer/otel_graph_peer.py``),
  exporting over OTLP/gRPC to the same receiver. Bar: <= 1.10x.

Each tiny ratio is the median over ``--repeat`` rounds of a way's time over the plain time
of the same round (``run.paired_ratio``), the suite's likewise over ``--suite-repeat`` runs.
Each round starts from a collected heap (``gc.collect()``, untimed): a full collection costs
30-40 ms here, 5% of a round, and one owed to the rounds before would land in whichever round
came next. Collections a round's own allocations cause are timed with it. Usage::

    python benchmarks/bench_tiny.py [--repeat 21] [--dask-suite [--suite-repeat 2]] [--json rows.json]
"""

from __future__ import annotations

import argparse
import atexit
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from run import Receiver, paired_ratio  # noqa: E402

#: The dask test modules of ``dask-suite``: the local schedulers, delayed, bag, array core.
DASK_SUITE = ("dask.tests.test_local", "dask.tests.test_threaded", "dask.tests.test_multiprocessing",
              "dask.tests.test_delayed", "dask.tests.test_base", "dask.tests.test_order", "dask.tests.test_traceback",
              "dask.bag.tests.test_bag", "dask.array.tests.test_array_core")


def inc(x: int) -> int:
    return x + 1


def timed(work: Callable[[], object]) -> float:
    gc.collect()
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def measure(name: str, work: Callable[[], object], *, computes: int, repeat: int, bar: float) -> dict:
    from dask.diagnostics import Profiler

    import otel_graph

    def traced() -> float:
        handle = otel_graph.instrument_scheduler()
        gc.collect()
        start = time.perf_counter()
        work()
        if not handle.flush(timeout_s=120):
            raise SystemExit(f"{name}: flush did not complete")
        took = time.perf_counter() - start
        handle.uninstrument()
        return took

    def profiled() -> float:
        profiler = Profiler()
        profiler.register()
        try:
            return timed(work)
        finally:
            profiler.unregister()

    ways: dict[str, Callable[[], float]] = {"plain": lambda: timed(work), "otel_graph": traced, "profiler": profiled}
    times: dict[str, list[float]] = {way: [] for way in ways}
    order = list(ways)
    for round_ in range(repeat):
        for way in order[round_ % 3:] + order[:round_ % 3]:  # each way first in turn: no order favoured
            times[way].append(ways[way]())
    each = {way: statistics.median(took) for way, took in times.items()}
    us = {key: value / computes * 1e6 for key, value in each.items()}
    return {
        "workload": name, "bar": bar, "ratio": paired_ratio(times["otel_graph"], times["plain"]),
        "detail": (f"{us['plain']:.0f} µs plain, {us['otel_graph']:.0f} µs with otel_graph a compute "
                   f"(+{us['otel_graph'] - us['plain']:.0f} µs); Profiler "
                   f"{paired_ratio(times['profiler'], times['plain']):.3f}×"),
    }


def dask_suite(repeat: int, endpoint: str) -> dict:
    """Dask's own tests, plain and instrumented, alternating; the pytest wall time of each."""
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    # test_binary_operator_delegation needs pytest-mock, which otel_graph's test set does not install;
    # test_interrupt raises KeyboardInterrupt in the main thread from a timer, and a signal that lands
    # outside the scheduler's wait can leave plain Dask waiting forever.
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               "-k", "not test_binary_operator_delegation and not test_interrupt",
               "--pyargs", *DASK_SUITE]
    traced_env = {**base_env, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests" / "peer"), str(ROOT)]),
                  "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                  "OTEL_SERVICE_NAME": "otel-graph-bench-dask-suite",
                  "OTEL_GRAPH_PEER_STATS": str(Path(tempfile.mkdtemp(prefix="otel-graph-bench-suite-")) / "stats")}
    plain, traced = [], []
    for _ in range(repeat):
        for env, extra, out in ((base_env, [], plain), (traced_env, ["-p", "otel_graph_peer"], traced)):
            start = time.perf_counter()
            run = subprocess.run(command + extra, env=env, capture_output=True, text=True, cwd=tempfile.gettempdir())
            out.append(time.perf_counter() - start)
            if run.returncode != 0:
                raise SystemExit(f"dask-suite failed{' instrumented' if extra else ''}:\n{run.stdout[-3000:]}")
    summary = run.stdout.strip().splitlines()[-1]
    stats = json.loads(Path(traced_env["OTEL_GRAPH_PEER_STATS"]).read_text())
    base = statistics.median(plain)
    return {"workload": "dask-suite", "bar": 1.10, "ratio": paired_ratio(traced, plain),
            "detail": (f"{base:.0f} s plain, {statistics.median(traced):.0f} s instrumented ({summary}; "
                       f"{stats['spans_exported']:,} spans exported, {stats['spans_undelivered']} undelivered, a run)")}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=21, help="rounds of each tiny workload")
    parser.add_argument("--suite-repeat", type=int, default=2, help="runs of dask's suite, each way")
    parser.add_argument("--dask-suite", action="store_true", help="also time dask's own tests (a few minutes)")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()

    receiver = Receiver()
    # Registered before otel_graph's own exit hook, so it runs after it: the receiver
    # outlives the final export.
    atexit.register(receiver.close)
    os.environ.update({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                       "OTEL_SERVICE_NAME": "otel-graph-bench-tiny"})
    import dask
    import dask.array as da

    ones = da.ones(100, chunks=10)

    def one_task_computes() -> None:
        for i in range(2000):
            dask.delayed(inc)(i).compute(scheduler="sync")

    def array_computes() -> None:
        for _ in range(200):
            ones.sum().compute(scheduler="threads")

    one_task_computes(), array_computes()  # warm up: imports, caches
    rows = [measure("tiny-sync-2k", one_task_computes, computes=2000, repeat=args.repeat, bar=1.15),
            measure("tiny-array-200", array_computes, computes=200, repeat=args.repeat, bar=1.10)]
    if args.dask_suite:
        rows.append(dask_suite(args.suite_repeat, receiver.endpoint))
    for row in rows:
        print(f"{row['workload']:<16} ratio {row['ratio']:.3f} (bar {row['bar']:.2f})  {row['detail']}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
