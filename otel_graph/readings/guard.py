"""What every reading's callback shares: a switch that silences it, and failures counted, never raised.

OpenTelemetry cannot unregister an observable instrument, so a ``stop()`` is a
:class:`Switch` the callbacks read. A reading that fails (psutil, NVML) yields no point
for that collection and never raises into the SDK, which would log it at every
collection: :func:`guarded` counts it (:func:`reading_errors`) and logs the first failure
of each instrument at DEBUG, with its traceback.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

from opentelemetry.metrics import CallbackOptions, Observation

# The logger of otel_graph.readings.resources, where readings are made: one name for every reading's failures.
logger = logging.getLogger("otel_graph.resources")

Reading = Callable[[], Iterable[Observation]]
Callback = Callable[[CallbackOptions], Iterable[Observation]]


def reading_errors() -> int:
    """How many readings have failed in this process (each failure yields no point)."""
    return _ERRORS.count


class Switch:
    """The flag behind a ``stop()``: instruments cannot be unregistered, only silenced."""

    def __init__(self) -> None:
        self.on = True

    def stop(self) -> None:
        self.on = False


def guarded(name: str, read: Reading, switch: Switch) -> Callback:
    """Wrap ``read`` as an SDK callback that honours ``switch`` and never raises."""

    def callback(options: CallbackOptions) -> list[Observation]:
        if not switch.on:
            return []
        try:
            return list(read())
        except Exception:
            # The SDK would log an exception per collection; a reading we cannot take
            # is not worth that. Count it, say it once, report nothing this time.
            _ERRORS.record(name)
            return []

    return callback


class _ReadingErrors:
    """Counts failed readings and logs the first failure of each instrument."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._logged: set[str] = set()
        self.count = 0

    def record(self, name: str) -> None:
        with self._lock:  # only taken on failure, never on a successful reading
            self.count += 1
            first = name not in self._logged
            self._logged.add(name)
        if first:
            logger.debug("reading %s failed; further failures are only counted", name, exc_info=True)


_ERRORS = _ReadingErrors()
