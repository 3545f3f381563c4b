"""A process whose wall clock is off: put this directory first on ``PYTHONPATH`` and set
``SKEWED_CLOCK_S`` (seconds, may be negative) in its environment.

``time.time`` and ``time.time_ns`` are shifted before anything imports them; the
monotonic clocks, and so ``time.sleep``, timeouts and asyncio, are not (libfaketime's
shifts break ``time.sleep``). A task can make the clock jump mid-run with
``import sitecustomize; sitecustomize.jump(1.0)``.
"""

import os
import time

_SHIFT = [float(os.environ.get("SKEWED_CLOCK_S", "0") or 0)]
_time, _time_ns = time.time, time.time_ns


def _skewed_time() -> float:
    return _time() + _SHIFT[0]


def _skewed_time_ns() -> int:
    return _time_ns() + int(_SHIFT[0] * 1e9)


def jump(seconds: float) -> float:
    """Step this process's clock by ``seconds``; returns the new shift."""
    _SHIFT[0] += seconds
    return _SHIFT[0]


time.time, time.time_ns = _skewed_time, _skewed_time_ns
