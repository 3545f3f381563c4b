"""A user's job, run by the tests: the same graph shape on the data a seed gives, named or not.

``--scheduler`` sync, threads, processes or cluster (a LocalCluster of two worker
processes); ``--seed`` the data; ``--name`` runs it inside ``otel_graph.name(NAME)``,
``--span`` inside a span of that name, neither: named after :func:`nightly_etl`, the
function that calls compute. ``--fail`` makes one task raise (caught); ``--size`` is the
array's side (default 400, in chunks of 100). Prints FLUSHED
with the flush's result.

``--serve``: a long-lived process running the job once per line on stdin, a JSON object
of :func:`nightly_etl`'s keywords (``seed``, ``fail``, ``size``, ``chunk``, ``task_ms``),
flushing after each run and printing RAN; it exits at the end of its input.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from typing import Any

import dask
import dask.array as da
from opentelemetry import trace

import otel_graph


def check(total: float) -> float:
    raise ValueError(f"bad total {total}")


def pause(block: Any, task_ms: float) -> Any:
    time.sleep(task_ms / 1000)
    return block


def nightly_etl(seed: int, scheduler: str, *, fail: bool = False, size: int = 400, chunk: int = 100,
                task_ms: float = 0) -> float:
    x = da.random.RandomState(seed).random((size, size), chunks=(chunk, chunk)).map_blocks(pause, task_ms)
    total = (x + x.T).sum()
    if fail:
        total = dask.delayed(check)(total)
    if scheduler == "cluster":
        return dask.compute(total)[0]
    return dask.compute(total, scheduler=scheduler)[0]


def serve(handle: Any, name: str, scheduler: str) -> None:
    for line in sys.stdin:
        with otel_graph.name(name):
            try:
                nightly_etl(scheduler=scheduler, **json.loads(line))
            except ValueError:
                pass
        print("RAN", handle.flush(timeout_s=60), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scheduler", default="sync")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--name")
    parser.add_argument("--span")
    parser.add_argument("--fail", action="store_true")
    parser.add_argument("--size", type=int, default=400)
    parser.add_argument("--serve", action="store_true")
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
        if args.serve:
            serve(handle, args.name, args.scheduler)
            return
        with named, span:
            try:
                print("RESULT", nightly_etl(args.seed, args.scheduler, fail=args.fail, size=args.size), flush=True)
            except ValueError as exc:
                print("FAILED", exc, flush=True)
        print("FLUSHED", handle.flush(timeout_s=60), flush=True)
        handle.uninstrument()


if __name__ == "__main__":
    main()
