"""A long job, for real: what the collector holds while a 10-minute compute runs.

Peers are criticised for telemetry that appears only when a job ends. This runs one
compute of sleeping tasks (threads scheduler, 4 workers, each task sleeps 1 s, so
``--minutes`` x 240 tasks) in a child process configured only through ``OTEL_*``
variables, with every default (drain every 2 s, progress every 30 s), exporting over
OTLP/gRPC to a receiver (``tests/otlp_receiver.py``) in this process. Once a second
it samples what has arrived, and reports:

* the lag between a task span's end and its arrival at the collector (median, max);
* ``dask.compute.progress`` spans that arrived before the compute returned, and the
  largest gap between two arrivals (the progress interval, plus export delay);
* when the root ``dask.compute`` arrived, relative to the compute's end;
* the child's RSS at the first and last sample (no growth over the run).

Usage::

    python benchmarks/bench_long.py [--minutes 10]

Results go to ``benchmarks/results/long-<time>.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from itertools import pairwise
from pathlib import Path
from statistics import median

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT / "tests")]

from conftest import subprocess_env  # noqa: E402
from otlp_receiver import OtlpReceiver  # noqa: E402

CHILD = """
import time, dask, dask.threaded, otel_graph
otel_graph.instrument_scheduler()
def nap(i):
    time.sleep(1.0)
    return i
n = {tasks}
graph = {{("nap", i): (nap, i) for i in range(n)}}
graph["total"] = (sum, [("nap", i) for i in range(n)])
print("STARTED", time.time_ns(), flush=True)
result = dask.threaded.get(graph, "total", num_workers=4)
print("ENDED", time.time_ns(), result, flush=True)
"""


def _rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def run(*, minutes: float) -> dict:
    tasks = int(minutes * 240)
    arrived: dict[str, int] = {}  # span id -> arrival time (ns), first seen
    progress_arrivals: list[int] = []
    rss: list[int] = []
    with OtlpReceiver() as receiver:
        env = subprocess_env(OTEL_EXPORTER_OTLP_ENDPOINT=receiver.grpc_endpoint, OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
                             OTEL_SERVICE_NAME="bench-long")
        child = subprocess.Popen([sys.executable, "-c", CHILD.format(tasks=tasks)], env=env,
                                 stdout=subprocess.PIPE, text=True)
        started = int(child.stdout.readline().split()[1])
        ended_line: list[str] = []

        def read_end() -> None:
            ended_line.append(child.stdout.readline())

        import threading

        reader = threading.Thread(target=read_end, daemon=True)
        reader.start()
        while reader.is_alive() or child.poll() is None:
            now = time.time_ns()
            for span in receiver.spans():
                if span["span_id"] not in arrived:
                    arrived[span["span_id"]] = now
                    if span["name"] == "dask.compute.progress":
                        progress_arrivals.append(now)
            if child.poll() is None:
                rss.append(_rss_kb(child.pid))
            time.sleep(1.0)  # a sampling period, not a wait for a condition
        receiver.wait_for(lambda r: any(s["name"] == "dask.compute" for s in r.spans()), timeout_s=30)
        now = time.time_ns()
        spans = receiver.spans()
        for span in spans:
            arrived.setdefault(span["span_id"], now)
    ended = int(ended_line[0].split()[1])
    naps = [s for s in spans if s["name"] == "nap"]
    lags = [(arrived[s["span_id"]] - s["end_ns"]) / 1e9 for s in naps]
    (root,) = [s for s in spans if s["name"] == "dask.compute"]
    before_end = [t for t in progress_arrivals if t < ended]
    gaps = [(b - a) / 1e9 for a, b in pairwise(before_end)]
    return {
        "minutes": minutes, "tasks": tasks + 1, "compute_s": (ended - started) / 1e9,
        "task_spans": len(naps), "aggregated": sum(s["attributes"].get("dask.task.count", 0)
                                                   for s in spans if s["attributes"].get("dask.task.aggregate")),
        "task_span_lag_s": {"median": median(lags) if lags else None, "max": max(lags) if lags else None},
        "task_spans_before_end": sum(1 for s in naps if arrived[s["span_id"]] < ended),
        "progress_spans_before_end": len(before_end),
        "first_progress_after_s": (before_end[0] - started) / 1e9 if before_end else None,
        "max_progress_gap_s": max(gaps) if gaps else None,
        "root_arrived_after_end_s": (arrived[root["span_id"]] - ended) / 1e9,
        "graph_tasks": root["attributes"].get("dask.graph.tasks"),
        "rss_kb": {"first": rss[0] if rss else None, "last": rss[-1] if rss else None, "max": max(rss, default=None)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    args = parser.parse_args()
    result = run(minutes=args.minutes)
    print(json.dumps(result, indent=2))
    out = HERE / "results" / f"long-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
