"""The test collector must be trustworthy before other tests lean on it.

These tests drive :class:`otlp_receiver.OtlpReceiver` with the stock SDK OTLP
exporters (gRPC and HTTP), as the package's own exporters will, and with raw
requests where a misbehaving client is the point (a short gRPC deadline, a
hand-compressed body).
"""

from __future__ import annotations

import gzip
import math
import threading
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetricExporter
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from otlp_receiver import HAVE_OPENSSL, OtlpReceiver, make_self_signed_cert

RESOURCE = Resource.create({"service.name": "otlp-receiver-test"})
TRANSPORTS = ["grpc", "http"]


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as r:
        yield r


@contextmanager
def shut_down_after(exporter: SpanExporter) -> Iterator[SpanExporter]:
    # Closes the gRPC channel or HTTP session, so no test leaks sockets or threads.
    try:
        yield exporter
    finally:
        exporter.shutdown()


def span_exporter(receiver: OtlpReceiver, transport: str, **options: Any) -> AbstractContextManager[SpanExporter]:
    """A stock SDK span exporter for ``transport``, pointed at ``receiver``."""
    if transport == "grpc":
        return shut_down_after(GrpcSpanExporter(endpoint=receiver.grpc_endpoint, insecure=True, **options))
    return shut_down_after(HttpSpanExporter(endpoint=receiver.http_endpoint + "/v1/traces", **options))


