"""What a worker process's exporters delivered: the worker's side of the scheduler's ledger.

The scheduler's :mod:`.ledger` counts what ran on each worker; each worker tells it what
its exporters delivered, so that what is left when a worker is lost is what it took with
it. This module does the counting in the worker process, one counter per signal:

* :class:`Deliveries`: spans, per worker, compute (its traceparent) and prefix. Each
  report carries what was delivered since the last one (:meth:`Deliveries.take` empties
  the worker's rows).
* :class:`MetricDeliveries`: the ``dask.task.duration`` counts, per prefix and outcome.
  Task metrics are cumulative by nature, so each report carries every label's totals
  (:meth:`MetricDeliveries.take`), and the scheduler compares them with what finished.

Both are fed on the exporter's thread as soon as the collector took a batch, and read on
each worker's event loop: a lock guards what they share, held only to merge a batch's
counts, summed beforehand, or to take them.

Rows are what the ledger reads (:func:`.ledger._rows`): a text and a text or flag, a count
and nanoseconds, then for spans whether they failed.
"""

from __future__ import annotations

import threading
from typing import Any

from opentelemetry.trace import StatusCode

from otel_graph.naming import OTHER_PREFIXES

#: key -> [count, summed duration ns]
_Counts = dict[Any, list[int]]


def _add(counts: _Counts, key: Any, count: int, duration_ns: int) -> None:
    row = counts.get(key)
    if row is None:
        row = counts[key] = [0, 0]
    row[0] += count
    row[1] += duration_ns


class Deliveries:
    """In a worker process: what its span exporter delivered, per worker, compute and prefix.

    Fed from the exporter's thread (:meth:`count`, with each batch the collector took);
    each worker takes its own rows (:meth:`take`) to report them. A task span counts one
    task (a failed one apart: its status is ERROR), an aggregate its ``dask.task.count``;
    other spans (transfer and spill phases, computes, recovered tasks) none.

    >>> from types import SimpleNamespace as NS
    >>> parent = NS(trace_id=0xAB, span_id=0xCD, trace_flags=1)
    >>> on_w1 = {"dask.task.prefix": "inc", "dask.worker.id": "w1"}
    >>> task = NS(parent=parent, start_time=0, end_time=5, attributes=on_w1)
    >>> folded = NS(parent=parent, start_time=0, end_time=9, attributes={
    ...     **on_w1, "dask.task.count": 4, "dask.task.duration.sum": 2.0})
    >>> deliveries = Deliveries()
    >>> deliveries.count([task, folded])
    >>> deliveries.take("w2"), deliveries.take("w1") == [
    ...     [f"00-{0xAB:032x}-{0xCD:016x}-01", "inc", 5, 2_000_000_005, False]]
    ([], True)
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, _Counts] = {}

    def count(self, spans: Any) -> None:
        counted: _Counts = {}
        for span in spans:
            attributes = span.attributes or {}
            prefix = attributes.get("dask.task.prefix")
            worker = attributes.get("dask.worker.id")
            parent = span.parent
            if prefix is None or worker is None or parent is None or "dask.task.recovered" in attributes:
                continue
            tasks = attributes.get("dask.task.count", 1)
            if "dask.task.duration.sum" in attributes:
                duration_ns = int(attributes["dask.task.duration.sum"] * 1e9)
            else:
                duration_ns = (span.end_time or 0) - (span.start_time or 0)
            traceparent = f"00-{parent.trace_id:032x}-{parent.span_id:016x}-{int(parent.trace_flags):02x}"
            status = getattr(span, "status", None)
            key = (worker, traceparent, prefix, getattr(status, "status_code", None) is StatusCode.ERROR)
            row = counted.get(key)  # inline, not _add: a call per span on the export thread
            if row is None:
                row = counted[key] = [0, 0]
            row[0] += tasks
            row[1] += duration_ns
        if not counted:
            return
        with self._lock:
            for (worker, traceparent, prefix, failed), (tasks, duration_ns) in counted.items():
                _add(self._counts.setdefault(worker, {}), (traceparent, prefix, failed), tasks, duration_ns)

    def take(self, worker: str) -> list[list[Any]]:
        """``[traceparent, prefix, tasks, duration_ns, failed]`` rows delivered since the last take."""
        with self._lock:
            counts = self._counts.pop(worker, {})
        return [[traceparent, prefix, tasks, duration_ns, failed]
                for (traceparent, prefix, failed), (tasks, duration_ns) in counts.items()]


class MetricDeliveries:
    """In a worker process: the cumulative ``dask.task.duration`` counts its metric exporter delivered.

    Fed with each delivered export (:meth:`count`), delta temporality summed up;
    :meth:`take` returns every label's totals when they changed since the last take.

    >>> from types import SimpleNamespace as NS
    >>> point = NS(attributes={"dask.task.prefix": "inc", "dask.task.outcome": "success"}, count=3, sum=0.25)
    >>> metric = NS(name="dask.task.duration", data=NS(aggregation_temporality=2, data_points=[point]))
    >>> data = NS(resource_metrics=[NS(scope_metrics=[NS(metrics=[metric])])])
    >>> deliveries = MetricDeliveries()
    >>> deliveries.count(data)
    >>> deliveries.take(), deliveries.take()
    ([['inc', False, 3, 250000000]], [])
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._totals: dict[tuple[str, bool], list[int]] = {}
        self._changed = False

    def count(self, metrics_data: Any) -> None:
        seen: _Counts = {}
        delta = False
        for resource in metrics_data.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name != "dask.task.duration":
                        continue
                    delta = int(getattr(metric.data, "aggregation_temporality", 2)) == 1  # DELTA
                    for point in metric.data.data_points:
                        attributes = point.attributes or {}
                        key = (str(attributes.get("dask.task.prefix", OTHER_PREFIXES)),
                               attributes.get("dask.task.outcome") == "error")
                        _add(seen, key, int(point.count), int(point.sum * 1e9))
        if not seen:
            return
        with self._lock:
            for key, (count, duration_ns) in seen.items():
                total = self._totals.setdefault(key, [0, 0])
                if delta:
                    total[0] += count
                    total[1] += duration_ns
                elif total != [count, duration_ns]:
                    total[0], total[1] = count, duration_ns
                else:
                    continue
                self._changed = True

    def totals(self) -> dict[tuple[str, bool], tuple[int, int]]:
        with self._lock:
            return {key: (count, duration_ns) for key, (count, duration_ns) in self._totals.items()}

    def take(self, *, since: dict[tuple[str, bool], tuple[int, int]] | None = None) -> list[list[Any]]:
        """Every label's totals if they changed, less ``since``: :meth:`totals` when a worker's
        telemetry began (the process's SDK counts from the process's start; a scheduler's
        ledger, from the telemetry's)."""
        base = since or {}
        with self._lock:
            if not self._changed:
                return []
            self._changed = False
            return [[label, failed, count - base.get((label, failed), (0, 0))[0],
                     duration_ns - base.get((label, failed), (0, 0))[1]]
                    for (label, failed), (count, duration_ns) in self._totals.items()]
