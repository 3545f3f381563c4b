"""The pre-aggregated task histograms (otel_graph's own SDK) count every run and compute,
those recorded since the last fold included, whenever they are collected."""

from __future__ import annotations

from opentelemetry.metrics import NoOpMeter
from opentelemetry.sdk.metrics.export import AggregationTemporality
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_graph.events import TaskEvent, describe_exception
from otel_graph.histograms import HistogramSet
from otel_graph.metrics import FOLD_AT, TaskMetrics


def _points(histograms: HistogramSet, temporality: AggregationTemporality) -> dict:
    return {(metric.name, tuple(sorted(point.attributes.items()))): (point.count, point.sum)
            for metric in histograms.metrics(temporality) for point in metric.data.data_points}


def test_runs_recorded_since_the_last_fold_are_collected() -> None:
    histograms = HistogramSet(InstrumentationScope("test"))
    metrics = TaskMetrics(NoOpMeter("test"), histograms=histograms)
    ok = TaskEvent(("inc-1", 0), 0, 2_000_000, 1, 1, 28, "int", None)
    failed = TaskEvent("boom-2", 0, 1_000_000, 1, 1, -1, "", describe_exception(ValueError("x")))
    metrics.record_tasks([ok, failed], ["inc", "boom"], "sync")
    metrics.record_compute(0.5, "sync", False)
    duration = ("dask.task.duration", (("dask.scheduler", "sync"), ("dask.task.outcome", "success"),
                                       ("dask.task.prefix", "inc")))
    size = ("dask.task.output.size", (("dask.task.prefix", "inc"),))
    compute = ("dask.compute.duration", (("dask.scheduler", "sync"), ("dask.task.outcome", "success")))
    errors = ("dask.task.duration", (("dask.scheduler", "sync"), ("dask.task.outcome", "error"),
                                     ("dask.task.prefix", "boom")))
    first = _points(histograms, AggregationTemporality.CUMULATIVE)
    assert first == {duration: (1, 0.002), size: (1, 28), compute: (1, 0.5), errors: (1, 0.001)}

    for _ in range(FOLD_AT + 10):  # past a fold in the recording thread, and some left over
        metrics.record_tasks([ok], ["inc"], "sync")
        metrics.record_compute(0.5, "sync", False)
    again = _points(histograms, AggregationTemporality.CUMULATIVE)
    assert again[duration][0] == again[size][0] == again[compute][0] == FOLD_AT + 11
    assert again[size][1] == 28 * (FOLD_AT + 11) and again[errors] == (1, 0.001)


def test_a_push_exporter_is_sent_unchanged_cumulative_series_only_now_and_then(monkeypatch) -> None:
    from otel_graph import histograms as module

    histograms = HistogramSet(InstrumentationScope("test"))
    metrics = TaskMetrics(NoOpMeter("test"), histograms=histograms)
    exporter = object()
    cumulative = AggregationTemporality.CUMULATIVE

    def prefixes(consumer: object) -> list[str]:
        return sorted(dict(point.attributes).get("dask.task.prefix", "") for metric in
                      histograms.metrics(cumulative, consumer=consumer) if metric.name == "dask.task.duration"
                      for point in metric.data.data_points)

    metrics.record_tasks([TaskEvent("a-1", 0, 5, 1, 1, 8, "int", None)], ["a"], "sync")
    metrics.record_tasks([TaskEvent("b-1", 0, 5, 1, 1, 8, "int", None)], ["b"], "sync")
    assert prefixes(exporter) == ["a", "b"]
    metrics.record_tasks([TaskEvent("b-2", 0, 5, 1, 1, 8, "int", None)], ["b"], "sync")
    assert prefixes(exporter) == ["b"]  # a did not change
    assert prefixes(exporter) == []
    assert prefixes(None) == ["a", "b"]  # a pull reader (Prometheus) reads them all, always
    monkeypatch.setattr(module, "RESEND_UNCHANGED_S", 0.0)
    assert prefixes(exporter) == ["a", "b"]  # sent again, now and then
    (point,) = [p for m in histograms.metrics(cumulative, consumer=object()) if m.name == "dask.task.duration"
                for p in m.data.data_points if dict(p.attributes)["dask.task.prefix"] == "b"]
    assert point.count == 2  # cumulative: the whole count, whenever sent
