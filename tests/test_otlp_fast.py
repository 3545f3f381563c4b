"""``otel_graph.export.otlp_fast``: equal to the stock OTLP encoder, and delivered by the stock exporters.

Equality is protobuf message equality against
``opentelemetry.exporter.otlp.proto.common.trace_encoder.encode_spans``, with no
canonical sort: stock groups with insertion-ordered dicts, so its order is
deterministic (first resource seen, first scope seen, spans in input order), and
the fast encoder must reproduce it. Speed is measured by
``benchmarks/bench_encode.py``, never asserted here.
"""

from __future__ import annotations

import enum
import logging
import random
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.grpc import trace_exporter as grpc_trace_exporter
from opentelemetry.exporter.otlp.proto.http import trace_exporter as http_trace_exporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
    set_span_in_context,
)

from otel_graph.export.otlp_fast import EncodedSpans, _encode_request, encode_chunks, encode_spans_fast
from otel_graph.export.sdk_internals import fast_span_exporter, otlp_span_exporter, takes_encoded_chunks
from otlp_receiver import OtlpReceiver

SCHEMA = "https://opentelemetry.io/schemas/1.26.0"
ALL_TYPES: dict[str, Any] = {
    "str": "inc",
    "str.empty": "",
    "str.unicode": "täsk ✓ 🚀 \u0000 ключ",
    "str.long": "x" * 300,  # a length that needs a two-byte varint
    "bool.true": True,
    "bool.false": False,
    "int.zero": 0,
    "int.small": 7,
    "int.big": 2**40,
    "int.negative": -1,
    "int.min": -(2**63),
    "int.max": 2**63 - 1,
    "float": 0.25,
    "float.zero": 0.0,
    "float.negative_zero": -0.0,
    "float.inf": float("inf"),
    "float.integral": 3.0,
    "bytes": b"\x00\xffraw",
    "seq.str": ("a", "b", "c"),
    "seq.str.long": ("a" * 125, "b" * 126, "c" * 300),  # around the one-byte length of an item
    "seq.bool": [True, False],
    "seq.int": [1, -2, 2**62],
    "seq.float": (0.5, -1.5),
    "seq.empty": [],
    "seq.with_none": ["a", None, "c"],
    "seq.mixed": ["a", 1, 2.5, True],  # the SDK 1.45 keeps mixed sequences; stock encodes them as-is
    "seq.nested": [["a"], [1, 2]],
    "map": {"inner": "v", "n": 1, "deeper": {"x": [1.5]}},
    "map.empty": {},
}


def assert_encodes_as_stock(spans: list[ReadableSpan]) -> ExportTraceServiceRequest:
    stock = encode_spans(spans)
    assert encode_spans_fast(spans) == stock
    # The HTTP exporter sends the module's bytes unparsed, and max_request_size measures them:
    # they must hold no default-valued field that stock leaves out.
    assert len(_encode_request(spans)) == stock.ByteSize()
    return stock


def _collect(provider: TracerProvider) -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


@pytest.fixture
def sdk_spans() -> Iterator[list[ReadableSpan]]:
    """Spans from real TracerProviders: two resources (one repeated by a third provider), four scopes."""
    main = TracerProvider(resource=Resource({"service.name": "dask", "host.name": "h1"}, SCHEMA))
    other = TracerProvider(resource=Resource({"service.name": "worker", "n": 2}))
    # Equal to ``main``'s resource but another object: stock merges the two by ==.
    twin = TracerProvider(resource=Resource({"service.name": "dask", "host.name": "h1"}, SCHEMA))
    limits = SpanLimits(max_span_attributes=3, max_events=2, max_links=1,
                        max_event_attributes=1, max_link_attributes=1)  # fmt: skip
    limited = TracerProvider(resource=Resource({"service.name": "limited"}), span_limits=limits)
    exporters = [_collect(p) for p in (main, other, twin, limited)]

    tracer = main.get_tracer("otel_graph", "1.2.3", schema_url=SCHEMA, attributes={"scope.attr": "s", "n": 1})
    bare_tracer = main.get_tracer("bare")
    remote_parent = SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(1),
                                trace_state=TraceState([("vendor", "v1"), ("other", "x=y")]))  # fmt: skip
    link_context = SpanContext(0x1234, 0x5678, is_remote=False)
    with tracer.start_as_current_span("dask.compute", attributes=ALL_TYPES) as root:
        for kind in SpanKind:
            with tracer.start_as_current_span(f"kind-{kind.name}", kind=kind):
                pass
        with tracer.start_as_current_span("failing", links=[Link(link_context, {"link.attr": 1})]) as span:
            span.add_event("retry", {"attempt": 2, "tags": ("a", "b")}, timestamp=1_700_000_000_000_000_123)
            span.add_event("bare")
            span.set_status(Status(StatusCode.ERROR, "worker died ✗"))
        with bare_tracer.start_as_current_span("ok") as span:
            span.set_status(Status(StatusCode.OK))
        root.set_attribute("late", "added")
    with tracer.start_as_current_span("remote-child", context=set_span_in_context(NonRecordingSpan(remote_parent))):
        pass
    with tracer.start_as_current_span("timed", start_time=1_000, end_on_exit=False) as span:
        span.end(end_time=2_000)
    with other.get_tracer("otel_graph", "1.2.3").start_as_current_span("on-worker", attributes={"dask.key": "x"}):
        pass
    with twin.get_tracer("otel_graph", "1.2.3", schema_url=SCHEMA, attributes={"scope.attr": "s", "n": 1}
                         ).start_as_current_span("twin"):  # fmt: skip
        pass
    links = [Link(SpanContext(i + 1, i + 1, is_remote=bool(i % 2)), {"a": i, "b": i}) for i in range(3)]
    with limited.get_tracer("limited").start_as_current_span("drops", links=links) as span:
        span.set_attributes({f"attr{i}": i for i in range(5)})
        for i in range(4):
            span.add_event(f"event{i}", {"a": 1, "b": 2})
    spans = [s for e in exporters for s in e.get_finished_spans()]
    # Interleave the resources, so grouping must gather spans from all over the batch.
    yield spans[::2] + spans[1::2]
    for provider in (main, other, twin, limited):
        provider.shutdown()


