"""Task spans encoded straight from their records equal the generic path's spans.

Where spans are encoded as they end, a successful task's span skips the attribute dict
(otel_graph.telemetry.task_encoding). Whatever the task (its key's shape, result size, dependencies,
fused functions, a parent with trace state), the request must be the stock encoder's for the
ReadableSpan the generic path makes of the same record.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest
from dask._task_spec import Task, TaskRef
from dask.local import start_state_from_dask
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

from graphs import add, inc
from otel_graph.export.otlp_fast import encode_spans_fast
from otel_graph.naming import task_prefix
from otel_graph.telemetry.attributes import task_attributes, task_facts
from otel_graph.telemetry.encoded_batch import UNSET_STATUS, EncodedBatch
from otel_graph.telemetry.events import ErrorInfo, TaskEvent
from otel_graph.telemetry.spans import DirectEmitter
from otel_graph.telemetry.task_encoding import TaskAttributeEncoder

RESOURCE = Resource({"service.name": "encoding-test"})
SCOPE = InstrumentationScope("otel_graph", "1")


class Encoded:
    """A span processor that takes spans encoded as they end, and keeps them."""

    never_blocks = takes_encoded = True

    def __init__(self) -> None:
        self.spans: list[tuple[bytes, int]] = []

    def on_start(self, span: Any, parent_context: Any = None) -> None: ...

    def on_end(self, span: Any) -> None:
        raise AssertionError(f"{span.name} was not encoded as it ended")

    def on_end_encoded(self, span: tuple[bytes, int]) -> None:
        self.spans.append(span)

    def on_end_encoded_many(self, spans: list[tuple[bytes, int]]) -> None:
        self.spans.extend(spans)

    def shutdown(self) -> None: ...

    def force_flush(self, timeout_millis: int = 0) -> bool:
        return True


def _graph() -> dict:
    """A graph with a task of many dependencies, fused functions, and keys of every shape."""
    graph: dict[Any, Any] = {f"leaf-{i}": Task(f"leaf-{i}", inc, i) for i in range(40)}
    graph[("sum-ab12", 0)] = Task(("sum-ab12", 0), sum, [TaskRef(f"leaf-{i}") for i in range(40)])
    graph["fused-cd34"] = Task("fused-cd34", inc, Task("inner", add, TaskRef("leaf-0"), 1))
    graph["ünï-ef56"] = Task("ünï-ef56", inc, TaskRef(("sum-ab12", 0)))
    graph[b"raw-\xff"] = Task(b"raw-\xff", inc, 1)
    graph["x" * 300] = Task("x" * 300, inc, 2)
    graph["long-" + "y" * 600] = Task("long-" + "y" * 600, inc, 3)  # past MAX_KEY_CHARS: cut
    return graph


def _events(graph: dict) -> list[TaskEvent]:
    sizes = [28, -1, 0, 2**63, 2**40, 28]  # unknown, and past int64: no nbytes attribute
    types = ["int", "NoneType", "ndarray", "weird \udcff", "list", "int"]
    return [TaskEvent(key, 1_000 + i, 2_000 + i, 140_000 + i % 2 if i % 3 else f"tcp://10.0.0.{i % 4}:8786",
                      7 + i % 2, sizes[i % len(sizes)], types[i % len(types)], None)
            for i, key in enumerate(graph)]


@pytest.mark.parametrize("together", [False, True])
@pytest.mark.parametrize("trace_state", [None, TraceState([("vendor", "on")])])
@pytest.mark.parametrize("with_state", [True, False])
def test_task_spans_encoded_from_records_equal_stock(trace_state: TraceState | None, with_state: bool,
                                                     together: bool) -> None:
    graph = _graph()
    state = start_state_from_dask(graph, cache={}) if with_state else None
    parent = NonRecordingSpan(SpanContext(0xFEED, 0xBEEF, False, TraceFlags(1), trace_state))
    events = _events(graph) * 2  # again, from the caches

    generic = TracerProvider(resource=RESOURCE)
    finished = InMemorySpanExporter()
    generic.add_span_processor(SimpleSpanProcessor(finished))
    direct = DirectEmitter(generic, SCOPE)
    direct._random.seed(5)
    for ev in events:
        prefix = task_prefix(ev.key)
        direct.emit(parent=parent, name=prefix, start_ns=ev.start_ns, end_ns=ev.end_ns,
                    attributes=task_attributes(ev, prefix, graph if with_state else None, state))

    fast = TracerProvider(resource=RESOURCE)
    encoded = Encoded()
    fast.add_span_processor(encoded)
    emitter = DirectEmitter(fast, SCOPE)
    emitter._random.seed(5)
    encoder = TaskAttributeEncoder()
    batch = emitter.encoded_batch()
    assert batch is not None
    if together:  # a small compute's task records, in one loop
        tasks = [(tuple(ev), task_facts(ev.key, graph if with_state else None, state)) for ev in events]
        runs, left = batch.add_tasks(parent.get_span_context(), tasks, str, "sync", encoder.encode)
        assert left == []
        assert runs == [(task_prefix(ev.key), "sync", False, ev.end_ns - ev.start_ns, ev.nbytes) for ev in events]
    else:  # one at a time, as a span plan hands them out
        for ev in events:
            prefix = task_prefix(ev.key)
            assert batch.add_task(parent, ev, prefix, prefix, encoder, graph if with_state else None, state)
    assert encoded.spans == []  # kept until queued, then queued at once
    batch.queue()

    expected = encode_spans(finished.get_finished_spans())
    assert len(encoded.spans) == len(events)
    assert encode_spans_fast(encoded.spans) == expected
    named = {kv.key for span in expected.resource_spans[0].scope_spans[0].spans for kv in span.attributes}
    assert ("dask.task.dependencies" in named) is with_state  # the cases covered are there
    assert ("code.function.name" in named) is with_state


def test_tasks_a_batch_cannot_encode_are_left_to_the_generic_path() -> None:
    """Attributes that cannot be encoded, and failed tasks, leave nothing in the batch and are
    named: the tracker then hands those spans over the generic way, which logs and leaves out
    what it cannot encode, or adds the exception event."""
    provider = TracerProvider(resource=RESOURCE)
    encoded = Encoded()
    provider.add_span_processor(encoded)
    emitter = DirectEmitter(provider, SCOPE)
    parent = NonRecordingSpan(SpanContext(1, 2, False, TraceFlags(1)))
    bad = TaskEvent("bad-\udcff", 1, 2, 3, 3, 8, "int", None)
    good = TaskEvent("good-1", 1, 2, 3, 3, 8, "int", None)
    failed = TaskEvent("failed-1", 1, 2, 3, 3, -1, "", ErrorInfo("ValueError", "no", ""))

    def refuse_bad(ev: TaskEvent, *args: Any) -> bytes:
        if ev == bad:
            raise ValueError("cannot")
        return b""

    batch = emitter.encoded_batch()
    assert batch is not None
    labels = {"bad": "bad", "good": None, "failed": "failed"}  # good past the prefix limit: "(other prefixes)"
    runs, left = batch.add_tasks(parent.get_span_context(), [(ev, ((), None, None)) for ev in (bad, good, failed)],
                                 labels.get, "sync", refuse_bad)
    assert [run[:3] for run in runs] == [("bad", "sync", False), (None, "sync", False), ("failed", "sync", True)]
    assert left == [(bad, "bad"), (failed, "failed")]
    assert not batch.add_task(parent, bad, "bad", "bad", refuse_bad, None, None)
    assert not batch.add_task(parent, failed, "failed", "failed", refuse_bad, None, None)
    assert len(batch) == 1
    batch.queue()
    (span,) = encode_spans_fast(encoded.spans).resource_spans[0].scope_spans[0].spans
    assert span.name == "(other prefixes)"


def test_spans_queued_together_that_a_processor_refuses_are_each_counted(caplog: pytest.LogCaptureFixture) -> None:
    """A small compute's spans (its tasks' and its root's) go to the processors together: if
    that raises, each of them counts in span_errors, and the first says so."""
    from opentelemetry.metrics import NoOpMeter

    from otel_graph.telemetry.metrics import TaskMetrics
    from otel_graph.telemetry.tracker import Tracker

    class Refusing(Encoded):
        def on_end_encoded_many(self, spans: list[tuple[bytes, int]]) -> None:
            raise RuntimeError("queue refused")

    provider = TracerProvider(resource=RESOURCE)
    refusing = Refusing()
    provider.add_span_processor(refusing)
    tracker = Tracker(tracer=provider.get_tracer("test"), emitter=DirectEmitter(provider, SCOPE),
                      metrics=TaskMetrics(NoOpMeter("test")), max_task_spans=None, drain_interval_s=0.05)
    try:
        with caplog.at_level("WARNING", logger="otel_graph"):
            # set aside, being small: its four spans are queued together
            assert _ended(tracker, ((f"inc-{i}", 1, 2, 1, 1, 28, "int", None) for i in range(3))).inline
            assert tracker.flush(5)
        assert tracker.span_errors == 4
        assert not refusing.spans  # the root span went with them
        assert sum("making a span raised" in r.getMessage() for r in caplog.records) == 1
    finally:
        tracker.stop(5)


def test_a_halt_while_small_computes_spans_are_made_queues_what_was_built() -> None:
    """stop(drain=False) landing while the spans of small computes set aside are made: the
    compute being made is made whole and queued (counted as made, its spans must go out), and
    the next stays counted as unbuilt."""
    from opentelemetry.metrics import NoOpMeter

    from otel_graph.telemetry.metrics import TaskMetrics
    from otel_graph.telemetry.tracker import Tracker

    tracker: Tracker

    class HaltingBatch(EncodedBatch):  # the halt lands as the task spans are made
        def add_tasks(self, *args: Any) -> tuple[list[Any], list[tuple[TaskEvent, str]]]:
            tracker._drainer.halt = True  # what stop(drain=False) sets, from the exit hook's thread
            return super().add_tasks(*args)

    class Halting(DirectEmitter):
        def encoded_batch(self, encoding: Any = None) -> EncodedBatch | None:
            made = super().encoded_batch(encoding)
            if made is None:
                return None
            halting = HaltingBatch()
            halting.emitter, halting.processors, halting.parts = self, made.processors, made.parts
            return halting

    provider = TracerProvider(resource=RESOURCE)
    encoded = Encoded()
    provider.add_span_processor(encoded)
    tracker = Tracker(tracer=provider.get_tracer("test"), emitter=Halting(provider, SCOPE),
                      metrics=TaskMetrics(NoOpMeter("test")), max_task_spans=1000, drain_interval_s=60)
    try:
        for _ in range(2):
            assert _ended(tracker, ((f"k-{i}", 1, 2, 1, 1, 8, "int", None) for i in range(5))).inline
        assert tracker.unprocessed() == 12 and not encoded.spans  # set aside, both
        tracker.flush(5)
        assert len(encoded.spans) == 6  # the first, made as the halt landed, and queued
        assert tracker.unprocessed() == 6  # the second, never made
    finally:
        tracker.stop(1, drain=False)


def _tracker(processor: Any, **options: Any) -> Any:
    from opentelemetry.metrics import NoOpMeter

    from otel_graph.telemetry.metrics import TaskMetrics
    from otel_graph.telemetry.tracker import Tracker

    provider = TracerProvider(resource=RESOURCE)
    provider.add_span_processor(processor)
    return Tracker(tracer=provider.get_tracer("test"), emitter=DirectEmitter(provider, SCOPE),
                   metrics=TaskMetrics(NoOpMeter("test")),
                   **{"max_task_spans": 1000, "drain_interval_s": 60, **options})


def _names(spans: list[tuple[bytes, int]]) -> list[str]:
    return [span.name for span in encode_spans_fast(spans).resource_spans[0].scope_spans[0].spans]


def _ended(tracker: Any, records: Iterable[tuple[Any, ...]], *, graph: dict | None = None) -> Any:
    """A sync compute that ran ``records`` (TaskEvent's fields), recorded as capture records them,
    with ``graph`` and Dask's state of it where given, then ended: its record."""
    record = tracker.begin("sync")
    assert record is not None
    if graph is not None:
        record.graph, record.state = graph, start_state_from_dask(graph)
    records = list(records)
    record.submitted = len(records)
    record.sink.extend(records)
    tracker.end(record, None)
    return record


def test_a_prefix_first_seen_in_a_small_compute_names_its_spans(monkeypatch: pytest.MonkeyPatch) -> None:
    """The span names of a compute drained whole are asked as its prefixes are admitted to the
    metrics, task by task, failed tasks too: a prefix the process never saw names its spans
    itself, not "(other prefixes)"; past the limit, in the order the metrics admit them."""
    from otel_graph.telemetry import metrics
    encoded = Encoded()
    tracker = _tracker(encoded)
    try:
        assert _ended(tracker, [("fresh-1", 1, 2, 1, 1, 8, "int", None), ("fresh-2", 1, 2, 1, 1, 8, "int", None),
                                ("failing-1", 1, 2, 1, 1, -1, "", ErrorInfo("ValueError", "no", ""))]).inline
        assert sorted(_names(encoded.spans)) == ["dask.compute", "failing", "fresh", "fresh"]
    finally:
        tracker.stop(5)

    monkeypatch.setattr(metrics, "MAX_METRIC_PREFIXES", 1)
    encoded = Encoded()
    tracker = _tracker(encoded)
    try:
        # the failed task's prefix comes first, and takes the one place
        _ended(tracker, [("failing-1", 1, 2, 1, 1, -1, "", ErrorInfo("ValueError", "no", "")),
                         ("fresh-1", 1, 2, 1, 1, 8, "int", None)])
        assert sorted(_names(encoded.spans)) == ["(other prefixes)", "dask.compute", "failing"]
    finally:
        tracker.stop(5)


def test_a_large_computes_slices_are_queued_once_each_even_when_one_is_refused(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A compute past the whole drain's size goes through its span plan a slice of records at a
    time, each slice's spans queued together. A slice the processors refuse is counted in
    span_errors, once, and never queued again with the next; the others arrive, each once."""
    from otel_graph.telemetry import drain as drain_module
    class RefusesTheSecond(Encoded):
        calls = 0

        def on_end_encoded_many(self, spans: list[tuple[bytes, int]]) -> None:
            assert tracker._drainer.building._is_owned()  # queued before stop() can count them
            self.calls += 1
            if self.calls == 2:
                raise RuntimeError("queue refused")
            super().on_end_encoded_many(spans)

    monkeypatch.setattr(drain_module, "EVENT_SLICE", 100)
    refusing = RefusesTheSecond()
    tracker = _tracker(refusing, max_task_spans=None)
    try:
        with caplog.at_level("WARNING", logger="otel_graph"):
            # too large to drain here: the tracker's thread drains it
            _ended(tracker, ((f"big-{i}", 1, 2, 1, 1, 8, "int", None) for i in range(300)))
            assert tracker.flush(10)
        names = _names(refusing.spans)
        keys = [attribute.value.string_value for span in encode_spans_fast(refusing.spans).resource_spans[0]
                .scope_spans[0].spans for attribute in span.attributes if attribute.key == "dask.task.key"]
        assert len(keys) == len(set(keys)) == 200  # the first and third slices, each span once
        assert names.count("dask.compute") == 1  # the root went with the last batch
        assert tracker.span_errors == 100
        assert sum("making a span raised" in r.getMessage() for r in caplog.records) == 1
    finally:
        tracker.stop(5)


def test_a_large_computes_spans_are_queued_a_few_hundred_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """The span plan's spans go to the export queue in batches of BATCH_SPANS as they are made,
    not a slice at the end: the exporter starts on them while the rest are made."""
    from otel_graph.telemetry import drain as drain_module
    class Sizes(Encoded):
        def __init__(self) -> None:
            super().__init__()
            self.sizes: list[int] = []

        def on_end_encoded_many(self, spans: list[tuple[bytes, int]]) -> None:
            self.sizes.append(len(spans))
            super().on_end_encoded_many(spans)

    monkeypatch.setattr(drain_module, "BATCH_SPANS", 30)
    sizes = Sizes()
    tracker = _tracker(sizes, max_task_spans=None)
    try:
        _ended(tracker, ((f"big-{i}", 1, 2, 1, 1, 8, "int", None) for i in range(200)))
        assert tracker.flush(10)
        assert sum(sizes.sizes) == 201 and max(sizes.sizes) <= 30 and len(sizes.spans) == 201
    finally:
        tracker.stop(5)


@pytest.mark.parametrize("batched", [True, False])
def test_the_memo_of_spans_encoded_as_they_end_stays_bounded(batched: bool) -> None:
    """The memo of (attribute, value) pairs outlives every batch: each new task key is a new
    pair, so an emitter must start a new memo once it holds too many, whether its spans go in
    batches (a small compute's) or one by one; and a span encoded after that is still whole."""
    from otel_graph.telemetry.spans import _MEMO_PAIRS

    provider = TracerProvider(resource=RESOURCE)
    encoded = Encoded()
    provider.add_span_processor(encoded)
    emitter = DirectEmitter(provider, SCOPE)
    parent = NonRecordingSpan(SpanContext(1, 2, False, TraceFlags(1)))
    largest = 0
    for i in range(3 * _MEMO_PAIRS):
        attributes = {"dask.task.key": f"k-{i}"}
        if batched:
            batch = emitter.encoded_batch()
            assert batch is not None
            batch.add("k", SpanContext(1, i + 3, False, TraceFlags(1)), parent.get_span_context(), 1, 2, attributes,
                      (), UNSET_STATUS)
            batch.queue()
        else:
            emitter.emit(parent=parent, name="k", start_ns=1, end_ns=2, attributes=attributes)
        largest = max(largest, len(emitter._encoding[1].memo.pairs))
    assert largest <= _MEMO_PAIRS + 1
    assert len(encoded.spans) == 3 * _MEMO_PAIRS
    (last,) = encode_spans_fast(encoded.spans[-1:]).resource_spans[0].scope_spans[0].spans
    assert {kv.key: kv.value.string_value for kv in last.attributes} == {"dask.task.key": f"k-{3 * _MEMO_PAIRS - 1}"}


def test_small_computes_set_aside_are_made_by_a_flush_and_at_stop() -> None:
    """Fewer than ASIDE_COMPUTES small computes set aside are made by the next flush, with
    their metrics; stop() makes what was set aside since, and leaves nothing unbuilt."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from otel_graph.telemetry.aside import ASIDE_COMPUTES
    from otel_graph.telemetry.metrics import TaskMetrics
    from otel_graph.telemetry.tracker import Tracker

    provider = TracerProvider(resource=RESOURCE)
    encoded = Encoded()
    provider.add_span_processor(encoded)
    reader = InMemoryMetricReader()
    tracker = Tracker(tracer=provider.get_tracer("test"), emitter=DirectEmitter(provider, SCOPE),
                      metrics=TaskMetrics(MeterProvider(metric_readers=[reader]).get_meter("test")),
                      max_task_spans=1000, drain_interval_s=3600)

    def compute(tasks: int) -> None:
        assert _ended(tracker, ((f"k-{i}", 1, 2, 1, 1, 8, "int", None) for i in range(tasks))).inline

    try:
        for _ in range(ASIDE_COMPUTES - 1):
            compute(2)
        assert not encoded.spans and tracker.unprocessed() == 3 * (ASIDE_COMPUTES - 1)
        assert tracker.flush(5)
        assert len(encoded.spans) == 3 * (ASIDE_COMPUTES - 1) and tracker.unprocessed() == 0
        compute(1)
    finally:
        left = tracker.stop(5)
    assert left == 0 and len(encoded.spans) == 3 * (ASIDE_COMPUTES - 1) + 2
    roots = [s for s in encode_spans_fast(encoded.spans).resource_spans[0].scope_spans[0].spans
             if s.name == "dask.compute"]
    assert sorted({kv.key: kv.value.int_value for kv in s.attributes}["dask.graph.tasks"] for s in roots) == \
        [1] + [2] * (ASIDE_COMPUTES - 1)
    (durations,) = [m for r in reader.get_metrics_data().resource_metrics for sm in r.scope_metrics
                    for m in sm.metrics if m.name == "dask.compute.duration"]
    assert sum(p.count for p in durations.data.data_points) == ASIDE_COMPUTES


def test_a_small_compute_past_half_the_span_budget_is_not_set_aside_a_span_a_task() -> None:
    """A compute set aside gets a span per task: one with more tasks than half the span budget
    goes through the span plan instead (its spans within the budget, the rest aggregated)."""
    encoded = Encoded()
    tracker = _tracker(encoded, max_task_spans=4, drain_interval_s=3600)
    try:
        assert _ended(tracker, ((f"k-{i}", 1, 2 + i, 1, 1, 8, "int", None) for i in range(10))).inline
        assert tracker.flush(5)
    finally:
        tracker.stop(5)
    spans = encode_spans_fast(encoded.spans).resource_spans[0].scope_spans[0].spans
    counts = [next((kv.value.int_value for kv in s.attributes if kv.key == "dask.task.count"), 1)
              for s in spans if s.name != "dask.compute"]
    assert len(counts) == 4 + 1 and sum(counts) == 10  # four task spans, and an aggregate of the other six


def test_computes_set_aside_go_to_the_processors_there_when_they_ended() -> None:
    """A span processor added once computes were set aside gets none of their spans: those are
    made for the processors there before it, and later computes' for both."""
    first, second = Encoded(), Encoded()
    tracker = _tracker(first, drain_interval_s=3600)

    def compute() -> None:
        assert _ended(tracker, [("k-1", 1, 2, 1, 1, 8, "int", None)]).inline

    try:
        compute()
        compute()
        assert not first.spans and tracker.unprocessed() == 4  # set aside
        tracker.tracer.span_processor.add_span_processor(second)  # the provider's own processor, which holds the list
        compute()  # the two before are made first, for the first processor alone
        assert len(first.spans) == 4 and not second.spans
        assert tracker.flush(5)
    finally:
        tracker.stop(5)
    assert len(first.spans) == 6 and len(second.spans) == 2


def test_a_compute_the_tracker_drained_while_it_was_being_set_aside_is_not_made_twice(monkeypatch) -> None:
    """The tracker's thread drains running computes: if it takes a compute's records while its
    thread is reading them to set it aside, the compute is drained there instead, each task
    a span once."""
    import otel_graph.telemetry.aside as aside_module

    encoded = Encoded()
    tracker = _tracker(encoded, drain_interval_s=3600)
    record = tracker.begin("sync")
    assert record is not None and record.inline
    record.submitted = 3
    record.sink.extend((f"inc-{i}", 1, 2, 1, 1, 8, "int", None) for i in range(3))
    facts = aside_module.task_facts
    landed = []

    def drain_lands(*args: Any, **kwargs: Any) -> Any:
        if not landed:  # what the tracker's thread does to a compute it found running
            landed.append(True)
            end_ns, record.end_ns = record.end_ns, None
            tracker._drainer.drain_guarded(record)
            record.end_ns = end_ns
        return facts(*args, **kwargs)

    monkeypatch.setattr(aside_module, "task_facts", drain_lands)
    try:
        tracker.end(record, None)
        assert tracker.flush(5)
    finally:
        tracker.stop(5)
    assert landed
    names = sorted(_names(encoded.spans))
    assert names == ["dask.compute", "inc", "inc", "inc"], names


def test_each_task_of_a_compute_set_aside_is_named_by_its_own_callable() -> None:
    """Callables no weak reference can be made to (NumPy's ufuncs and functions, operator's
    getters) are named once per graph, by their identity while the graph holds them: each task
    still gets its own name, and a later graph's callables are not taken for an earlier one's."""
    import operator
    import weakref
    from functools import partial

    import numpy as np

    from otel_graph.telemetry.tracker import Tracker

    first = [np.add, np.sum, operator.itemgetter(0), partial(np.multiply, 1), np.add]
    second = [np.subtract, np.mean, operator.attrgetter("real"), partial(np.divide, 1)]
    for func in first + second:
        with pytest.raises(TypeError):  # or the weak cache would name them, not the one under test
            weakref.ref(func.func if isinstance(func, partial) else func)
    encoded = Encoded()
    tracker: Tracker = _tracker(encoded)

    def compute(funcs: list[Any], tag: str) -> None:
        graph = {f"{tag}{i}-1": Task(f"{tag}{i}-1", func, [1, 2]) for i, func in enumerate(funcs)}
        assert _ended(tracker, ((key, 1, 2, 1, 1, 8, "int", None) for key in graph), graph=graph).inline

    try:
        compute(first, "a")
        compute(second, "b")
        assert tracker.flush(5)
    finally:
        tracker.stop(5)
    spans = encode_spans_fast(encoded.spans).resource_spans[0].scope_spans[0].spans
    named = {attributes["dask.task.key"]: attributes["code.function.name"] for attributes in
             ({kv.key: kv.value.string_value for kv in span.attributes}
              for span in spans if span.name != "dask.compute")}
    from dask.utils import funcname

    expected = {f"{tag}{i}-1": funcname(func) for tag, funcs in (("a", first), ("b", second))
                for i, func in enumerate(funcs)}
    assert len(set(expected.values())) == 8 and named == expected


def test_a_pool_computes_early_drain_leaves_the_computes_set_aside_to_their_batch() -> None:
    """A running pool compute asking for a drain (its records pile up) gets that one drained:
    the small computes other threads set aside still wait for their batch of ASIDE_COMPUTES,
    and nothing else is drained at the pool's pace."""
    import time

    from otel_graph.config import DEFAULT_EARLY_DRAIN_TASKS as EARLY_DRAIN_EVENTS
    from otel_graph.telemetry.tracker import Tracker

    encoded = Encoded()
    tracker: Tracker = _tracker(encoded, drain_interval_s=3600)
    try:
        _ended(tracker, [("small-1", 1, 2, 1, 1, 8, "int", None)])
        assert tracker.unprocessed() == 2 and not encoded.spans  # set aside: a root and a task span

        pool = tracker.begin("threads")
        assert pool is not None and pool.early_at == EARLY_DRAIN_EVENTS and pool.drain_soon == tracker._drain_soon
        pool.submitted = EARLY_DRAIN_EVENTS + 10
        pool.sink.extend((f"pool-{i}", 1, 2, 1, 1, 8, "int", None) for i in range(EARLY_DRAIN_EVENTS + 10))
        pool.drain_soon(pool)
        deadline = time.monotonic() + 10
        # A drain counts records as seen when it takes them, before it makes their spans.
        while len(encoded.spans) < EARLY_DRAIN_EVENTS + 10 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pool.seen == EARLY_DRAIN_EVENTS + 10
        assert _names(encoded.spans) == ["pool"] * (EARLY_DRAIN_EVENTS + 10)  # its task spans, made while it runs
        assert tracker.unprocessed() == 3  # the one set aside (two spans), still waiting for its batch; the root
        tracker.end(pool, None)
        assert tracker.flush(5)
    finally:
        assert tracker.stop(5) == 0
    assert sorted(set(_names(encoded.spans))) == ["dask.compute", "pool", "small"]
