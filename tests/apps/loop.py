"""Many tiny computes in a loop (tests/test_scale.py): prints RSS, threads and the tracker's backlog.

``--computes N`` computes of two tasks each on ``--scheduler`` (sync or threads), with
SAMPLE lines at a tenth and at the end, then flushes and prints FLUSHED and the stats.
"""

from __future__ import annotations

import argparse
import threading
import uuid

import dask
import dask.threaded
import psutil

import otel_graph


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--computes", type=int, default=6000)
    parser.add_argument("--scheduler", default="sync")
    args = parser.parse_args()
    handle = otel_graph.instrument_scheduler()
    me = psutil.Process()
    get = dask.threaded.get if args.scheduler == "threads" else dask.get
    for i in range(1, args.computes + 1):
        token = uuid.uuid4().hex  # distinct keys each time, as real loops have
        graph = {f"a-{token}": (int, 1), f"b-{token}": (sum, [f"a-{token}"])}
        get(graph, f"b-{token}")
        if i in (args.computes // 10, args.computes):
            print("SAMPLE", i, me.memory_info().rss, threading.active_count(), handle._tracker._backlog, flush=True)
    print("FLUSHED", handle.flush(timeout_s=60), handle.stats(), flush=True)


if __name__ == "__main__":
    main()
