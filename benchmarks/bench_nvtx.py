"""What NVTX ranges (``OTEL_GRAPH_NVTX=true``) cost, per task, with and without a tool attached.

Each run is a fresh interpreter (an NVTX tool attaches at a process's first NVTX call and
stays), instrumented with otel_graph both ways, ranges on against ranges off, alternating,
so the ratio is what turning ranges on adds to an instrumented compute:

* ``no tool``: ranges on, no NVTX tool attached, as on a machine without Nsight Systems.
  otel_graph sees the ``dask`` domain disabled and wraps nothing.
* ``idle tool``: a tool attached that does no work (the tests' recorder, recording nothing):
  the cost of the ranges themselves, the binding's and NVTX's dispatch included.
* ``recording tool``: the recorder writing every call to a file, as a tool that records does;
  Nsight Systems' own cost per call is its own.

Workloads: ``sync-100k`` (no-op tasks: the per-task cost shows whole) and ``threads-2k``
(tasks of 1 ms on 4 threads). The sync rows also time the ranges' calls alone, a loop of
them in a fresh interpreter with the same tool: the difference between whole runs is the
same cost seen through a noisier lens. Usage::

    python benchmarks/bench_nvtx.py [--repeat 5] [--tasks 100000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

sys.path.insert(0, str(ROOT / "benchmarks"))

import stats  # noqa: E402
from nvtx_tool import build_recorder  # noqa: E402  (the tests' helper, found on the path set above)

#: One run: argv is the workload, the task count and whether ranges are on; prints the seconds
#: of the compute and its flush.
RUN = """
import gc, sys, time
import dask, dask.threaded
import otel_graph
workload, tasks, nvtx = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
handle = otel_graph.instrument_scheduler(nvtx=nvtx)
def noop():
    return None
def nap():
    time.sleep(0.001)
if workload == "sync":
    graph = {("noop", i): (noop,) for i in range(tasks)}
    get = dask.get
else:
    graph = {("nap", i): (nap,) for i in range(tasks)}
    get = lambda g, k: dask.threaded.get(g, k, num_workers=4)
keys = list(graph)
get({("warm", 0): (noop,)}, [("warm", 0)])
gc.collect()
start = time.perf_counter()
get(graph, keys)
if not handle.flush(timeout_s=300):
    raise SystemExit("flush did not complete")
print(time.perf_counter() - start)
"""


#: The ranges alone, per task: push, key mark and pop for 100,000 tuple keys of 20 prefixes,
#: best of five; end-to-end differences between whole runs are noisier than that cost.
ALONE = """
import time
from otel_graph.telemetry.nvtx_ranges import process_ranges
ranges = process_ranges()
keys = [(f"prefix{i % 20}-8a6f31c2", i) for i in range(100_000)]
best = float("inf")
for _ in range(5):
    start = time.perf_counter()
    if ranges is not None:
        for key in keys:
            if ranges.task_started(key):
                ranges.task_ended()
    best = min(best, time.perf_counter() - start)
print(best / len(keys) * 1e6)
"""


def _alone(env: dict[str, str]) -> float:
    """µs a task spends in its range's calls, in a fresh interpreter with ``env``'s tool."""
    out = subprocess.run([sys.executable, "-c", ALONE], env=env, capture_output=True, text=True, check=True,
                         timeout=600)
    return float(out.stdout.split()[-1])


def _run(workload: str, tasks: int, nvtx: bool, env: dict[str, str]) -> float:
    out = subprocess.run([sys.executable, "-c", RUN, workload, str(tasks), "1" if nvtx else "0"], env=env,
                         capture_output=True, text=True, check=True, timeout=900)
    return float(out.stdout.split()[-1])


def row(name: str, workload: str, tasks: int, env: dict[str, str], *, repeat: int) -> dict:
    off, on = [], []
    for _ in range(repeat):
        off.append(_run(workload, tasks, False, env))
        on.append(_run(workload, tasks, True, env))
    ratio = stats.paired(on, off)
    # Wall time over tasks is a task's cost on the sync scheduler only: on a pool the threads
    # overlap, and 1 ms naps hide what they add.
    per_task_us = (statistics.median(on) - statistics.median(off)) / tasks * 1e6 if workload == "sync" else None
    detail = "ranges on / off, both instrumented"
    if per_task_us is not None:
        detail += f"; {per_task_us:+.2f} µs a task end to end, {_alone(env):.2f} µs in the ranges' calls alone"
    return {"workload": name, "bar": None, "ratio": ratio.ratio, "lo": ratio.lo, "hi": ratio.hi,
            "baseline_s": statistics.median(off),
            "instrumented_s": statistics.median(on), "per_task_us": per_task_us, "detail": detail}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.repeat < 2:
        parser.error(f"--repeat {args.repeat}: an interval needs at least 2 rounds")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "NVTX_"))}
    base.update(OTEL_TRACES_EXPORTER="none", OTEL_METRICS_EXPORTER="none",
                PYTHONPATH=os.pathsep.join([str(ROOT), base.get("PYTHONPATH", "")]))
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        library = build_recorder(Path(scratch))
        tools = {"no tool": {}, "idle tool": {"NVTX_INJECTION64_PATH": str(library), "NVTX_RECORDER_DIR": ""},
                 "recording tool": {"NVTX_INJECTION64_PATH": str(library), "NVTX_RECORDER_DIR": scratch}}
        for workload, tasks in (("sync", args.tasks), ("threads", 2000)):
            for tool, extra in tools.items():
                name = f"nvtx {workload}-{tasks // 1000}k, {tool}"
                rows.append(row(name, workload, tasks, {**base, **extra}, repeat=args.repeat))
                for path in Path(scratch).glob("nvtx-*.tsv"):
                    path.unlink()
                print(f"{name:<36} off {rows[-1]['baseline_s']:.3f}s  on {rows[-1]['instrumented_s']:.3f}s  "
                      f"ratio {rows[-1]['ratio']:.3f} [{rows[-1]['lo']:.3f}, {rows[-1]['hi']:.3f}]  "
                      f"{rows[-1]['detail']}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
