"""Overhead of otel_graph on a dask.distributed LocalCluster, as a ratio measured in one run.

A LocalCluster of 2 worker processes (2 threads each) runs ``--tasks`` no-op tasks
through ``client.get``, alternating without and with instrumentation
(``instrument_scheduler(client=...)`` then ``uninstrument()``, which also takes the
plugins off the cluster), exporting over OTLP/gRPC to a receiver in another process.
The instrumented time includes ``handle.flush()``, which waits for every worker's spans
to be exported. Median of ``--repeat`` rounds. Usage::

    python benchmarks/bench_distributed.py [--tasks 5000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import Receiver, paired_ratio  # noqa: E402


def noop() -> None:
    return None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", help="write the row here")
    args = parser.parse_args()

    receiver = Receiver()
    os.environ.update(OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint, OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
                      OTEL_SERVICE_NAME="bench-distributed")
    from distributed import Client, LocalCluster

    import otel_graph

    with LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        graph = {f"noop-{i}": (noop,) for i in range(args.tasks)}
        keys = list(graph)
        client.get(graph, keys)  # warm up: imports and connections on every worker

        def plain() -> float:
            start = time.perf_counter()
            client.get(graph, keys)
            return time.perf_counter() - start

        def instrumented() -> tuple[float, float]:
            handle = otel_graph.instrument_scheduler(client=client)
            start = time.perf_counter()
            client.get(graph, keys)
            computed = time.perf_counter() - start
            ok = handle.flush(timeout_s=60)
            flushed = time.perf_counter() - start
            handle.uninstrument()
            if not ok:
                raise SystemExit("flush did not complete")
            return computed, flushed

        bases, computes, totals = [], [], []
        for _ in range(args.repeat):
            bases.append(plain())
            computed, flushed = instrumented()
            computes.append(computed)
            totals.append(flushed)
    # The receiver stays up until this process exits: the exit hook still delivers the last metrics.
    base = statistics.median(bases)
    ratio, compute_ratio = paired_ratio(totals, bases), paired_ratio(computes, bases)
    name = f"distributed-{args.tasks // 1000}k"
    print(f"{name}  base {base:.3f}s  with otel_graph {statistics.median(totals):.3f}s  "
          f"ratio {ratio:.3f}  (compute only {compute_ratio:.3f})")
    if args.json:
        row = {"workload": name, "bar": 1.10, "ratio": ratio, "detail": f"compute alone {compute_ratio:.3f}×"}
        Path(args.json).write_text(json.dumps([row], indent=2))


if __name__ == "__main__":
    main()
