"""Counting metric points delivered and not: a metric exporter wrapped, nothing lost silently.

The SDK's periodic reader hands each collection to its exporter and forgets it: a failed
export is logged by the exporter, and the points are gone. :class:`CountingMetricExporter`
wraps the exporter the reader is given and counts the data points of each export as
delivered or undelivered, and, at exit, those still in flight when the process stopped
waiting (:meth:`~CountingMetricExporter.give_up`). With the span processor's counts
(:mod:`otel_graph.export.pipeline`) these feed :func:`otel_graph.telemetry.metrics.observe_delivery`
and the one warning printed when anything was not delivered.

It also carries what the reader cannot: pre-aggregated histograms merged into each export
(:mod:`otel_graph.export.histograms`), a last try at exit with the exporter's retry waits cut
short (:meth:`~CountingMetricExporter.hurry`), and, for a dask.distributed worker, a reader of
each delivered export (:attr:`~CountingMetricExporter.on_delivered`). Everything else is
delegated: the wrapped exporter's temporality and aggregation preferences stay in force.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from opentelemetry.sdk.metrics import Histogram as HistogramInstrument
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    MetricExporter,
    MetricExportResult,
    MetricsData,
)

from otel_graph.export.forks import forked_child_drops, stands_down
from otel_graph.export.histograms import HistogramSet
from otel_graph.export.pipeline import STUCK_AFTER_S

logger = logging.getLogger("otel_graph")


class CountingMetricExporter(MetricExporter):
    """Counts data points exported and not delivered; delegates everything else."""

    def __init__(self, inner: MetricExporter, *, histograms: HistogramSet | None = None) -> None:
        from otel_graph.export.sdk_internals import preferences

        temporality, aggregation = preferences(inner)
        super().__init__(preferred_temporality=temporality, preferred_aggregation=aggregation)
        # None from an exporter that states no preference (the SDK's console one): cumulative.
        self._histogram_temporality = (temporality or {}).get(HistogramInstrument, AggregationTemporality.CUMULATIVE)
        self._inner = inner
        self._histograms = histograms
        self.exported = 0
        self.undelivered = 0
        self.inflight = 0
        self._try_began = 0.0
        self._lock = threading.Lock()
        self._given_up = False
        self._hurried = False
        #: Called with each export the collector took (a distributed worker reports its task
        #: counts to the scheduler: :mod:`otel_graph.cluster.ledger`).
        self.on_delivered: Callable[[MetricsData], None] | None = None
        self._forked = False
        stands_down(self)

    def _after_fork_in_child(self) -> None:
        # The SDK restarts its reader in the child; the exporter it calls is the parent's.
        self._forked = True
        self._lock = threading.Lock()
        self.exported = self.undelivered = self.inflight = 0

    @property
    def stuck(self) -> bool:
        """A try of an export has been out for over a second (a hung collector holds it)."""
        return bool(self.inflight) and time.monotonic() - self._try_began > STUCK_AFTER_S

    def hurry(self) -> None:
        """At exit: no more sleeping between retries, and a failed export is tried once more at once.

        The exporter's first try after an outage fails on the connection it had, which
        it then replaces; without retry sleeps the final export would end on that
        failure, with the collector back and a fresh connection ready.
        """
        from otel_graph.export.sdk_internals import stop_retry_waits

        stop_retry_waits(self._inner)
        self._hurried = True

    def give_up(self) -> None:
        """At exit: count an export still in flight as undelivered, now, and no export after.

        The SDK reader's shutdown stops waiting for its export thread after its timeout
        and returns; the export may still fail later, after the warning was printed, or
        never end before the process does. Its points must be in the warning.
        """
        with self._lock:
            if not self._given_up:
                self._given_up = True
                self.undelivered += self.inflight
                self.inflight = 0

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
               ) -> MetricExportResult:
        if self._histograms is not None:
            # A reader of deliveries (a worker's ledger) adds up each export's points: it gets them all.
            metrics_data = self._histograms.merge_into(metrics_data, self._histogram_temporality, consumer=self,
                                                       skip_unchanged=self.on_delivered is None)
        points = _count_points(metrics_data)
        with self._lock:
            if self._forked:
                self.undelivered += points
                forked_child_drops("metrics")
                return MetricExportResult.FAILURE
            if self._given_up:
                # Past exit's deadline, after the warning: the reader's final collection,
                # held behind an export that hung. Not sent, and not counted: its series are
                # those of the export counted in flight (cumulative, so the same totals and
                # later), and a count after the warning would leave the warning short of it.
                return MetricExportResult.FAILURE
            self.inflight = points
        result = self._export(metrics_data, timeout_millis, **kwargs)
        if result != MetricExportResult.SUCCESS and self._hurried:
            result = self._export(metrics_data, timeout_millis, **kwargs)
        if result != MetricExportResult.SUCCESS and self._histograms is not None:
            self._histograms.unsent(self)
        with self._lock:
            if self._given_up:  # counted by give_up() already, whatever became of it
                return result
            self.inflight = 0
            if result == MetricExportResult.SUCCESS:
                self.exported += points
            else:
                self.undelivered += points
        if result == MetricExportResult.SUCCESS and self.on_delivered is not None:
            try:
                self.on_delivered(metrics_data)
            except Exception:
                logger.debug("otel_graph: counting delivered points failed", exc_info=True)
        return result

    def _export(self, metrics_data: MetricsData, timeout_millis: float, **kwargs: Any) -> MetricExportResult:
        self._try_began = time.monotonic()
        try:
            return self._inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)
        except Exception:
            logger.debug("otel_graph: metric exporter raised", exc_info=True)
            return MetricExportResult.FAILURE

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self._inner.force_flush(timeout_millis=timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._inner.shutdown(timeout_millis=timeout_millis, **kwargs)


def _count_points(metrics_data: MetricsData) -> int:
    return sum(len(metric.data.data_points)
               for resource in metrics_data.resource_metrics
               for scope in resource.scope_metrics
               for metric in scope.metrics)
