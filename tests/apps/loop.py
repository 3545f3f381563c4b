"""Many tiny computes in a loop (tests/test_scale.py): prints RSS, objects, threads and backlogs.

``--computes N`` computes of two tasks each on ``--scheduler`` (sync or threads), with
SAMPLE lines at a tenth and at the end (the thread count leaves out Dask's pool), then flushes
and prints FLUSHED and the stats.

A sample is taken once the spans queued for export are delivered: a queue waiting on the
export thread is buffering, bounded by ``OTEL_GRAPH_MAX_QUEUED_SPANS``, not growth. How
many were queued at most is printed too.
"""

from __future__ import annotations

import argparse
import gc
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
    processor, queued = handle._owned.span_processor, 0
    for i in range(1, args.computes + 1):
        token = uuid.uuid4().hex  # distinct keys each time, as real loops have
        graph = {f"a-{token}": (int, 1), f"b-{token}": (sum, [f"a-{token}"])}
        get(graph, f"b-{token}")
        queued = max(queued, processor.pending)
        if i in (args.computes // 10, args.computes):
            backlog = handle._tracker._backlog
            drained = handle.flush(timeout_s=60)
            gc.collect()
            # Dask's pool starts its threads as it needs them, up to one a core: a machine under
            # load may need its second only late in the loop. Every other thread counts.
            ours = sum(1 for thread in threading.enumerate() if not thread.name.startswith("ThreadPoolExecutor-"))
            print("SAMPLE", i, me.memory_info().rss, ours, backlog, queued, len(gc.get_objects()), drained, flush=True)
    print("FLUSHED", handle.flush(timeout_s=60), handle.stats(), flush=True)


if __name__ == "__main__":
    main()
