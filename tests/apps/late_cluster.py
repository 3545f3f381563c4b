"""A user's script that imports dask.distributed only after instrumenting, run by the tests.

Configured through OTEL_* variables. It prints DISTRIBUTED_AT_INSTRUMENT (whether
``instrument_scheduler()`` had imported dask.distributed), LOCAL (a sync compute's
result, made before the import), RESULT (a 21-task graph on a LocalCluster with worker
processes) and FLUSHED.
"""

from __future__ import annotations

import sys

import otel_graph


def inc(x: int) -> int:
    return x + 1


if __name__ == "__main__":
    handle = otel_graph.instrument_scheduler()
    print("DISTRIBUTED_AT_INSTRUMENT", "distributed" in sys.modules, flush=True)
    import dask

    print("LOCAL", dask.delayed(inc)(1).compute(scheduler="sync"), flush=True)
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        graph = {f"inc-{i}": (inc, i) for i in range(20)}
        graph["total"] = (sum, [f"inc-{i}" for i in range(20)])
        print("RESULT", client.get(graph, "total"), flush=True)
        print("FLUSHED", handle.flush(timeout_s=30), flush=True)
