"""Overhead of otel_graph, as ratios measured in one run (never timed assertions in tests).

Workloads, each timed without instrumentation and with it, alternating, in this one
process, against an OTLP/gRPC receiver running in *another* process:

* ``sync-100k``: 100,000 independent no-op tasks on the sync scheduler, default span
  budget, including ``flush()`` (everything exported). Bar: <= 1.25x.
* ``sync-100k-unlimited``: the same with ``OTEL_GRAPH_MAX_TASK_SPANS=unlimited``,
  every span delivered (checked against the receiver's count). Bar: <= 1.5x.
* ``threads-2k``: 2,000 tasks sleeping 1 ms on the threads scheduler (4 workers);
  including the final flush (and reported for the compute alone). Bar: <= 1.03x.
* ``sync-100k-own-processes``: ``sync-100k``, each run in a fresh interpreter of its own,
  the plain one never importing otel_graph: what a user compares. Within one process the
  plain runs carry what instrumenting imported (the SDK, gRPC), which every full garbage
  collection walks; here they do not. Bar: <= 1.25x.

Each run starts from a collected heap (``gc.collect()``, untimed, either way). A ratio is
:func:`paired_ratio`'s: the median over ``--repeat`` rounds of the instrumented run's time
over the plain run's just before it. Usage::

    python benchmarks/run.py [--repeat 3] [--tasks 100000] [--json out.json]
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
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECEIVER = """
import sys
sys.path.insert(0, {tests!r})
from otlp_receiver import OtlpReceiver
with OtlpReceiver() as r:
    print(r.grpc_endpoint, flush=True)
    for line in sys.stdin:
        if line.strip() == "count":
            print(sum(1 for _ in r.spans()), flush=True)
        elif line.strip() == "clear":
            r.clear(); print("ok", flush=True)
        else:
            break
"""


def noop() -> None:
    return None


def nap() -> None:
    time.sleep(0.001)


class Receiver:
    """An OTLP receiver in a child process, so its decoding does not share our GIL."""

    def __init__(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-c", RECEIVER.format(tests=str(ROOT / "tests"))],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        self.endpoint = self._proc.stdout.readline().strip()

    def ask(self, command: str) -> str:
        self._proc.stdin.write(command + "\n")
        self._proc.stdin.flush()
        return self._proc.stdout.readline().strip()

    def close(self) -> None:
        self._proc.stdin.close()
        self._proc.wait(10)


#: One run of ``sync-100k-own-processes``, in a fresh interpreter: argv is the task count and
#: whether to instrument; it prints the compute's seconds and the flush's (0 plain).
OWN_PROCESS_RUN = """
import gc, sys, time
import dask
tasks, traced = int(sys.argv[1]), sys.argv[2] == "1"
if traced:
    import otel_graph
    handle = otel_graph.instrument_scheduler()
def noop():
    return None
graph = {("noop", i): (noop,) for i in range(tasks)}
keys = list(graph)
dask.get({("warm", 0): (noop,)}, [("warm", 0)])
gc.collect()
start = time.perf_counter()
dask.get(graph, keys)
computed = time.perf_counter() - start
if traced and not handle.flush(timeout_s=300):
    raise SystemExit("flush did not complete")
