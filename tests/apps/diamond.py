"""A diamond graph whose critical path is known: load -> slow (0.3 s) -> join, beside load -> fast (0.05 s).

Run by the tests through ``otel-graph run`` (so it never calls otel_graph itself).
``--scheduler`` picks the local scheduler (default threads). Prints RESULT.
``--swap`` makes fast the slow one (0.4 s) and slow fast (0.05 s): the same graph, another
critical path. ``--again`` then computes it a second time, swapped.
"""

from __future__ import annotations

import argparse
import time

import dask
import dask.threaded

SLOW_S, FAST_S = 0.3, 0.05


def load() -> int:
    time.sleep(0.05)
    return 40


def slow(x: int) -> int:
    time.sleep(SLOW_S)
    return x + 1


def fast(x: int) -> int:
    time.sleep(FAST_S)
    return x + 1


def join(a: int, b: int) -> int:
    time.sleep(0.1)
    return a + b - 40


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--scheduler", default="threads")
    parser.add_argument("--swap", action="store_true")
    parser.add_argument("--again", action="store_true")
    args = parser.parse_args()
    graph = {"load": (load,), "slow": (slow, "load"), "fast": (fast, "load"), "join": (join, "slow", "fast")}
    for swap in (args.swap, True) if args.again else (args.swap,):
        if swap:
            SLOW_S, FAST_S = 0.05, 0.4
        print("RESULT", dask.get(graph, "join") if args.scheduler == "sync"
              else dask.threaded.get(graph, "join", num_workers=2), flush=True)
