"""Small computes drained by the thread that computed them, beside the tracker's thread."""

from __future__ import annotations

import threading

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_graph.export.pipeline import ReliableSpanProcessor
from otel_graph.telemetry.metrics import TaskMetrics
from otel_graph.telemetry.spans import DirectEmitter
from otel_graph.telemetry.tracker import Tracker


def compute_points(reader: InMemoryMetricReader) -> list:
    data = reader.get_metrics_data()
    return [(dict(point.attributes), point.count)
            for resource in data.resource_metrics for scope in resource.scope_metrics
            for metric in scope.metrics if metric.name == "dask.compute.duration"
            for point in metric.data.data_points]


def test_a_compute_drained_inline_is_not_drained_again_by_the_tracker():
    """The tracker's thread takes its list of computes, then drains them one by one; a small
    compute in that list that its own thread finished meanwhile must not be finished twice
    (its compute counted twice, and as a success after its failure)."""
    inside, gate = threading.Event(), threading.Event()

    class HeldMetrics(TaskMetrics):  # holds the tracker's thread inside the long compute's drain
        def record_tasks(self, events, prefixes, scheduler):  # noqa: ANN001, ANN201
            if scheduler == "threads" and threading.current_thread().name == "otel-graph-tracker":
                inside.set()
                gate.wait(10)
            super().record_tasks(events, prefixes, scheduler)

    spans = InMemorySpanExporter()
    provider = TracerProvider()
    processor = ReliableSpanProcessor(spans, max_queued=10_000, schedule_delay_s=0.01)
    provider.add_span_processor(processor)
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    tracker = Tracker(tracer=provider.get_tracer("test"), emitter=DirectEmitter(provider, InstrumentationScope("t")),
                      metrics=HeldMetrics(meters.get_meter("test")), max_task_spans=None, drain_interval_s=0.05)
    try:
        running = tracker.begin("threads")  # a long compute, still running, with a task to drain
        small = tracker.begin("sync")  # a small one, in the tracker's list with it
        running.submitted = 1
        running.sink.append(("k-1", 1, 2, 1, 1, 8, "int", None))
        assert inside.wait(10)
        assert small.inline  # otel_graph's own processors only: drained where it ends
        tracker.end(small, ValueError("failed on purpose"))  # drained and finished inline
        gate.set()
        tracker.end(running, None)
        assert tracker.flush(timeout_s=10)
        assert processor.force_flush(10_000)
    finally:
        gate.set()
        tracker.stop(5)
        processor.shutdown()
    points = compute_points(reader)
    assert sorted((a["dask.scheduler"], a["dask.task.outcome"], n) for a, n in points) == \
        [("sync", "error", 1), ("threads", "success", 1)], points
    assert [s.name for s in spans.get_finished_spans()].count("dask.compute") == 2


def test_a_halt_in_the_middle_of_a_whole_drain_leaves_the_rest_counted_as_unbuilt():
    """stop(drain=False) (exit with the collector down) may land while a small compute is
    being drained whole: the task spans not made yet stay counted as unbuilt, and its root
    span is not ended as if it were complete."""
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    processor = ReliableSpanProcessor(spans, max_queued=10_000, schedule_delay_s=0.01)
    provider.add_span_processor(processor)
    meters = MeterProvider(metric_readers=[InMemoryMetricReader()])
    tracker: Tracker

    class HaltingEmitter(DirectEmitter):  # the halt lands as the second task span is made
        made = 0

        def emit(self, **kwargs):  # noqa: ANN003, ANN201
            self.made += 1
            if self.made == 2:
                tracker._drainer.halt = True  # what stop(drain=False) sets, from the exit hook's thread
            return super().emit(**kwargs)

    tracker = Tracker(tracer=provider.get_tracer("test"), emitter=HaltingEmitter(provider, InstrumentationScope("t")),
                      metrics=TaskMetrics(meters.get_meter("test")), max_task_spans=1000, drain_interval_s=60)
    try:
        record = tracker.begin("sync")
        record.submitted = 5
        record.sink.extend((f"k-{i}", 1, 2, 1, 1, 8, "int", None) for i in range(5))
        tracker.end(record, None)  # drained inline, whole: 5 tasks, within half the budget
        assert record in tracker._records  # not forgotten as if finished
        assert tracker.unprocessed() == 5 - 2 + 1  # three task spans and the root never made
        assert processor.force_flush(10_000)
        assert sorted(s.name for s in spans.get_finished_spans()) == ["k", "k"]
    finally:
        tracker.stop(1, drain=False)
        processor.shutdown()
