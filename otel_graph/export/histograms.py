"""Pre-aggregated histograms, merged into the metric stream at export time.

``Histogram.record`` costs 6-18 µs in the SDK (attribute hashing, locks, views), more
than a no-op Dask task itself. For providers otel_graph built, task durations and
sizes are instead counted here into explicit buckets (a ``bisect`` and a few integer
additions per task) and turned into ordinary SDK ``Metric`` objects when the reader
collects, so exporters, the collector and Prometheus see the standard histogram data
they would have got from the SDK: same boundaries, sum, count, min and max, cumulative
or delta as the exporter prefers.

A push exporter that takes cumulative data is sent a series when it changed since the
last export it delivered, and otherwise once every :data:`RESEND_UNCHANGED_S`: exports
run every second, and re-encoding every series of a session of many task prefixes each
time cost a few percent of a core, idle or not. A cumulative point carries the whole
count whenever it is sent, and the collector serves a series' last value to Prometheus
in between (the stack keeps a series 15 minutes). After a failed export the next one
sends every series. A pull reader (Prometheus), and an exporter whose deliveries are
read back (a dask.distributed worker's), get every series every time.

An application's own MeterProvider never goes through here: there, the instruments
of :class:`otel_graph.telemetry.metrics.TaskMetrics` record through the API as usual.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
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


def _due(sent: dict, key: tuple, count: int, now: int, resend_before: int) -> bool:
    """Whether a series is sent now (noting it if so): it changed, or was last sent long ago."""
    last = sent.get(key)
    if last is not None and last[0] == count and last[1] > resend_before:
        return False
    sent[key] = (count, now)
    return True


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
        #: Per push consumer of cumulative data: each series' count when last sent, and when.
        self._sent: dict[Any, dict[tuple[str, tuple], tuple[int, int]]] = {}

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

    def metrics(self, temporality: AggregationTemporality, *, consumer: Any = None,
                skip_unchanged: bool = False) -> list[Metric]:
        """Our histograms' points for ``consumer`` (an exporter; None for a pull reader), leaving
        out, if ``skip_unchanged`` and cumulative, series it was sent unchanged lately (see above)."""
        now = time.time_ns()
        delta = temporality == AggregationTemporality.DELTA
        skip = skip_unchanged and not delta
        resend_before = now - int(RESEND_UNCHANGED_S * 1e9)
        out = []
        with self._lock:
            for fold in self._folds:
                fold()
            last = self._last_ns.get(consumer, self._start_ns)
            exported = self._exported.setdefault(consumer, {})
            sent = self._sent.setdefault(consumer, {}) if skip else None
            for histogram in self._histograms:
                series_now: Iterable[tuple[tuple[tuple[str, str], ...], _Series]] = histogram.series.items()
                if sent is not None:
                    series_now = [(attrs, series) for attrs, series in series_now
                                  if _due(sent, (histogram.name, attrs), series.count, now, resend_before)]
                made = (self._point(histogram.name, attrs, series, histogram.bounds, now, delta, last, exported)
                        for attrs, series in series_now)
                points = [p for p in made if p is not None]
                if points:
                    out.append(Metric(name=histogram.name, description=histogram.description,
                                      unit=histogram.unit,
                                      data=Histogram(data_points=points, aggregation_temporality=temporality)))
            self._last_ns[consumer] = now
        return out

    def _point(self, name: str, attrs: tuple, series: _Series, bounds: Sequence[float], now: int,
               delta: bool, last: int, exported: dict) -> HistogramDataPoint | None:
        start = self._start_ns
        count, total, buckets = series.count, series.total, list(series.buckets)
        if delta:
            # Delta from what the previous collection reported; min/max stay cumulative
            # since per-interval extremes are not kept.
            previous = exported.get((name, attrs))
            exported[(name, attrs)] = (count, total, buckets)
            if previous is not None:
                count -= previous[0]
                total -= previous[1]
                buckets = [a - b for a, b in zip(buckets, previous[2], strict=False)]
            if count == 0:
                return None
            start = last
        return HistogramDataPoint(attributes=dict(attrs), start_time_unix_nano=start, time_unix_nano=now,
                                  count=count, sum=total, bucket_counts=buckets, explicit_bounds=list(bounds),
                                  min=series.low, max=series.high)

    def unsent(self, consumer: Any) -> None:
        """``consumer``'s export failed: what it was given counts as not sent (all is sent next)."""
        with self._lock:
            self._sent.pop(consumer, None)

    def merge_into(self, data: MetricsData, temporality: AggregationTemporality, *,
                   consumer: Any = None, skip_unchanged: bool = False) -> MetricsData:
        """``data`` with our histograms added under our scope, in its first resource (as
        ``consumer``, the exporter, last had them, for deltas; see :meth:`metrics`)."""
        extra = self.metrics(temporality, consumer=consumer, skip_unchanged=skip_unchanged)
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
