"""Pre-aggregated histograms, merged into the metric stream at export time.

``Histogram.record`` costs 6-18 µs in the SDK (attribute hashing, locks, views), more
than a no-op Dask task itself. For providers otel_graph built, task durations and
sizes are instead counted here into explicit buckets (a ``bisect`` and a few integer
additions per task) and turned into ordinary SDK ``Metric`` objects when the reader
collects, so exporters, the collector and Prometheus see the standard histogram data
they would have got from the SDK: same boundaries, sum, count, min and max, cumulative
or delta as the exporter prefers.

A push exporter that takes cumulative data is sent a series when it changed since the
exporter's last collection, and otherwise once every :data:`RESEND_UNCHANGED_S`: exports
run every second, and a session of many task prefixes re-encoded thousands of unchanged
series each time (Dask's own test suite: 7% of a core, and the garbage those exports
made set off more full collections). A cumulative series read later still has its whole
count, and the collector serves its last value to Prometheus in between (the stack keeps
a series 15 minutes). A pull reader (Prometheus) gets every series every time.

An application's own MeterProvider never goes through here: there, the instruments
of :class:`otel_graph.metrics.TaskMetrics` record through the API as usual.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricsData,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.util.instrumentation import InstrumentationScope


@dataclass
class _Series:
    buckets: list[int]
    count: int = 0
    total: float = 0.0
    low: float = float("inf")
    high: float = float("-inf")


@dataclass
class PreAggregatedHistogram:
    """One histogram instrument: name, unit, bucket boundaries, and a series per attribute set."""

    name: str
    unit: str
    description: str
    bounds: Sequence[float]
    series: dict[tuple[tuple[str, str], ...], _Series] = field(default_factory=dict)

    def record(self, attributes: tuple[tuple[str, str], ...], values: Sequence[float]) -> None:
        """Add values; ``attributes`` is a hashable tuple of pairs, built once by the caller."""
        if not values:
            return
        series = self.series.get(attributes)
        if series is None:
            series = self.series[attributes] = _Series([0] * (len(self.bounds) + 1))
        buckets, bounds = series.buckets, self.bounds
        for value in values:
            buckets[bisect_left(bounds, value)] += 1
        series.count += len(values)
        series.total += sum(values)
        series.low = min(series.low, min(values))
        series.high = max(series.high, max(values))


#: How often a push exporter is sent a cumulative series that did not change (see above).
RESEND_UNCHANGED_S = 60.0


class HistogramSet:
    """The pre-aggregated histograms of one process, and their export-time form."""

    def __init__(self, scope: InstrumentationScope) -> None:
        self._scope = scope
        self._lock = threading.Lock()
        self._histograms: list[PreAggregatedHistogram] = []
        self._folds: list[Callable[[], None]] = []
        self._start_ns = time.time_ns()
        #: Per consumer (each exporter exports on its own: deltas are from its own last export):
        #: when it last collected, and what it was given then.
        self._last_ns: dict[Any, int] = {}
        self._exported: dict[Any, dict[tuple[str, tuple], tuple[int, float, list[int]]]] = {}

    @property
    def lock(self) -> threading.Lock:
        """Held by the recording thread for a whole batch, and by collection."""
        return self._lock

    def folds(self, fold: Callable[[], None]) -> None:
        """Call ``fold`` under the lock before each collection: it adds what its recorder kept back."""
        self._folds.append(fold)

    def add(self, histogram: PreAggregatedHistogram) -> PreAggregatedHistogram:
        self._histograms.append(histogram)
        return histogram

    def metrics(self, temporality: AggregationTemporality, *, consumer: Any = None) -> list[Metric]:
        """Our histograms' points for ``consumer``: an exporter (push), or None for a pull reader."""
        now = time.time_ns()
        delta = temporality == AggregationTemporality.DELTA
        # Unchanged series are resent after this (push, cumulative); a pull reader gets them all.
        resend_before = now - int(RESEND_UNCHANGED_S * 1e9) if consumer is not None and not delta else None
        out = []
        with self._lock:
            for fold in self._folds:
                fold()
            last = self._last_ns.get(consumer, self._start_ns)
            exported = self._exported.setdefault(consumer, {})
            for histogram in self._histograms:
                points = [self._point(histogram.name, attrs, series, histogram.bounds, now, delta, last, exported,
                                      resend_before) for attrs, series in histogram.series.items()]
                points = [p for p in points if p is not None]
                if points:
                    out.append(Metric(name=histogram.name, description=histogram.description,
                                      unit=histogram.unit,
                                      data=Histogram(data_points=points, aggregation_temporality=temporality)))
            self._last_ns[consumer] = now
        return out

    def _point(self, name: str, attrs: tuple, series: _Series, bounds: Sequence[float], now: int,
               delta: bool, last: int, exported: dict, resend_before: int | None) -> HistogramDataPoint | None:
        start = self._start_ns
        if resend_before is not None:
            sent = exported.get((name, attrs))
            if sent is not None and sent[0] == series.count and sent[1] > resend_before:
                return None
            exported[(name, attrs)] = (series.count, now)
        count, total, buckets = series.count, series.total, list(series.buckets)
        if delta:
            # Delta from what the previous collection reported; min/max stay cumulative
            # since per-interval extremes are not kept.
            previous = exported.get((name, attrs))
            exported[(name, attrs)] = (count, total, buckets)
            if previous is not None:
                count -= previous[0]
                total -= previous[1]
                buckets = [a - b for a, b in zip(buckets, previous[2])]
            if count == 0:
                return None
            start = last
        return HistogramDataPoint(attributes=dict(attrs), start_time_unix_nano=start, time_unix_nano=now,
                                  count=count, sum=total, bucket_counts=buckets, explicit_bounds=list(bounds),
                                  min=series.low, max=series.high)

    def merge_into(self, data: MetricsData, temporality: AggregationTemporality, *,
                   consumer: Any = None) -> MetricsData:
        """``data`` with our histograms added under our scope, in its first resource (as
        ``consumer``, the exporter, last had them, for deltas)."""
        extra = self.metrics(temporality, consumer=consumer)
        if not extra or not data.resource_metrics:
            return data
        first, *rest = data.resource_metrics
        scopes = list(first.scope_metrics)
        for index, scope_metrics in enumerate(scopes):
            if scope_metrics.scope.name == self._scope.name:
                scopes[index] = ScopeMetrics(scope=scope_metrics.scope,
                                             metrics=[*scope_metrics.metrics, *extra],
                                             schema_url=scope_metrics.schema_url)
                break
        else:
            scopes.append(ScopeMetrics(scope=self._scope, metrics=extra, schema_url=""))
        merged = ResourceMetrics(resource=first.resource, scope_metrics=scopes, schema_url=first.schema_url)
        return MetricsData(resource_metrics=[merged, *rest])
