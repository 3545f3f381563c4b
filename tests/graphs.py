"""Tiny task graphs and task functions the tests share (importable by worker processes)."""

from __future__ import annotations

import time


def inc(x: int) -> int:
    return x + 1


def add(x: int, y: int) -> int:
    return x + y


def boom(x: object) -> object:
    raise ValueError(f"boom on {x!r}")


def timed_sleep(seconds: float) -> tuple[int, int]:
    """Sleep and return the (start, end) the task itself saw, in epoch ns."""
    start = time.time_ns()
    time.sleep(seconds)
    return start, time.time_ns()


def noop() -> None:
    return None


#: The three-key graph of dask.diagnostics' docstrings.
DSK = {"x": 1, "y": (inc, "x"), "z": (add, "y", 10)}


def loaded_modules(prefix: str) -> list[str]:
    """The modules under ``prefix`` loaded in the process running this task."""
    import sys

    return sorted(name for name in sys.modules if name == prefix or name.startswith(prefix + "."))
