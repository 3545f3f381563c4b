"""The pre-aggregated task histograms (otel_graph's own SDK) count every run and compute,
those recorded since the last fold included, whenever they are collected."""

from __future__ import annotations

from opentelemetry.metrics import NoOpMeter
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    ResourceMetrics,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_graph.export.histograms import HistogramSet
from otel_graph.export.metric_counting import CountingMetricExporter
from otel_graph.telemetry.events import TaskEvent, describe_exception
from otel_graph.telemetry.metrics import FOLD_AT, TaskMetrics


def _points(histograms: HistogramSet, temporality: AggregationTemporality) -> dict:
    return {(metric.name, tuple(sorted(point.attributes.items()))): (point.count, point.sum)
            for metric in histograms.metrics(temporality) for point in metric.data.data_points}


def test_runs_recorded_since_the_last_fold_are_collected() -> None:
    histograms = HistogramSet(InstrumentationScope("test"))
    metrics = TaskMetrics(NoOpMeter("test"), histograms=histograms)
    ok = TaskEvent(("inc-1", 0), 0, 2_000_000, 1, 1, 28, "int", None)
    failed = TaskEvent("boom-2", 0, 1_000_000, 1, 1, -1, "", describe_exception(ValueError("x")))
    metrics.record_tasks([ok, failed], ["inc", "boom"], "sync")
    metrics.record_compute(("sync", False, 0.5, "nightly", 2, 1, 28))
    metrics.record_compute(("distributed", True, 2.0, "nightly", 7, -1, -1))  # unknown totals: not recorded
    duration = ("dask.task.duration", (("dask.scheduler", "sync"), ("dask.task.outcome", "success"),
                                       ("dask.task.prefix", "inc")))
    size = ("dask.task.output.size", (("dask.task.prefix", "inc"),))
    job = (("dask.compute.name", "nightly"), ("dask.scheduler", "sync"), ("dask.task.outcome", "success"))
    failed_job = (("dask.compute.name", "nightly"), ("dask.scheduler", "distributed"), ("dask.task.outcome", "error"))
    compute = ("dask.compute.duration", job)
    errors = ("dask.task.duration", (("dask.scheduler", "sync"), ("dask.task.outcome", "error"),
                                     ("dask.task.prefix", "boom")))
    first = _points(histograms, AggregationTemporality.CUMULATIVE)
    assert first == {duration: (1, 0.002), size: (1, 28), compute: (1, 0.5), errors: (1, 0.001),
                     ("dask.compute.tasks", job): (1, 2), ("dask.compute.failed_tasks", job): (1, 1),
                     ("dask.compute.output.size", job): (1, 28), ("dask.compute.duration", failed_job): (1, 2.0),
                     ("dask.compute.tasks", failed_job): (1, 7)}

    for _ in range(FOLD_AT + 10):  # past a fold in the recording thread, and some left over
        metrics.record_tasks([ok], ["inc"], "sync")
        metrics.record_compute(("sync", False, 0.5, "nightly", 2, 1, 28))
    again = _points(histograms, AggregationTemporality.CUMULATIVE)
    assert again[duration][0] == again[size][0] == again[compute][0] == FOLD_AT + 11
    assert again[size][1] == 28 * (FOLD_AT + 11) and again[errors] == (1, 0.001)
    assert again[("dask.compute.tasks", job)] == (FOLD_AT + 11, 2 * (FOLD_AT + 11))


class Recording(MetricExporter):
    """A push exporter that keeps what it was sent, and fails while ``down``."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self.sent: list[MetricsData] = []

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: object
               ) -> MetricExportResult:
        if self.down:
            return MetricExportResult.FAILURE
        self.sent.append(metrics_data)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: object) -> None: ...

    def prefixes(self) -> list[str]:
        return sorted(dict(point.attributes)["dask.task.prefix"] for resource in self.sent[-1].resource_metrics
                      for scope in resource.scope_metrics for metric in scope.metrics
                      if metric.name == "dask.task.duration" for point in metric.data.data_points)


def _push(metrics: TaskMetrics, exporter: CountingMetricExporter, prefix: str) -> list[str]:
    if prefix:
        metrics.record_tasks([TaskEvent(f"{prefix}-1", 0, 5, 1, 1, 8, "int", None)], [prefix], "sync")
    exporter.export(MetricsData(resource_metrics=[ResourceMetrics(Resource({}), [], "")]))
    return exporter._inner.prefixes()


def test_a_push_exporter_is_sent_unchanged_cumulative_series_only_now_and_then(monkeypatch) -> None:
    from otel_graph.export import histograms as module
    histograms = HistogramSet(InstrumentationScope("test"))
    metrics = TaskMetrics(NoOpMeter("test"), histograms=histograms)
    exporter = CountingMetricExporter(Recording(), histograms=histograms)
    metrics.record_tasks([TaskEvent("a-1", 0, 5, 1, 1, 8, "int", None)], ["a"], "sync")
    assert _push(metrics, exporter, "b") == ["a", "b"]
    assert _push(metrics, exporter, "b") == ["b"]  # a did not change
    assert _push(metrics, exporter, "") == []
    assert sorted(dict(p.attributes)["dask.task.prefix"] for m in histograms.metrics(AggregationTemporality.CUMULATIVE)
                  if m.name == "dask.task.duration" for p in m.data.data_points) == ["a", "b"]  # a pull reader: all
    exporter._inner.down = True
    _push(metrics, exporter, "a")  # not delivered: the next export sends every series
    exporter._inner.down = False
    assert _push(metrics, exporter, "") == ["a", "b"]
    monkeypatch.setattr(module, "RESEND_UNCHANGED_S", 0.0)
    (point,) = [p for r in exporter._inner.sent[-1].resource_metrics for s in r.scope_metrics for m in s.metrics
                if m.name == "dask.task.duration" for p in m.data.data_points
                if dict(p.attributes)["dask.task.prefix"] == "b"]
    assert point.count == 2  # cumulative: the whole count, whenever sent
    assert _push(metrics, exporter, "") == ["a", "b"]  # unchanged, sent again now and then


def test_an_exporter_whose_deliveries_are_read_gets_every_series() -> None:
    """A distributed worker's ledger adds up the points of each delivered export."""
    histograms = HistogramSet(InstrumentationScope("test"))
    metrics = TaskMetrics(NoOpMeter("test"), histograms=histograms)
    exporter = CountingMetricExporter(Recording(), histograms=histograms)
    exporter.on_delivered = lambda data: None
    assert _push(metrics, exporter, "a") == ["a"]
    assert _push(metrics, exporter, "b") == ["a", "b"]
