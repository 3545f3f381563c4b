"""The scheduler's gauges: read only when a metric reader collects, from what the scheduler keeps.

Each is O(prefixes + workers), never O(tasks), read on the exporter's thread while the
scheduler's event loop goes on (a reading that races a change is skipped, not retried):

===========================  ==========  ============================================
``dask.scheduler.tasks``     ``{task}``  ``dask.task.state``, ``dask.scheduler.address``
``dask.scheduler.workers``   ``{worker}`` ``dask.scheduler.address``
``dask.worker.memory.usage`` ``By``      ``dask.worker.id``, ``dask.worker.name``,
                                         ``dask.memory.state``: managed, unmanaged,
                                         spilled
``dask.worker.memory.limit`` ``By``      ``dask.worker.id``, ``dask.worker.name``
===========================  ==========  ============================================

and distributed's fine performance metrics as counters (:mod:`.fine_metrics`). One set
of gauges per meter provider reports every scheduler of the process that has our
plugin on it (:data:`SCHEDULERS`: the plugin puts itself there as it starts).
"""

from __future__ import annotations

import weakref
from typing import Any

from opentelemetry.metrics import CallbackOptions, Observation

from otel_graph.cluster import adapter, fine_metrics
from otel_graph.conventions import observe

PLUGIN_NAME = "otel-graph"

#: scheduler -> our plugin on it.
SCHEDULERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_GAUGED: weakref.WeakSet = weakref.WeakSet()  # meter providers that already have the gauges


def _each_scheduler() -> list[Any]:
    # distributed's unregister does not call close(): a scheduler counts while our plugin is on it.
    return [s for s, plugin in list(SCHEDULERS.items()) if s.plugins.get(PLUGIN_NAME) is plugin]


def _tasks(options: CallbackOptions) -> list[Observation]:
    points = []
    for scheduler in _each_scheduler():
        try:
            address = str(scheduler.address)
            for state, count in adapter.task_states(scheduler).items():
                points.append(Observation(count, {"dask.task.state": state, "dask.scheduler.address": address}))
        except Exception:  # read from the exporter's thread while the loop mutates: skip this one
            continue
    return points


def _workers(options: CallbackOptions) -> list[Observation]:
    return [Observation(adapter.worker_count(s), {"dask.scheduler.address": str(s.address)})
            for s in _each_scheduler()]


def _memory(options: CallbackOptions) -> list[Observation]:
    points = []
    for scheduler in _each_scheduler():
        try:
            for memory in adapter.worker_memory(scheduler):
                base = {"dask.worker.id": memory.address, "dask.worker.name": memory.name}
                for state in ("managed", "unmanaged", "spilled"):
                    points.append(Observation(getattr(memory, state), {**base, "dask.memory.state": state}))
        except Exception:
            continue
    return points


def _limits(options: CallbackOptions) -> list[Observation]:
    points = []
    for scheduler in _each_scheduler():
        try:
            for memory in adapter.worker_memory(scheduler):
                if memory.limit:
                    points.append(Observation(memory.limit, {"dask.worker.id": memory.address,
                                                             "dask.worker.name": memory.name}))
        except Exception:
            continue
    return points


def observe_scheduler(meter_provider: Any, meter: Any) -> None:
    """Create the gauges once per meter provider; they report every live scheduler in the process."""
    if meter_provider in _GAUGED:
        return
    _GAUGED.add(meter_provider)
    observe(meter, "dask.scheduler.tasks", [_tasks])
    observe(meter, "dask.scheduler.workers", [_workers])
    observe(meter, "dask.worker.memory.usage", [_memory])
    observe(meter, "dask.worker.memory.limit", [_limits])
    fine_metrics.observe(meter, _each_scheduler)
