"""A user's script whose tasks start OpenTelemetry spans of their own (tests/test_user_spans.py).

Each ``work`` task starts ``user.step`` with ``user.inner`` inside it; ``nested`` runs a
compute inside a task. Run on the scheduler named by ``--scheduler``, with whatever
OTEL_* the parent set, then flushed. ``--scheduler distributed`` runs them on a LocalCluster
of two worker processes, with ``awork`` (an ``async def`` task, run on a worker's event loop)
in place of ``nested``; ``--scheduler distributed-inprocess`` on one of two workers in this process.
"""

from __future__ import annotations

import argparse

import dask
from dask import delayed
from opentelemetry import trace

import otel_graph

tracer = trace.get_tracer("user-code")


def work(x: int) -> int:
    tracer = trace.get_tracer("user-code")  # not the global: a task pickled from __main__ takes its globals along
    with tracer.start_as_current_span("user.step") as step:
        step.set_attribute("x", x)
        with tracer.start_as_current_span("user.inner"):
            pass
    return x + 1


async def awork(x: int) -> int:
    return work(x)


def nested(x: int) -> int:
    return dask.compute(delayed(work)(x), scheduler="sync")[0]


def on_cluster(handle: otel_graph.Instrumentation, *, processes: bool) -> tuple[int, bool]:
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=processes, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        futures = client.map(work, range(20), key=[f"work-{i}" for i in range(20)], pure=False)
        futures.append(client.submit(awork, 100, key="awork-0", pure=False))
        return sum(client.gather(futures)), handle.flush(timeout_s=30)  # the workers' spans too


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scheduler", default="sync")
    args = parser.parse_args()
    handle = otel_graph.instrument_scheduler()
    with tracer.start_as_current_span("user.outside"):  # not in any task
        pass
    if args.scheduler.startswith("distributed"):
        result, flushed = on_cluster(handle, processes=args.scheduler == "distributed")
    else:
        tasks = [delayed(work)(i) for i in range(20)] + [delayed(nested)(100)]
        result = sum(dask.compute(*tasks, scheduler=args.scheduler))
        flushed = handle.flush(timeout_s=30)
    print("RESULT", result, flush=True)
    print("FLUSHED", flushed, flush=True)


if __name__ == "__main__":
    main()
