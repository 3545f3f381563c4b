"""A GPU user's script profiled under an NVTX tool (tests/test_nvtx.py).

It turns NVTX ranges on as ``--how`` says (the ``nvtx=True`` option, or the OTEL_GRAPH_NVTX
variable the parent set), then computes on each scheduler ``--schedulers`` names:

* ``sync``: ``load`` tasks and a ``total``, each ``load`` opening a range of the user's own
  (domain ``user``), then a compute whose ``boom`` task raises;
* ``threads``: 24 tasks that sleep a little, so that several pool threads run them;
* ``processes``: 6 tasks in pool processes;
* ``cluster``: a LocalCluster of two worker processes, 8 tasks and one ``async def`` task.

Prints ``RESULT <scheduler> <value>`` per compute, ``NVTX_IMPORTED <bool>`` at the end, and
flushes what it recorded.
"""

from __future__ import annotations

import argparse
import sys
import time

import dask
from dask import delayed

import otel_graph


def load(i: int) -> int:
    import nvtx

    with nvtx.annotate("user-step", domain="user"):
        time.sleep(0.002)
    return i


def total(*parts: int) -> int:
    return sum(parts)


def boom(x: int) -> int:
    raise ValueError(f"boom {x}")


def nap(i: int) -> int:
    time.sleep(0.01)
    return i * 2


async def fetch(i: int) -> int:
    return i + 100


def run_sync() -> None:
    print("RESULT sync", dask.compute(delayed(total)(*[delayed(load)(i) for i in range(4)]), scheduler="sync")[0])
    try:
        dask.compute(delayed(boom)(1), scheduler="sync")
    except ValueError as exc:
        print("RESULT sync-failed", exc)


def run_pool(scheduler: str, count: int) -> None:
    values = dask.compute(*[delayed(nap)(i) for i in range(count)], scheduler=scheduler)
    print(f"RESULT {scheduler}", sum(values))


def run_cluster() -> None:
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        print("RESULT cluster", sum(dask.compute(*[delayed(nap)(i) for i in range(8)])))
        print("RESULT cluster-async", client.submit(fetch, 1).result())
        assert otel_graph.instrument_scheduler().flush(timeout_s=60)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--how", choices=["option", "variable"], default="option")
    parser.add_argument("--schedulers", default="sync,threads,processes,cluster")
    args = parser.parse_args()
    options = {"nvtx": True} if args.how == "option" else {}
    handle = otel_graph.instrument_scheduler(**options)
    for scheduler in args.schedulers.split(","):
        if scheduler == "sync":
            run_sync()
        elif scheduler == "cluster":
            run_cluster()
        else:
            run_pool(scheduler, 24 if scheduler == "threads" else 6)
    print("NVTX_IMPORTED", "nvtx" in sys.modules)
    print("FLUSHED", handle.flush(timeout_s=60))


if __name__ == "__main__":
    main()