def finished_spans(name: str = "inc") -> Sequence[ReadableSpan]:
    """One finished span, for tests that call export() themselves to see its result."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=RESOURCE)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    provider.get_tracer("test").start_span(name).end()
    provider.shutdown()
    return memory.get_finished_spans()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_span_exporter_delivers_spans(receiver: OtlpReceiver, transport: str) -> None:
    with span_exporter(receiver, transport) as exporter:
        provider = TracerProvider(resource=RESOURCE)
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        tracer = provider.get_tracer("otel_graph.test", "1.2.3")
        with tracer.start_as_current_span("graph"):
            with tracer.start_as_current_span("inc", kind=SpanKind.INTERNAL) as span:
                span.set_attributes({"dask.key": "('inc-1', 0)", "dims": [2, 3], "ok": True, "ratio": 0.5})
                span.add_event("spill", {"bytes": 1024})
                span.set_status(StatusCode.ERROR, "boom")
        provider.shutdown()

    spans = {s["name"]: s for s in receiver.spans()}
    graph, inc = spans["graph"], spans["inc"]
    assert graph["parent_span_id"] == ""
    assert inc["parent_span_id"] == graph["span_id"] != ""
    assert inc["trace_id"] == graph["trace_id"] and len(inc["trace_id"]) == 32
    assert inc["attributes"] == {"dask.key": "('inc-1', 0)", "dims": [2, 3], "ok": True, "ratio": 0.5}
    assert inc["events"] == [{"name": "spill", "time_ns": inc["events"][0]["time_ns"], "attributes": {"bytes": 1024}}]
    assert (inc["status_code"], inc["status_message"]) == (2, "boom")
    assert inc["kind"] == 1  # SPAN_KIND_INTERNAL on the wire
    assert inc["start_ns"] <= inc["end_ns"]
    assert inc["resource"]["service.name"] == "otlp-receiver-test"
    assert (inc["scope"], inc["transport"]) == ("otel_graph.test", transport)
    assert receiver.requests_answered == 2 and receiver.requests_failed == 0


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_metric_exporter_delivers_points(receiver: OtlpReceiver, transport: str) -> None:
    if transport == "grpc":
        exporter: Any = GrpcMetricExporter(endpoint=receiver.grpc_endpoint, insecure=True)
    else:
        exporter = HttpMetricExporter(endpoint=receiver.http_endpoint + "/v1/metrics")
    # An infinite interval means no background thread: only force_flush exports.
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=math.inf)
    provider = MeterProvider(metric_readers=[reader], resource=RESOURCE)
    meter = provider.get_meter("otel_graph.test")
    tasks = meter.create_counter("dask.tasks", unit="{task}", description="tasks run")
    duration = meter.create_histogram("dask.task.duration", unit="s")
    tasks.add(3, {"dask.prefix": "inc"})
    tasks.add(2, {"dask.prefix": "inc"})
    duration.record(0.1, {"dask.prefix": "inc"})
    duration.record(2.5, {"dask.prefix": "inc"})
    assert provider.force_flush(timeout_millis=5_000)
    provider.shutdown()

    points = {m["name"]: m for m in receiver.metrics()}
    counter, histogram = points["dask.tasks"], points["dask.task.duration"]
    assert (counter["type"], counter["value"], counter["monotonic"]) == ("sum", 5, True)
    assert (counter["unit"], counter["description"]) == ("{task}", "tasks run")
    assert counter["temporality"] == 2  # cumulative, the SDK default
    assert counter["attributes"] == {"dask.prefix": "inc"}
    assert histogram["type"] == "histogram" and histogram["unit"] == "s"
    assert (histogram["count"], histogram["min"], histogram["max"]) == (2, 0.1, 2.5)
    assert histogram["sum"] == pytest.approx(2.6)
    assert sum(histogram["bucket_counts"]) == 2
    assert len(histogram["bucket_counts"]) == len(histogram["explicit_bounds"]) + 1
    assert counter["resource"]["service.name"] == "otlp-receiver-test"
    assert (counter["scope"], counter["transport"]) == ("otel_graph.test", transport)
    assert 0 < counter["start_ns"] <= counter["time_ns"]


@pytest.mark.parametrize("compression", [Compression.Gzip, Compression.Deflate])
def test_http_compressed_bodies_arrive(receiver: OtlpReceiver, compression: Compression) -> None:
    with span_exporter(receiver, "http", compression=compression) as exporter:
        assert exporter.export(finished_spans()) is SpanExportResult.SUCCESS
    assert [s["name"] for s in receiver.spans()] == ["inc"]
    assert receiver.headers[0]["content-encoding"] == compression.value


@pytest.mark.parametrize(
    ("encoding", "compress"),
    [
        ("gzip", gzip.compress),
        ("deflate", zlib.compress),
        ("deflate", lambda body: zlib.compress(body)[2:-4]),  # raw deflate, no zlib wrapper
    ],
)
def test_http_raw_compressed_post(receiver: OtlpReceiver, encoding: str, compress: Any) -> None:
    request = ExportTraceServiceRequest()
    request.resource_spans.add().scope_spans.add().spans.add(name="raw")
    status = post(receiver, "/v1/traces", compress(request.SerializeToString()), encoding=encoding)
    assert status == 200
    assert [s["name"] for s in receiver.spans()] == ["raw"]


def test_http_rejects_what_it_cannot_decode(receiver: OtlpReceiver) -> None:
    assert post(receiver, "/v1/traces", b"not gzip", encoding="gzip") == 400
    assert post(receiver, "/v1/nope", b"") == 404
    assert post(receiver, "/v1/traces", b"{}", content_type="application/json") == 415
    assert receiver.requests() == [] and receiver.requests_answered == 0


def post(
    receiver: OtlpReceiver, path: str, body: bytes, *, encoding: str = "", content_type: str = "application/x-protobuf"
) -> int:
    headers = {"Content-Type": content_type, **({"Content-Encoding": encoding} if encoding else {})}
    request = urllib.request.Request(receiver.http_endpoint + path, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as error:
        error.close()
        return error.code


def test_logs_are_received_over_grpc_and_http(receiver: OtlpReceiver) -> None:
    request = ExportLogsServiceRequest()
    resource_logs = request.resource_logs.add()
    resource_logs.resource.attributes.add(key="service.name").value.string_value = "svc"
    record = resource_logs.scope_logs.add().log_records.add(severity_text="WARN", severity_number=13)
    record.body.string_value = "spilled"
    assert post(receiver, "/v1/logs", request.SerializeToString()) == 200
    with grpc.insecure_channel(receiver.grpc_endpoint.removeprefix("http://")) as channel:
        export = channel.unary_unary(
            "/opentelemetry.proto.collector.logs.v1.LogsService/Export",
            request_serializer=ExportLogsServiceRequest.SerializeToString,
            response_deserializer=lambda b: b,
        )
        export(request, timeout=5)
    logs = receiver.logs()
    assert [(r["body"], r["severity_text"], r["transport"]) for r in logs] == [
        ("spilled", "WARN", "http"),
        ("spilled", "WARN", "grpc"),
    ]
    assert logs[0]["resource"] == {"service.name": "svc"}


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_headers_are_recorded(receiver: OtlpReceiver, transport: str) -> None:
    with span_exporter(receiver, transport, headers={"authorization": "Bearer x"}) as exporter:
        assert exporter.export(finished_spans()) is SpanExportResult.SUCCESS
    (headers,) = receiver.headers
    assert headers["authorization"] == "Bearer x"
    assert all(name == name.lower() for name in headers)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_fail_refuses_and_stores_nothing(receiver: OtlpReceiver, transport: str) -> None:
    receiver.fail = True
    # A 0.5 s timeout is shorter than the exporters' first retry backoff (0.8 s or more).
    with span_exporter(receiver, transport, timeout=0.5) as exporter:
        assert exporter.export(finished_spans()) is SpanExportResult.FAILURE
        assert receiver.requests_failed >= 1
        assert receiver.requests() == [] and receiver.requests_answered == 0

        receiver.fail = False  # the collector recovers at run time
        assert exporter.export(finished_spans("after")) is SpanExportResult.SUCCESS
    assert [s["name"] for s in receiver.spans()] == ["after"]


def test_hang_times_out_a_grpc_call_and_stop_is_prompt() -> None:
    receiver = OtlpReceiver(hang=True).start()
    channel = grpc.insecure_channel(receiver.grpc_endpoint.removeprefix("http://"))
    try:
        stub = TraceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as raised:
            stub.Export(ExportTraceServiceRequest(), timeout=0.5)
        assert raised.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        # The server lets go of a request whose client gave up.
        assert receiver.wait_for(lambda r: r.requests_pending == 0, timeout_s=5)

        # Leave one gRPC and one HTTP request hung, then stop.
        call = stub.Export.future(ExportTraceServiceRequest(), timeout=30)
        http_status: list[int | str] = []
        http = threading.Thread(target=lambda: http_status.append(post_or_error(receiver)))
        http.start()
        assert receiver.wait_for(lambda r: r.requests_pending == 2, timeout_s=5)

        started = time.monotonic()
        receiver.stop()
        assert time.monotonic() - started < 2.0
        assert receiver.requests_pending == 0  # both hung handlers were let go
        assert call.exception(timeout=5) is not None
        http.join(timeout=5)
        assert http_status and http_status[0] != 200
        assert receiver.requests() == [] and receiver.requests_answered == 0
    finally:
        channel.close()
        receiver.stop()


def test_stop_ends_idle_keep_alive_connections_and_threads() -> None:
    receiver = OtlpReceiver().start()
    # The exporters stay open across stop(): their HTTP session keeps an idle
    # keep-alive connection whose server thread blocks in recv().
    with span_exporter(receiver, "http") as http, span_exporter(receiver, "grpc") as grpc_exporter:
        assert http.export(finished_spans()) is SpanExportResult.SUCCESS
        assert grpc_exporter.export(finished_spans()) is SpanExportResult.SUCCESS
        receiver.stop()
        alive = [t.name for t in threading.enumerate() if t.name.startswith("otlp-receiver")]
        assert alive == []


def post_or_error(receiver: OtlpReceiver) -> int | str:
    try:
        return post(receiver, "/v1/traces", ExportTraceServiceRequest().SerializeToString())
    except OSError as error:  # the connection closed under a hung request
        return type(error).__name__


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_hang_released_at_run_time_delivers(receiver: OtlpReceiver, transport: str) -> None:
    receiver.hang = True
    with span_exporter(receiver, transport, timeout=10) as exporter:
        result: list[SpanExportResult] = []
        exporting = threading.Thread(target=lambda: result.append(exporter.export(finished_spans())))
        exporting.start()
        assert receiver.wait_for(lambda r: r.requests_pending == 1, timeout_s=5)
        assert not receiver.wait_for(lambda r: len(r.spans()) > 0, timeout_s=0.2)
        receiver.hang = False
        exporting.join(timeout=5)
    assert result == [SpanExportResult.SUCCESS]
    assert [s["name"] for s in receiver.spans()] == ["inc"]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_delay_slows_every_answer(transport: str) -> None:
    with OtlpReceiver(delay_s=0.4) as receiver, span_exporter(receiver, transport, timeout=10) as exporter:
        started = time.monotonic()
        assert exporter.export(finished_spans()) is SpanExportResult.SUCCESS
        assert time.monotonic() - started >= 0.4

        receiver.delay_s = 0.0
        started = time.monotonic()
        assert exporter.export(finished_spans()) is SpanExportResult.SUCCESS
        assert time.monotonic() - started < 0.4
    assert receiver.requests_answered == 2


def test_wait_for_wakes_on_arrival_and_times_out(receiver: OtlpReceiver) -> None:
    assert not receiver.wait_for(lambda r: len(r.spans()) > 0, timeout_s=0.1)
    with span_exporter(receiver, "grpc") as exporter:
        exporting = threading.Thread(target=exporter.export, args=(finished_spans(),))
        exporting.start()
        assert receiver.wait_for(lambda r: len(r.spans()) == 1, timeout_s=5)
        exporting.join(timeout=5)
    receiver.clear()
    assert receiver.spans() == [] and receiver.requests_answered == 0


@pytest.mark.skipif(not HAVE_OPENSSL, reason="needs the openssl command to make a certificate")
def test_tls_delivers_over_both_transports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # requests lets these variables override a session's `verify`, which is
    # where the HTTP exporter puts certificate_file (psf/requests#3829).
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    cert, key = make_self_signed_cert(tmp_path)
    with OtlpReceiver(tls_cert_file=cert, tls_key_file=key) as receiver:
        assert receiver.grpc_endpoint.startswith("https://")
        assert receiver.http_endpoint.startswith("https://")
        credentials = grpc.ssl_channel_credentials(cert.read_bytes())
        grpc_exporter = GrpcSpanExporter(endpoint=receiver.grpc_endpoint, credentials=credentials, timeout=2)
        with shut_down_after(grpc_exporter) as exporter:
            assert exporter.export(finished_spans("over-grpc")) is SpanExportResult.SUCCESS
        url = receiver.http_endpoint + "/v1/traces"
        with shut_down_after(HttpSpanExporter(endpoint=url, certificate_file=str(cert), timeout=2)) as exporter:
            assert exporter.export(finished_spans("over-http")) is SpanExportResult.SUCCESS
    assert sorted(s["name"] for s in receiver.spans()) == ["over-grpc", "over-http"]