def test_chunks_encode_as_stock_and_stay_under_their_size(sdk_spans: list[ReadableSpan]) -> None:
    spans = sdk_spans * 20
    chunks = encode_chunks(spans, max_bytes=2_000)
    assert len(chunks) > 3 and [s for chunk in chunks for s in chunk] == spans
    for chunk in chunks:
        assert isinstance(chunk, EncodedSpans)
        assert_encodes_as_stock(chunk)  # from the chunk's parts, not the spans
        # A request adds its resources and scopes to the parts: a few hundred bytes here.
        assert len(_encode_request(chunk)) <= 2_000 + 600 or len(chunk) == 1
    bad = ReadableSpan(name="bad \udcff", context=_context(1, 2), resource=RESOURCE)
    (before, alone, after) = encode_chunks([spans[0], bad, spans[1]], max_bytes=10**6)
    assert alone == [bad] and not isinstance(alone, EncodedSpans)  # for the exporter to raise on
    assert before == [spans[0]] and after == [spans[1]]


def test_sdk_spans_encode_as_stock(sdk_spans: list[ReadableSpan]) -> None:
    stock = assert_encodes_as_stock(sdk_spans)
    # Guard the fixture itself: the cases above must really be in it.
    assert len(stock.resource_spans) == 3  # main and twin merged
    limited = [s for s in sdk_spans if s.name == "drops"][0]
    assert (limited.dropped_attributes, limited.dropped_events, limited.dropped_links) == (2, 2, 2)
    assert any(s.parent is not None and s.parent.is_remote for s in sdk_spans)


def _context(trace_id: int, span_id: int, *, remote: bool = False) -> SpanContext:
    return SpanContext(trace_id, span_id, is_remote=remote, trace_flags=TraceFlags(1))


RESOURCE = Resource({"service.name": "dask"})
SCOPE = InstrumentationScope("otel_graph", "0.1", SCHEMA, {"scope": True})


class Color(enum.IntEnum):
    RED = 1


class Tag(str):
    pass


def test_direct_readable_spans_encode_as_stock(caplog: pytest.LogCaptureFixture) -> None:
    """Spans built as task spans are: ReadableSpan(...) with no SDK cleaning of attributes."""
    parent = _context(0xFEED, 0xBEEF)
    spans = [
        ReadableSpan(
            name="inc", context=_context(0xFEED, 0x1), parent=parent, resource=RESOURCE, instrumentation_scope=SCOPE,
            attributes={"dask.key": "('inc-abc', 0)", "dask.prefix": "inc", "nbytes": 8000, "deps": ("a", "b")},
            events=[Event("spill", {"bytes": 10}, timestamp=5), Event("empty", timestamp=6)],
            links=[Link(_context(0xFEED, 0x2, remote=True), {"why": "dependency"})],
            kind=SpanKind.INTERNAL, status=Status(StatusCode.ERROR, "boom"), start_time=10, end_time=20,
        ),
        # Values the SDK would clean but a direct ReadableSpan keeps; stock encodes or skips each.
        ReadableSpan(
            name="odd", context=_context(0xFEED, 0x3), parent=_context(0xFEED, 0x1, remote=True), resource=RESOURCE,
            attributes={
                "intenum": Color.RED, "str.subclass": Tag("t"), "bytearray": bytearray(b"ab"),
                "tuple.of.lists": (["a"], [1]), "": "empty key", "none": None,
                "too.big": 2**64, "surrogate": "\ud800", "object": object(), 5: "int key",
                b"k": "UTF-8 bytes key", b"\xff": "bad bytes key",
                "after.bad": "kept",
            },
            start_time=30, end_time=40,
        ),
        # No scope, no parent, no attributes, no times: the minimal span.
        ReadableSpan(name="", context=_context(0xFEED, 0x4), resource=RESOURCE),
        # An equal but distinct scope object joins SCOPE's group.
        ReadableSpan(name="again", context=_context(0xFEED, 0x5), resource=RESOURCE, attributes={"dask.prefix": "inc"},
                     instrumentation_scope=InstrumentationScope("otel_graph", "0.1", SCHEMA, {"scope": True})),
    ]
    assert_encodes_as_stock(spans)
    caplog.clear()
    with caplog.at_level(logging.ERROR):
        encode_spans(spans)
        stock_skipped = sorted(repr(r.args[0]) for r in caplog.records if r.args)
        caplog.clear()
        encode_spans_fast(spans)
        fast_skipped = sorted(repr(r.args[0]) for r in caplog.records if r.args)
    assert fast_skipped == stock_skipped == sorted(map(repr, ["too.big", "surrogate", "object", 5, b"\xff"]))


