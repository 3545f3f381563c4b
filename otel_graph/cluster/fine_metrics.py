"""distributed's fine performance metrics, as OpenTelemetry counters.

Workers time what each task's execution spends its seconds on (thread CPU, thread
non-CPU, the executor, disk, compression, serialisation...), and what sending and
fetching data costs, and send the totals to the scheduler with every heartbeat. The
dashboard's *Fine Performance Metrics* page shows them by span and task prefix; here they
are monotonic counters, read from the scheduler when a metric reader collects (nothing
runs per task or per heartbeat):

=========================  ===========  =================================================
``dask.activity.time``     ``s``        time spent, by activity
``dask.activity.size``     ``By``       bytes handled (disk, compression, transfers)
``dask.activity.count``    ``{event}``  events counted
=========================  ===========  =================================================

Attributes: ``dask.activity.context`` (``execute``: running tasks; ``gather-dep``:
fetching a task's inputs from other workers; ``get-data``: sending data to them;
``p2p``: shuffles; ``memory-monitor``: spilling by the memory monitor),
``dask.activity`` (``thread-cpu``, ``thread-noncpu``, ``executor``, ``disk-read``,
``serialize``, ``network``...), ``dask.task.prefix`` (``execute``), ``dask.activity.phase``
(the other contexts' sub-part, where they have one), ``dask.span.name`` (``execute`` and
``p2p``: the distributed span, tags joined by ``/``; ``default`` outside any) and
``dask.scheduler.address``. The dashboard's "idle or other spans" slice is not a counter
(it is derived from thread-seconds available) and is not exported; metrics of a unit
other than seconds, bytes and count (a user's own, through ``context_meter``) neither.

Series are bounded: past :data:`MAX_PREFIXES` task prefixes per scheduler, a new one is
counted under ``(other prefixes)``, so every second stays counted; past the SDK's own
limit on attribute sets per instrument (2,000 by default: many distributed spans, say),
the SDK counts the rest in one series marked ``otel.metric.overflow``.

They are read (:func:`.adapter.fine_metric_readings`) from the exporter's thread; a change
in distributed's internals costs these counters (logged once), never the scheduler.
"""

from __future__ import annotations

import logging
import weakref
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from opentelemetry.metrics import Observation

from otel_graph import conventions
from otel_graph.cluster import adapter
from otel_graph.naming import OTHER_PREFIXES

logger = logging.getLogger("otel_graph")

#: Task prefixes each instrument keeps apart per scheduler (times activities, about eight).
MAX_PREFIXES = 200
#: unit in distributed's key -> instrument.
_INSTRUMENTS = {"seconds": "dask.activity.time", "bytes": "dask.activity.size", "count": "dask.activity.count"}
Key = tuple[str, ...]  # (span name, context, prefix or phase, activity)


class _Admitted:
    """The task prefixes a scheduler's series are kept for, first come first kept."""

    def __init__(self) -> None:
        self.prefixes: set[str] = set()


_ADMITTED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def collect(scheduler: Any) -> dict[str, dict[Key, float]]:
    """unit -> {(span name, context, prefix or phase, activity): total} for one scheduler."""
    admitted = _ADMITTED.get(scheduler)
    if admitted is None:
        admitted = _ADMITTED[scheduler] = _Admitted()
    totals: dict[str, dict[Key, float]] = {unit: defaultdict(float) for unit in _INSTRUMENTS}
    for span, unit, key, value in adapter.fine_metric_readings(scheduler):
        if unit not in totals:
            continue
        context, activity, middle = str(key[0]), str(key[-1]), "/".join(str(part) for part in key[1:-1])
        if context == "execute" and middle not in admitted.prefixes:
            if len(admitted.prefixes) < MAX_PREFIXES:
                admitted.prefixes.add(middle)
            else:
                middle = OTHER_PREFIXES
        totals[unit][(span, context, middle, activity)] += value
    return totals


def _attributes(key: Key, address: str) -> dict[str, str]:
    span, context, middle, activity = key
    attributes = {"dask.activity.context": context, "dask.activity": activity, "dask.scheduler.address": address}
    if context == "execute":
        attributes["dask.task.prefix"] = middle
    elif middle:
        attributes["dask.activity.phase"] = middle
    if span:
        attributes["dask.span.name"] = span
    return attributes


def observe(meter: Any, schedulers: Callable[[], list[Any]]) -> None:
    """Create the three counters on ``meter``; they report every scheduler ``schedulers()`` gives."""
    cache: dict[str, list[Observation]] = {}
    failed: list[bool] = []

    def read(unit: str) -> list[Observation]:
        # One reading of the schedulers serves the three instruments of a collection: the
        # first asks for it, the others take theirs from it.
        if unit == "seconds" or not cache:
            cache.clear()
            for scheduler in schedulers():
                try:
                    address = str(scheduler.address)
                    for each, totals in collect(scheduler).items():
                        cache.setdefault(each, []).extend(
                            Observation(value, _attributes(key, address)) for key, value in totals.items())
                except Exception as exc:  # read from the exporter's thread while the loop mutates
                    if not failed:
                        failed.append(True)
                        logger.warning("otel_graph: distributed's fine performance metrics are unreadable: %s", exc)
        return cache.get(unit, [])

    for unit, name in _INSTRUMENTS.items():
        conventions.observe(meter, name, [lambda options, unit=unit: read(unit)])