print(computed, time.perf_counter() - start)
"""


def own_processes(tasks: int, *, repeat: int, bar: float) -> dict:
    """``sync-100k`` with each run in a fresh interpreter of its own (OTEL_* from this one's)."""
    def run(traced: bool) -> tuple[float, float]:
        out = subprocess.run([sys.executable, "-c", OWN_PROCESS_RUN, str(tasks), "1" if traced else "0"],
                             capture_output=True, text=True, check=True, timeout=600)
        computed, total = map(float, out.stdout.split())
        return computed, total
    base, inst, inst_compute = [], [], []
    for _ in range(repeat):
        base.append(run(False)[1])
        computed, total = run(True)
        inst_compute.append(computed)
        inst.append(total)
    row = {"workload": "sync-100k-own-processes", "bar": bar, "baseline_s": statistics.median(base),
           "instrumented_s": statistics.median(inst), "ratio": paired_ratio(inst, base),
           "ratio_compute_only": paired_ratio(inst_compute, base)}
    row["detail"] = f"compute alone {row['ratio_compute_only']:.3f}×"
    return row


def paired_ratio(runs: list[float], plain: list[float]) -> float:
    """The median over rounds of a run's time over the plain run's of the same round.

    This machine's speed drifts by tens of percent over seconds (other tenants of its host);
    a round's two runs, back to back, see nearly the same machine, where the medians of each
    way, taken apart, can pair a slow stretch of one with a fast stretch of the other.
    """
    return statistics.median(run / base for run, base in zip(runs, plain, strict=True))


def timed(fn: Callable[[], object]) -> float:
    gc.collect()  # see measure()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(name: str, work: Callable[[], object], *, options: dict, repeat: int, flush: bool,
            receiver: Receiver, bar: float, expect_spans: int | None = None) -> dict:
    import otel_graph

    base, inst, inst_compute = [], [], []
    delivered = None
    for _ in range(repeat):
        base.append(timed(work))
        receiver.ask("clear")
        handle = otel_graph.instrument_scheduler(**options)
        # Each run starts from a collected heap, either way: a full collection here walks the
        # 100k-task graph (~45 ms, 8% of threads-2k), and one owed to earlier runs landed in
        # whichever run came next. Collections a run's own allocations cause are timed with it.
        gc.collect()
        start = time.perf_counter()
        work()
        inst_compute.append(time.perf_counter() - start)
        ok = handle.flush(timeout_s=300) if flush else True
        inst.append(time.perf_counter() - start)
        if not flush:
            handle.flush(timeout_s=300)
        handle.uninstrument()
        if expect_spans is not None:
            delivered = int(receiver.ask("count"))
        assert ok, "flush did not complete"
    row = {
        "workload": name,
        "bar": bar,
        "baseline_s": statistics.median(base),
        "instrumented_s": statistics.median(inst),
        "ratio": paired_ratio(inst, base),
        "ratio_compute_only": paired_ratio(inst_compute, base),
    }
    row["detail"] = f"compute alone {row['ratio_compute_only']:.3f}×"
    if expect_spans is not None:
        row["spans_delivered"] = delivered
        row["spans_expected"] = expect_spans
        # A compute running past a drain's second also has a dask.compute.progress span or two.
        extra = delivered - expect_spans
        row["detail"] += (f"; {delivered:,} spans delivered: {expect_spans:,} task and compute spans and "
                          f"{extra} progress spans" if extra >= 0 else f"; {-extra:,} spans MISSING")
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--json")
    parser.add_argument("--only", help="run only the workloads whose name contains this")
    args = parser.parse_args()

    receiver = Receiver()
    # Registered before otel_graph's own exit hook, so it runs after it: the receiver
    # outlives our final export instead of being counted as undelivered.
    atexit.register(receiver.close)
    os.environ.update({
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "OTEL_SERVICE_NAME": "otel-graph-bench",
    })
    import dask
    import dask.threaded

    graph = {("noop", i): (noop,) for i in range(args.tasks)}
    keys = list(graph)
    naps = {("nap", i): (nap,) for i in range(2000)}
    nap_keys = list(naps)
    common: dict = {}
    workloads = [
        lambda: measure("sync-100k", lambda: dask.get(graph, keys), options=common, repeat=args.repeat,
                flush=True, receiver=receiver, bar=1.25),
        lambda: measure("sync-100k-unlimited", lambda: dask.get(graph, keys),
                options={**common, "max_task_spans": "unlimited"}, repeat=args.repeat, flush=True,
                receiver=receiver, bar=1.5, expect_spans=args.tasks + 1),
        lambda: measure("threads-2k", lambda: dask.threaded.get(naps, nap_keys, num_workers=4), options=common,
                repeat=max(args.repeat, 5), flush=True, receiver=receiver, bar=1.03),
        lambda: own_processes(args.tasks, repeat=args.repeat, bar=1.25),
    ]
    names = ["sync-100k", "sync-100k-unlimited", "threads-2k", "sync-100k-own-processes"]
    rows = [run() for name, run in zip(names, workloads, strict=True) if not args.only or args.only in name]
    for row in rows:
        extra = f"  spans {row['spans_delivered']}/{row['spans_expected']}" if "spans_delivered" in row else ""
        print(f"{row['workload']:<22} base {row['baseline_s']:.3f}s  with otel_graph {row['instrumented_s']:.3f}s"
              f"  ratio {row['ratio']:.3f}  (compute only {row['ratio_compute_only']:.3f}){extra}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