def test_reused_pairs_keep_their_types() -> None:
    """1, True and 1.0 are equal in Python, and so are 0.0 and -0.0; their encodings are not."""
    values: list[Any] = [1, True, 1.0, 0, False, 0.0, -0.0, "1", ("x",), (1,), (True,), (1.0,), ["x"], Tag("x")]
    spans = [
        ReadableSpan(name=f"s{i}", context=_context(7, i + 1), resource=RESOURCE, attributes={"a": v, "b": ("x",)})
        for i, v in enumerate(values + values[::-1])
    ]
    assert_encodes_as_stock(spans)


def _random_value(rng: random.Random, depth: int = 0) -> Any:
    pick = rng.randrange(10 if depth < 2 else 7)
    if pick == 0:
        return rng.choice(["", "a", "inc", "ü" * rng.randrange(70), "x" * rng.randrange(200)])
    if pick == 1:
        return rng.random() < 0.5
    if pick == 2:
        return rng.choice([0, 1, -1, 127, 128, 2**63 - 1, -(2**63), rng.randrange(-(2**40), 2**40)])
    if pick == 3:
        return rng.choice([0.0, -0.0, 1.0, rng.uniform(-1e9, 1e9)])
    if pick == 4:
        return rng.randbytes(rng.randrange(4))
    if pick == 5:
        return None
    if pick == 6:
        return rng.choice(["a", "b"])  # repeats, so pairs are reused
    if pick == 7:
        return tuple(_random_value(rng, depth + 1) for _ in range(rng.randrange(4)))
    if pick == 8:
        return [rng.choice(["a", "b"]) for _ in range(rng.randrange(3))]
    return {f"k{i}": _random_value(rng, depth + 1) for i in range(rng.randrange(3))}


@pytest.mark.parametrize("seed", range(5))
def test_random_attributes_encode_as_stock(seed: int) -> None:
    rng = random.Random(seed)
    resources = [RESOURCE, Resource({"service.name": "other"}), Resource({"service.name": "dask"})]
    scopes = [SCOPE, InstrumentationScope("x"), None]
    spans = []
    for i in range(200):
        attributes = {f"k{rng.randrange(12)}": _random_value(rng) for _ in range(rng.randrange(8))}
        spans.append(ReadableSpan(
            name=rng.choice(["inc", "add", "ü"]), context=_context(rng.getrandbits(128) or 1, i + 1),
            parent=rng.choice([None, _context(1, 2), _context(1, 3, remote=True)]), resource=rng.choice(resources),
            instrumentation_scope=rng.choice(scopes), attributes=attributes, kind=rng.choice(list(SpanKind)),
            start_time=rng.getrandbits(63), end_time=rng.getrandbits(63),
            events=[Event("e", {"k": _random_value(rng)}, timestamp=i + 1)] if i % 5 == 0 else (),
        ))  # fmt: skip
    assert_encodes_as_stock(spans)


# -- exporters ----------------------------------------------------------------


def _task_spans() -> list[ReadableSpan]:
    return [
        ReadableSpan(name="inc", context=_context(0xFEED, i + 1), parent=_context(0xFEED, 0xBEEF), resource=RESOURCE,
                     instrumentation_scope=SCOPE, attributes={"dask.key": f"inc-{i}", "dask.prefix": "inc"},
                     start_time=100 + i, end_time=200 + i)  # fmt: skip
        for i in range(3)
    ]


