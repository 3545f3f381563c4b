"""A long job, shortened: tasks sleep, and the last one waits for a line on stdin.

The parent test looks at what the collector has while this compute is still running,
then releases it. Configured through OTEL_* variables; ``--scheduler`` and ``--tasks``.
Prints RUNNING once the compute has started and RESULT when it returns.
"""

from __future__ import annotations

import argparse
import sys
import time

import dask


def nap(i: int) -> int:
    time.sleep(0.02)
    return i


def gate(*parts: int) -> int:
    print("RUNNING", flush=True)
    sys.stdin.readline()  # the parent has seen what it wanted of the running job
    return sum(parts)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scheduler", default="sync")
    parser.add_argument("--tasks", type=int, default=20)
    args = parser.parse_args()

    import otel_graph

    otel_graph.instrument_scheduler()
    graph = {("nap", i): (nap, i) for i in range(args.tasks)}
    graph["gate"] = (gate, *[("nap", i) for i in range(args.tasks)])
    print("RESULT", dask.get(graph, "gate") if args.scheduler == "sync"
          else dask.threaded.get(graph, "gate"), flush=True)


if __name__ == "__main__":
    main()
