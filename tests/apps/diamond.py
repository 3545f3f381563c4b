"""A diamond graph whose critical path is known: load -> slow (0.3 s) -> join, beside load -> fast (0.05 s).

Run by the tests through ``otel-graph run`` (so it never calls otel_graph itself).
``--scheduler`` picks the local scheduler (default threads). Prints RESULT.
"""

from __future__ import annotations

import argparse
import time

import dask
import dask.threaded


def load() -> int:
    time.sleep(0.05)
    return 40


def slow(x: int) -> int:
    time.sleep(0.3)
    return x + 1


def fast(x: int) -> int:
    time.sleep(0.05)
    return x + 1


def join(a: int, b: int) -> int:
    time.sleep(0.1)
    return a + b - 40


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--scheduler", default="threads")
    args = parser.parse_args()
    graph = {"load": (load,), "slow": (slow, "load"), "fast": (fast, "load"), "join": (join, "slow", "fast")}
    print("RESULT", dask.get(graph, "join") if args.scheduler == "sync"
          else dask.threaded.get(graph, "join", num_workers=2), flush=True)
