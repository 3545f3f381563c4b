"""A user's script, run as a subprocess by the tests: instrument, compute, exit.

Configured the user's way, through OTEL_* variables, plus these arguments:
``--scheduler``, ``--tasks``, ``--fail`` (one task raises), ``--wait-stdin`` (compute,
print COMPUTED, then wait for a line on stdin before flushing), ``--no-instrument``
(for opentelemetry-instrument runs). It prints RESULT and LAST_COMPUTE_END (a
time.monotonic() reading) so the parent can check correctness and exit latency.
"""

from __future__ import annotations

import argparse
import sys
import time

import dask
import dask.multiprocessing
import dask.threaded


def inc(x: int) -> int:
    return x + 1


def boom(x: int) -> int:
    raise RuntimeError(f"task failed on purpose at {x}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scheduler", default="sync")
    parser.add_argument("--tasks", type=int, default=20)
    parser.add_argument("--fail", action="store_true")
    parser.add_argument("--wait-stdin", action="store_true")
    parser.add_argument("--no-instrument", action="store_true")
    parser.add_argument("--flush", action="store_true")
    args = parser.parse_args()

    handle = None
    if not args.no_instrument:
        import otel_graph

        handle = otel_graph.instrument_scheduler()
    graph = {("inc", i): (inc, i) for i in range(args.tasks)}
    if args.fail:
        graph[("boom", 0)] = (boom, ("inc", 0))
    try:
        get = {"sync": dask.get, "threads": dask.threaded.get, "processes": dask.multiprocessing.get}
        values = get[args.scheduler](graph, list(graph))
        print("RESULT", sum(values), flush=True)
    except RuntimeError as exc:
        print("FAILED", exc, flush=True)
    print("LAST_COMPUTE_END", time.monotonic(), flush=True)
    if args.wait_stdin:
        print("COMPUTED", flush=True)
        sys.stdin.readline()
    if args.flush and handle is not None:
        print("FLUSHED", handle.flush(timeout_s=30), handle.stats(), flush=True)


if __name__ == "__main__":
    main()
