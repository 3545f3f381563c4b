"""The workloads the benchmarks time: each a Dask job an arm runs once per round.

A workload is built once in its arm's process (:mod:`arm`) and then run whole in every
round. Building it (the graph, a cluster) is never timed. This module imports only the
standard library at its top, and Dask inside each builder, so that it runs under any tree's
environment: ``make bench-ab`` runs it under the old tree's venv too.

* ``sync-100k``: 100,000 independent no-op tasks in one ``dask.get`` (the sync scheduler).
* ``threads-2k``: 2,000 tasks sleeping 1 ms each on the threads scheduler, 4 workers.
* ``tiny-sync-2k``: 2,000 one-task computes, ``delayed(inc)(i).compute(scheduler="sync")``.
* ``tiny-array-200``: 200 small array computes, ``da.ones(100, chunks=10).sum()`` on the
  threads scheduler (about 25 tasks each).
* ``distributed-5k``: 5,000 no-op tasks through ``client.get`` on a ``LocalCluster`` of 2
  worker processes with 2 threads each, started in the arm's process (its scheduler runs
  there; its workers are the arm's child processes, whose CPU time the arm counts).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field


def noop() -> None:
    return None


def nap() -> None:
    time.sleep(0.001)


def inc(x: int) -> int:
    return x + 1


@dataclass
class Workload:
    """What an arm runs each round (``run``), once before them to warm up (``warm``: the
    same, smaller where the whole costs seconds), and what it stops at its end (``close``)."""

    run: Callable[[], object]
    warm: Callable[[], object]
    close: Callable[[], None] = field(default=lambda: None)


def sync_100k() -> Workload:
    import dask

    graph = {("noop", i): (noop,) for i in range(SYNC_TASKS)}
    keys = list(graph)
    warm = {("warm", i): (noop,) for i in range(SYNC_WARM_TASKS)}
    return Workload(run=lambda: dask.get(graph, keys), warm=lambda: dask.get(warm, list(warm)))


def threads_2k() -> Workload:
    import dask.threaded

    graph = {("nap", i): (nap,) for i in range(2000)}
    keys = list(graph)
    def run() -> object:
        return dask.threaded.get(graph, keys, num_workers=4)

    return Workload(run=run, warm=run)


def tiny_sync_2k() -> Workload:
    import dask

    def computes(n: int = 2000) -> None:
        for i in range(n):
            dask.delayed(inc)(i).compute(scheduler="sync")

    return Workload(run=computes, warm=lambda: computes(200))


def tiny_array_200() -> Workload:
    import dask.array as da

    ones = da.ones(100, chunks=10)

    def computes(n: int = 200) -> None:
        for _ in range(n):
            ones.sum().compute(scheduler="threads")

    return Workload(run=computes, warm=lambda: computes(20))


def distributed_5k() -> Workload:
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=":0")
    client = Client(cluster)
    graph = {f"noop-{i}": (noop,) for i in range(5000)}
    keys = list(graph)
    warm = {f"warm-{i}": (noop,) for i in range(500)}

    def close() -> None:
        client.close()
        cluster.close()

    return Workload(run=lambda: client.get(graph, keys), warm=lambda: client.get(warm, list(warm)), close=close)


WORKLOADS: dict[str, Callable[[], Workload]] = {
    "sync-100k": sync_100k,
    "threads-2k": threads_2k,
    "tiny-sync-2k": tiny_sync_2k,
    "tiny-array-200": tiny_array_200,
    "distributed-5k": distributed_5k,
}
#: Computes a run makes, known without building the workload.
COMPUTES = {"sync-100k": 1, "threads-2k": 1, "tiny-sync-2k": 2000, "tiny-array-200": 200, "distributed-5k": 1}
SYNC_TASKS = 100_000
SYNC_WARM_TASKS = 1000