@pytest.fixture
def no_stock_encoding(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the stock exporters fail if they encode themselves, so a delivery proves the fast path."""

    def refuse(spans: object) -> None:
        raise AssertionError("the stock encoder was called")

    monkeypatch.setattr(grpc_trace_exporter, "encode_spans", refuse)
    monkeypatch.setattr(http_trace_exporter, "encode_spans", refuse)


def _send_traces_to(receiver: OtlpReceiver, protocol: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if protocol == "grpc":
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", receiver.grpc_endpoint)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_INSECURE", "true")
    else:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"{receiver.http_endpoint}/v1/traces")


@pytest.mark.usefixtures("no_stock_encoding")
@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_fast_exporters_deliver(protocol: str, monkeypatch: pytest.MonkeyPatch) -> None:
    spans = _task_spans()
    with OtlpReceiver() as receiver:
        _send_traces_to(receiver, protocol, monkeypatch)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-tenant=dask")
        exporter = otlp_span_exporter(protocol=protocol)
        assert takes_encoded_chunks(exporter)
        try:
            assert exporter.export(spans) is SpanExportResult.SUCCESS
        finally:
            exporter.shutdown()
        (received,) = receiver.requests("traces")
        assert received.request == encode_spans(spans)
        assert received.headers["x-tenant"] == "dask"
        assert [s["attributes"]["dask.key"] for s in receiver.spans()] == ["inc-0", "inc-1", "inc-2"]
    assert exporter.export(spans) is SpanExportResult.FAILURE  # shut down, as stock


@pytest.mark.usefixtures("no_stock_encoding")
def test_wrapped_grpc_exporter_delivers() -> None:
    with OtlpReceiver() as receiver:
        stock = grpc_trace_exporter.OTLPSpanExporter(endpoint=receiver.grpc_endpoint, insecure=True)
        exporter = fast_span_exporter(stock)
        try:
            assert exporter.export(_task_spans()) is SpanExportResult.SUCCESS
        finally:
            exporter.shutdown()
        assert len(receiver.spans()) == 3


@pytest.mark.usefixtures("no_stock_encoding")
def test_http_exporter_keeps_max_request_size(caplog: pytest.LogCaptureFixture) -> None:
    with OtlpReceiver() as receiver:
        stock = http_trace_exporter.OTLPSpanExporter(endpoint=f"{receiver.http_endpoint}/v1/traces",
                                                     max_request_size=64)  # fmt: skip
        exporter = fast_span_exporter(stock)
        try:
            with caplog.at_level(logging.WARNING):
                assert exporter.export(_task_spans()) is SpanExportResult.FAILURE
            assert "exceeds max_request_size" in caplog.text
            assert exporter.export(_task_spans()[:0]) is SpanExportResult.SUCCESS  # an empty request fits
        finally:
            exporter.shutdown()
        assert stock._shutdown  # shutdown reached the stock exporter
        assert receiver.spans() == []


def test_other_exporters_are_returned_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    memory = InMemorySpanExporter()
    assert fast_span_exporter(memory) is memory and not takes_encoded_chunks(memory)

    class Custom(http_trace_exporter.OTLPSpanExporter):
        pass

    custom = Custom(endpoint="http://127.0.0.1:9/v1/traces")
    assert fast_span_exporter(custom) is custom
    # A future version without the private seam: slower, but still the stock exporter.
    stock = http_trace_exporter.OTLPSpanExporter(endpoint="http://127.0.0.1:9/v1/traces")
    monkeypatch.delattr(stock, "_client")
    assert fast_span_exporter(stock) is stock


def test_unknown_protocol_is_refused() -> None:
    with pytest.raises(ValueError, match="http/json"):
        otlp_span_exporter(protocol="http/json")


# -- a release that changed a private part: the stock path, said once ---------------------------

def test_an_http_exporter_whose_private_parts_changed_delivers_through_the_stock_path(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from opentelemetry.exporter.otlp.proto.http import _common

    from otel_graph.export import sdk_internals
    monkeypatch.setattr(sdk_internals, "_SAID", set())
    monkeypatch.delattr(_common, "_is_request_too_large")  # as if a release renamed it
    with OtlpReceiver() as receiver:
        with caplog.at_level(logging.WARNING, logger="otel_graph"):
            exporters = [fast_span_exporter(http_trace_exporter.OTLPSpanExporter(
                endpoint=f"{receiver.http_endpoint}/v1/traces")) for _ in range(2)]
        try:
            assert all(type(e) is http_trace_exporter.OTLPSpanExporter for e in exporters)  # stock, unwrapped
            assert not any(takes_encoded_chunks(e) for e in exporters)
            assert exporters[0].export(_task_spans()) is SpanExportResult.SUCCESS
        finally:
            for exporter in exporters:
                exporter.shutdown()
        assert len(receiver.spans()) == 3
    said = [r for r in caplog.records if r.name == "otel_graph"]
    assert len(said) == 1 and "HTTP OTLPSpanExporter's private parts" in said[0].getMessage()


def test_a_grpc_exporter_whose_encoder_hook_changed_encodes_with_the_stock_encoder(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from otel_graph.export import sdk_internals
    monkeypatch.setattr(sdk_internals, "_SAID", set())
    original = grpc_trace_exporter.OTLPSpanExporter._translate_data

    def translate(self: Any, data: Any, compact: bool) -> Any:  # a release that added an argument
        return original(self, data)

    monkeypatch.setattr(grpc_trace_exporter.OTLPSpanExporter, "_translate_data", translate)
    with caplog.at_level(logging.WARNING, logger="otel_graph"):
        exporter = fast_span_exporter(grpc_trace_exporter.OTLPSpanExporter(endpoint="localhost:4317", insecure=True))
    try:
        assert "_translate_data" not in vars(exporter) and not takes_encoded_chunks(exporter)
    finally:
        exporter.shutdown()
    said = [r for r in caplog.records if r.name == "otel_graph"]
    assert len(said) == 1 and "_translate_data" in said[0].getMessage()


@pytest.mark.usefixtures("no_stock_encoding")
@pytest.mark.parametrize("stub_known", [True, False])
def test_grpc_requests_go_serialized_also_after_a_reconnect(stub_known: bool, monkeypatch: pytest.MonkeyPatch,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    """The gRPC exporter sends otel_graph's bytes as they are, with the client it remakes on a
    reconnect too; where its stub is not the one known, each request is parsed first, and said."""
    from otel_graph.export import sdk_internals
    monkeypatch.setattr(sdk_internals, "_SAID", set())

    class Unknown(grpc_trace_exporter.TraceServiceStub):  # an unknown stub, as a release might bring
        pass

    if not stub_known:
        monkeypatch.setattr(grpc_trace_exporter, "TraceServiceStub", Unknown)
    spans = _task_spans()
    with OtlpReceiver() as receiver:
        _send_traces_to(receiver, "grpc", monkeypatch)
        with caplog.at_level(logging.WARNING, logger="otel_graph"):
            exporter = otlp_span_exporter(protocol="grpc")
        try:
            assert exporter.export(spans) is SpanExportResult.SUCCESS
            exporter._initialize_channel_and_stub()  # what the exporter does on UNAVAILABLE
            assert exporter.export(spans) is SpanExportResult.SUCCESS
            sent = exporter._translate_data(spans)
        finally:
            exporter.shutdown()
        assert [r.request for r in receiver.requests("traces")] == [encode_spans(spans)] * 2
    assert isinstance(sent, bytes) is stub_known  # bytes, or a message parsed from them
    said = [r.getMessage() for r in caplog.records if r.name == "otel_graph"]
    assert said == ([] if stub_known else [said[0]]) and all("_stub" in m for m in said)


def test_a_metric_exporter_without_its_preferences_is_still_counted(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult

    from otel_graph.export import sdk_internals
    from otel_graph.export.metric_counting import CountingMetricExporter

    class Bare(MetricExporter):
        def __init__(self) -> None:  # never calls the base: no _preferred_* attributes
            pass

        def export(self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
            return MetricExportResult.SUCCESS

        def force_flush(self, timeout_millis: float = 10_000) -> bool:
            return True

        def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
            pass

    monkeypatch.setattr(sdk_internals, "_SAID", set())
    with caplog.at_level(logging.WARNING, logger="otel_graph"):
        counting = CountingMetricExporter(Bare())
    from opentelemetry.sdk.metrics.export import MetricsData

    assert counting.export(MetricsData(resource_metrics=[])) is MetricExportResult.SUCCESS
    assert any("_preferred_temporality" in r.getMessage() for r in caplog.records if r.name == "otel_graph")


@pytest.mark.usefixtures("no_stock_encoding")
@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_spans_encoded_as_they_end_arrive_as_stock_encodes_them(protocol: str, monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    """otel_graph's own spans, queued encoded (no ReadableSpan) for its OTLP exporters, arrive
    exactly as the stock encoder encodes the ReadableSpans the same calls make elsewhere."""
    from otel_graph.export.pipeline import ReliableSpanProcessor
    from otel_graph.telemetry.encoded_batch import UNSET_STATUS
    from otel_graph.telemetry.spans import DirectEmitter

    def hand_over_all(emitter: DirectEmitter) -> None:
        parent = _context(0xFEED, 0xBEEF)
        error = Event("exception", {"exception.type": "ValueError", "exception.message": "boom ✗"}, 15)
        for i, attributes in enumerate([{"dask.task.key": "inc-0", "dask.task.prefix": "inc", "thread.id": 7},
                                        ALL_TYPES, {}, {"surrogate": "\ud800", "kept": 1}]):
            emitter.hand_over(name=f"span-{i}", context=_context(0xFEED, i + 1), parent=parent if i else None,
                              start_ns=10 + i, end_ns=20 + i, attributes=attributes, events=(error,) if i == 1 else (),
                              # UNSET_STATUS takes the short way (simple_entry), another UNSET status the long one
                              status=Status(StatusCode.ERROR, "ValueError: boom") if i == 1 else
                              UNSET_STATUS if i != 3 else Status(StatusCode.UNSET))
        # A span the encoder cannot take (its name) goes as a ReadableSpan: the exporter refuses it alone.
        emitter.hand_over(name="bad \udcff", context=_context(0xFEED, 9), parent=parent, start_ns=1, end_ns=2,
                          attributes={}, events=(), status=Status(StatusCode.UNSET))

    expected = TracerProvider(resource=RESOURCE)
    stock_spans = _collect(expected)
    hand_over_all(DirectEmitter(expected, SCOPE))
    readable = [s for s in stock_spans.get_finished_spans() if s.name.isascii()]
    with OtlpReceiver() as receiver:
        _send_traces_to(receiver, protocol, monkeypatch)
        provider = TracerProvider(resource=RESOURCE)
        # Exported at the flush only: one request, whatever the machine's load.
        processor = ReliableSpanProcessor(otlp_span_exporter(protocol=protocol), max_queued=1000,
                                          schedule_delay_s=60)
        provider.add_span_processor(processor)
        try:
            assert processor.takes_encoded
            hand_over_all(DirectEmitter(provider, SCOPE))
            assert sum(type(item) is tuple for item in processor._queue) == 4  # queued encoded, not as spans
            assert processor.force_flush(10_000)
        finally:
            provider.shutdown()
        assert (processor.exported, processor.undelivered) == (4, 1)
        received = ExportTraceServiceRequest()
        for request in receiver.requests("traces"):
            received.MergeFrom(request.request)
        assert received == encode_spans(readable)


def test_spans_encoded_as_they_end_group_with_readable_spans_as_stock() -> None:
    """A batch mixing encoded spans and ReadableSpans of another resource: grouped by
    resource and scope, in first-seen order, as stock groups the equivalent spans."""
    from otel_graph.export.otlp_fast import origin
    from otel_graph.export.otlp_spans import new_memo, span_entry

    other = Resource({"service.name": "worker"})
    parent = _context(0xFEED, 0xBEEF)
    memo = new_memo()

    def ours(i: int) -> tuple[ReadableSpan, tuple[bytes, int]]:
        readable = ReadableSpan(name=f"ours-{i}", context=_context(0xFEED, i + 1), parent=parent, resource=RESOURCE,
                                instrumentation_scope=SCOPE, attributes={"dask.task.key": f"inc-{i}"},
                                start_time=10, end_time=20)
        encoded = span_entry(readable.context, parent, readable.name, SpanKind.INTERNAL, 10, 20, readable.attributes,
                             (), (), readable.status, memo)
        return readable, (encoded, origin(RESOURCE, SCOPE))

    theirs = [ReadableSpan(name=f"theirs-{i}", context=_context(0xFEED, 100 + i), resource=other,
                           attributes={"n": i}, start_time=1, end_time=2) for i in range(2)]
    (first, first_encoded), (second, second_encoded) = ours(0), ours(1)
    mixed = [first_encoded, theirs[0], second_encoded, theirs[1]]
    assert encode_spans_fast(mixed) == encode_spans([first, theirs[0], second, theirs[1]])
    (chunk,) = encode_chunks(mixed, max_bytes=10**6)
    assert encode_spans_fast(chunk) == encode_spans([first, theirs[0], second, theirs[1]])


def _encoded_spans(count: int, resource: Resource, scope: InstrumentationScope | None, *, key_chars: int = 6,
                   ) -> tuple[list[ReadableSpan], list[tuple[bytes, int]]]:
    """``count`` task-like spans of ``resource`` and ``scope``, as ReadableSpans and as encoded as they end."""
    from otel_graph.export.otlp_fast import origin
    from otel_graph.export.otlp_spans import new_memo, span_entry

    parent, memo = _context(0xFEED, 0xBEEF), new_memo()
    readable = [ReadableSpan(name="inc", context=_context(0xFEED, i + 1), parent=parent, resource=resource,
                             instrumentation_scope=scope, start_time=10 + i, end_time=20 + i,
                             attributes={"dask.task.key": f"inc-{i:0{key_chars}d}", "n": i}) for i in range(count)]
    encoded = [(span_entry(span.context, parent, span.name, SpanKind.INTERNAL, span.start_time, span.end_time,
                           span.attributes, (), (), span.status, memo), origin(resource, scope)) for span in readable]
    return readable, encoded


ORIGINS = {  # (resource, scope) pairs a request of one origin is made of
    "plain": (RESOURCE, SCOPE),
    "schema, no scope": (Resource({"service.name": "schema"}, SCHEMA), None),
}


@pytest.mark.parametrize("origin_name", list(ORIGINS))
@pytest.mark.parametrize(("count", "key_chars", "max_bytes"), [(40, 6, 10**6), (40, 6, 300), (300, 200, 10**6)])
def test_a_batch_of_encoded_spans_is_requested_as_stock_encodes_it(origin_name: str, count: int, key_chars: int,
                                                                    max_bytes: int) -> None:
    """Every span encoded as it ended, of one resource and scope: the request is made in one join,
    by loops in C, and is what stock makes of the same spans (over 16 kB too, where the lengths
    around the spans take three bytes); cut into chunks (a small size) and of two origins, it
    goes the span-by-span way, with the same result."""
    readable, encoded = _encoded_spans(count, *ORIGINS[origin_name], key_chars=key_chars)
    chunks = encode_chunks(encoded, max_bytes=max_bytes)
    assert [span for chunk in chunks for span in chunk] == encoded
    if max_bytes == 10**6:
        (chunk,) = chunks
        assert chunk.origin == encoded[0][1]
        general = EncodedSpans()  # the same chunk, read span by span
        general.extend(chunk)
        general.parts = chunk.parts
        assert _encode_request(chunk) == _encode_request(general)
        assert len(_encode_request(chunk)) > 16_384 or count == 40
        exact = sum(map(len, chunk.parts))  # a batch of exactly the size is one request still
        assert encode_chunks(encoded, max_bytes=exact)[0].origin == chunk.origin
    else:
        assert len(chunks) > 1 and all(chunk.origin is None for chunk in chunks)
    done = 0
    for chunk in chunks:
        assert encode_spans_fast(chunk) == encode_spans(readable[done:done + len(chunk)])
        done += len(chunk)
    other_readable, other_encoded = _encoded_spans(3, Resource({"service.name": "worker"}), None)
    (two,) = encode_chunks(encoded[:5] + other_encoded + encoded[5:], max_bytes=10**7)
    assert two.origin is None
    assert encode_spans_fast(two) == encode_spans(readable[:5] + other_readable + readable[5:])


def test_a_batch_taken_all_encoded_weighs_what_its_spans_weigh(monkeypatch: pytest.MonkeyPatch) -> None:
    """The export thread takes a batch of encoded spans whole (loops in C); its weight is its spans'
    span_weight summed, large entries included (one of exactly SPAN_BYTES too), as a batch taken span
    by span (one not encoded among them) weighs; the rest stays queued, in order."""
    from otel_graph.export import pipeline
    from otel_graph.export.pipeline import ReliableSpanProcessor
    from otel_graph.export.span_batches import SPAN_BYTES, span_weight

    one_by_one: list[int] = []
    take_any = pipeline.take_any
    monkeypatch.setattr(pipeline, "take_any",
                        lambda queue, count: (one_by_one.append(count), take_any(queue, count))[1])
    sizes = [10, SPAN_BYTES - 1, SPAN_BYTES, 3 * SPAN_BYTES + 7, 0, 20]
    spans = [(bytes([i]) * size, 0) for i, size in enumerate(sizes)]
    readable = ReadableSpan(name="r", context=_context(1, 2), resource=RESOURCE, start_time=1, end_time=2)
    cases = [(spans, 4, False), (spans[:5], 3, False), (spans[:2], 2, False), (spans, 6, False),
             (spans[:1] + [readable] + spans[1:], 4, True)]
    for queued, limit, mixed in cases:
        processor = ReliableSpanProcessor(otlp_span_exporter(protocol="grpc"), max_queued=10_000, max_batch=limit,
                                          schedule_delay_s=60)
        assert processor.takes_encoded
        one_by_one.clear()
        try:
            with processor._cond:
                processor._queue.extend(queued)
                batch = processor._take_batch()
                assert batch == queued[:limit]
                assert processor._inflight_weight == sum(map(span_weight, batch))
                assert processor._inflight == len(batch)
                assert list(processor._queue) == queued[limit:]
                assert bool(one_by_one) is mixed  # taken whole unless one is not encoded
                processor._queue.clear()  # nothing for shutdown to try to deliver
                processor._inflight = 0
        finally:
            processor.shutdown()


@pytest.mark.usefixtures("no_stock_encoding")
def test_a_delivery_reader_gets_readable_spans(monkeypatch: pytest.MonkeyPatch) -> None:
    """A processor whose delivered spans are read back (a dask.distributed worker's ledger)
    is handed ReadableSpans, not encoded ones, from the moment the reader is set."""
    from otel_graph.export.pipeline import ReliableSpanProcessor
    from otel_graph.telemetry.spans import DirectEmitter

    delivered: list[Any] = []
    with OtlpReceiver() as receiver:
        _send_traces_to(receiver, "grpc", monkeypatch)
        provider = TracerProvider(resource=RESOURCE)
        processor = ReliableSpanProcessor(otlp_span_exporter(protocol="grpc"), max_queued=1000)
        provider.add_span_processor(processor)
        emitter = DirectEmitter(provider, SCOPE)
        try:
            assert processor.takes_encoded
            processor.on_delivered = delivered.extend
            assert not processor.takes_encoded
            emitter.emit(parent=NonRecordingSpan(_context(0xFEED, 0xBEEF)), name="inc", start_ns=1, end_ns=2,
                         attributes={"dask.task.prefix": "inc"})
            assert processor.force_flush(10_000)
        finally:
            provider.shutdown()
        assert [(s.name, dict(s.attributes)) for s in delivered] == [("inc", {"dask.task.prefix": "inc"})]
        assert [s["name"] for s in receiver.spans()] == ["inc"]


def test_a_long_lived_memo_keeps_no_long_strings() -> None:
    """An emitter's memo outlives requests: stack traces and messages, which rarely repeat,
    must not stay in it (1,300 distinct tracebacks once held 53 MB after their export)."""
    from otel_graph.export.otlp_spans import new_memo, span_entry

    memo = new_memo()
    status = Status(StatusCode.ERROR, "boom")
    for i in range(3):
        trace = f"Traceback {i}\n" + "  File x.py, line 1\n" * 500
        event = Event("exception", {"exception.stacktrace": trace, "exception.type": "ValueError"}, 5)
        span_entry(_context(1, i + 1), None, "failed", SpanKind.INTERNAL, 1, 2, {"dask.task.key": f"k-{i}",
                   "error.type": "ValueError", "long": "x" * 1000 + str(i)}, (event,), (), status, memo)
    remembered = [key[2] for key in memo.pairs]
    assert "ValueError" in remembered and "k-2" in remembered
    assert max(len(str(value)) for value in remembered) <= 64


def test_spans_queued_together_are_counted_one_by_one() -> None:
    """Encoded spans handed over together (a small compute's) are weighed, dropped past the
    queue's bound and counted undelivered after shutdown each on its own."""
    from otel_graph.export.pipeline import ReliableSpanProcessor

    exported = InMemorySpanExporter()
    processor = ReliableSpanProcessor(exported, max_queued=3, schedule_delay_s=60)
    spans = [(b"x" * 10, 0) for _ in range(5)]
    processor.on_end_encoded_many(spans[:2])
    processor.on_end_encoded_many(spans[2:])
    assert (len(processor._queue), processor.dropped, processor.undelivered) == (3, 2, 2)
    processor.shutdown()
    processor.on_end_encoded_many(spans[:2])
    assert processor.undelivered == 2 + 2


def test_spans_queued_together_weigh_what_each_weighs_alone() -> None:
    """A batch's weight (on_end_encoded_many adds it up in a loop of its own) is the sum of its
    spans' span_weight, large spans included, so the queue's bound holds whichever way they come."""
    from otel_graph.export.pipeline import ReliableSpanProcessor
    from otel_graph.export.span_batches import SPAN_BYTES, span_weight

    spans = [(b"x" * size, 0) for size in (10, SPAN_BYTES - 1, SPAN_BYTES, 3 * SPAN_BYTES + 7, 0)]
    together = ReliableSpanProcessor(InMemorySpanExporter(), max_queued=10_000, schedule_delay_s=60)
    alone = ReliableSpanProcessor(InMemorySpanExporter(), max_queued=10_000, schedule_delay_s=60)
    try:
        together.on_end_encoded_many(spans)
        for span in spans:
            alone.on_end_encoded(span)
        assert together._weight == alone._weight == sum(map(span_weight, spans)) == len(spans) + 1 + 3
    finally:
        together.shutdown()
        alone.shutdown()


@pytest.mark.parametrize("length", [0, 1, 99, 100, 105, 120, 126, 127, 128, 200, 16_400])
def test_a_keyed_string_is_the_generic_attribute_byte_for_byte(length: int) -> None:
    """The task key's short path writes the bytes the generic encoder writes, at every length
    where a varint grows a byte."""
    from otel_graph.export.otlp_spans import encoded_attribute, keyed_string, new_memo
    from otel_graph.export.otlp_wire import attribute_head

    for text in ("k" * length, "ü" * (length // 2)):
        for name in ("dask.task.key", "a" * 120):
            assert keyed_string(attribute_head(name), text) == encoded_attribute(name, text, new_memo())


@pytest.mark.parametrize("name", ["inc", "", "ünï", "x" * 300])
@pytest.mark.parametrize("times", [(10, 20), (0, 20), (10, 0), (None, None)])
@pytest.mark.parametrize("attribute_bytes", [0, 100, 16_300, 20_000])
def test_a_child_entry_is_the_span_entry_of_the_same_span(name, times, attribute_bytes) -> None:
    """child_entry writes a task span's fields itself (name, times, the entry's length): the
    same bytes as span_entry for the same span, memo warm or cold, and entries long enough for
    each length encoding (one byte, two, more)."""
    from otel_graph.export.otlp_spans import child_entry, encoded_attributes, new_memo, span_entry

    start, end = times
    attributes = {"dask.task.key": "k" * attribute_bytes} if attribute_bytes else {}
    for parent in (_context(0xFEED, 0xBEEF), SpanContext(0xFEED, 0xBEEF, is_remote=True, trace_flags=TraceFlags(1),
                                                          trace_state=TraceState([("vendor", "v")]))):
        child = SpanContext(parent.trace_id, 0x1234, is_remote=False, trace_flags=parent.trace_flags,
                            trace_state=parent.trace_state)
        expected = span_entry(child, parent, name, SpanKind.INTERNAL, start, end, attributes, (), (),
                              Status(StatusCode.UNSET), new_memo())
        memo = new_memo()
        for _ in range(2):  # the second time from the memo
            assert child_entry(parent, 0x1234, name, start, end, encoded_attributes(attributes, memo), memo) == expected
