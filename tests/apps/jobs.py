"""A user's job, run by the tests: the same graph shape on the data a seed gives, named or not.

``--scheduler`` sync, threads, processes or cluster (a LocalCluster of two worker
processes); ``--seed`` the data; ``--name`` runs it inside ``otel_graph.name(NAME)``,
``--span`` inside a span of that name, neither: named after :func:`nightly_etl`, the
function that calls compute. ``--fail`` makes one task raise (caught). Prints FLUSHED
with the flush's result.
"""

from __future__ import annotations

import argparse
import contextlib

import dask
import dask.array as da
from opentelemetry import trace

import otel_graph


def check(total: float) -> float:
    raise ValueError(f"bad total {total}")


def nightly_etl(seed: int, scheduler: str, *, fail: bool) -> float:
    x = da.random.RandomState(seed).random((400, 400), chunks=(100, 100))
    total = (x + x.T).sum()
    if fail:
        total = dask.delayed(check)(total)
    if scheduler == "cluster":
        return dask.compute(total)[0]
    return dask.compute(total, scheduler=scheduler)[0]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scheduler", default="sync")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--name")
    parser.add_argument("--span")
    parser.add_argument("--fail", action="store_true")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        if args.scheduler == "cluster":
            from distributed import Client, LocalCluster

            cluster = stack.enter_context(LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                                       dashboard_address=":0"))
            stack.enter_context(Client(cluster))
        handle = otel_graph.instrument_scheduler(resources=False)
        named = otel_graph.name(args.name) if args.name else contextlib.nullcontext()
        span = trace.get_tracer("jobs").start_as_current_span(args.span) if args.span else contextlib.nullcontext()
        with named, span:
            try:
                print("RESULT", nightly_etl(args.seed, args.scheduler, fail=args.fail), flush=True)
            except ValueError as exc:
                print("FAILED", exc, flush=True)
        print("FLUSHED", handle.flush(timeout_s=60), flush=True)
        handle.uninstrument()


if __name__ == "__main__":
    main()
