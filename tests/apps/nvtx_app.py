"""A GPU user's script profiled under an NVTX tool (tests/test_nvtx.py).

It turns NVTX ranges on as ``--how`` says (the ``nvtx=True`` option, or the OTEL_GRAPH_NVTX
variable the parent set), then computes on each scheduler ``--schedulers`` names:

* ``sync``: ``load`` tasks and a ``total``, each ``load`` opening a range of the user's own
  (domain ``user``), then a compute whose ``boom`` task raises;
* ``threads``: 24 tasks that sleep a little, so that several pool threads run them;
* ``processes``: 6 tasks in pool processes;
* ``cluster``: a LocalCluster of two worker processes, 8 tasks and one ``async def`` task;
* ``inprocess``: a LocalCluster of two workers in this process, 8 tasks.

Prints ``RESULT <scheduler> <value>`` per compute; at the end ``NVTX_IMPORTED <bool>``, and
``TOOL_SEEN <bool>`` (whether otel_graph found an NVTX tool attached) when ranges were asked
for; flushes what it recorded. With ``--uninstrument``, it then uninstruments and prints
``RESTORED <bool>``: whether distributed's task runners are its own again.
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


def run_cluster(*, processes: bool) -> None:
    from distributed import Client, LocalCluster

    name = "cluster" if processes else "inprocess"
    with LocalCluster(n_workers=2, threads_per_worker=2, processes=processes, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        print(f"RESULT {name}", sum(dask.compute(*[delayed(nap)(i) for i in range(8)])))
        if processes:
            print("RESULT cluster-async", client.submit(fetch, 1).result())
        assert otel_graph.instrument_scheduler().flush(timeout_s=60)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--how", choices=["option", "variable"], default="option")
    parser.add_argument("--schedulers", default="sync,threads,processes,cluster")
    parser.add_argument("--uninstrument", action="store_true")
    args = parser.parse_args()
    options = {"nvtx": True} if args.how == "option" else {}
    if args.uninstrument:
        import distributed.worker

        runners = (distributed.worker._run_task, distributed.worker._run_task_async)
    handle = otel_graph.instrument_scheduler(**options)
    for scheduler in args.schedulers.split(","):
        if scheduler == "sync":
            run_sync()
        elif scheduler in ("cluster", "inprocess"):
            run_cluster(processes=scheduler == "cluster")
        else:
            run_pool(scheduler, 24 if scheduler == "threads" else 6)
    print("NVTX_IMPORTED", "nvtx" in sys.modules)
    if handle.settings.nvtx:
        from otel_graph.telemetry.nvtx_ranges import process_ranges

        print("TOOL_SEEN", process_ranges() is not None)
    print("FLUSHED", handle.flush(timeout_s=60))
    if args.uninstrument:
        handle.uninstrument()
        print("RESTORED", (distributed.worker._run_task, distributed.worker._run_task_async) == runners)


if __name__ == "__main__":
    main()
