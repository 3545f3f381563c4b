"""OTLP JSON lines files: where telemetry goes when there is no collector.

``OTEL_TRACES_EXPORTER=otlp_file`` and ``OTEL_METRICS_EXPORTER=otlp_file`` (what
``otel-graph demo`` uses when nothing answers on the OTLP port) write
``traces.jsonl`` and ``metrics.jsonl`` under ``OTEL_GRAPH_FILE_DIR``. Each line is one
export request (``ExportTraceServiceRequest`` / ``ExportMetricsServiceRequest``) in the
OTLP/JSON encoding: the format of the collector's ``file`` exporter, which its
``otlpjsonfile`` receiver replays, and which ``otel-graph report`` reads. As the
OTLP/JSON spec asks (and unlike protobuf's generic JSON mapping), trace and span ids
are hex strings and enums are numbers.

Files are created readable by their owner only: telemetry describes the user's work.

Why not the upstream ``opentelemetry-exporter-otlp-json-file`` (registered as
``otlp_json_file``, which ``OTEL_TRACES_EXPORTER`` accepts where it is installed): its
lines are the same OTLP/JSON, and it encoded faster than this module's former path
through protobuf's JSON mapping (31 against 52 us a span, 2,048-span batches, 0.66b1;
the direct writer below takes about 19 us), but it is a beta that brings a second beta
(``opentelemetry-proto-json``), it creates its files with the process's umask (0644 here:
readable by every user of an HPC node), and it writes through a buffered text stream,
where this module puts each line in one ``write`` to an ``O_APPEND`` file so that a
cluster's processes can share one. Worth taking once it is stable and can be told the
file mode.

>>> from opentelemetry.sdk.trace import ReadableSpan
>>> from opentelemetry.trace import SpanContext
>>> line = span_request_json([ReadableSpan("inc", context=SpanContext(0xAB, 0xCD, is_remote=False))])
>>> import json; span = json.loads(line)["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
>>> span["traceId"], span["spanId"], span["name"]
('000000000000000000000000000000ab', '00000000000000cd', 'inc')
"""

from __future__ import annotations

import base64
import json
import math
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

__all__ = ["JsonLinesFile", "OtlpJsonMetricExporter", "OtlpJsonSpanExporter", "span_request_json"]

_ID_FIELDS = ("traceId", "spanId", "parentSpanId")


def _hex_ids(node: Any) -> None:
    """protobuf's JSON mapping writes bytes as base64; OTLP/JSON wants ids as hex."""
    if isinstance(node, dict):
        for name, value in node.items():
            if name in _ID_FIELDS and isinstance(value, str):
                node[name] = base64.b64decode(value).hex()
            else:
                _hex_ids(value)
    elif isinstance(node, list):
        for item in node:
            _hex_ids(item)


def request_json(request: Message) -> str:
    """One OTLP/JSON line for an export request."""
    body = MessageToDict(request, use_integers_for_enums=True)
    _hex_ids(body)
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False)


def span_request_json(spans: Sequence[ReadableSpan]) -> str:
    """One OTLP/JSON line for ``spans``: written straight from the spans, as protobuf's JSON
    mapping of the stock request would write it (19 against 64 us a task span: under a
    dask test suite's 10^4 spans a second, that mapping was most of otel_graph's cost).
    A span holding a value that writer leaves alone (bytes, None, maps, a link, a
    subclass...) goes through the mapping on its own; a resource or scope holding one
    sends the whole request through it."""
    try:
        return json.dumps(_spans_request(spans), separators=(",", ":"), ensure_ascii=False)
    except _Unusual:
        from otel_graph.export.otlp_fast import encode_spans_fast

        return request_json(encode_spans_fast(spans))


class _Unusual(Exception):
    """A value :func:`_spans_request` leaves to protobuf's JSON mapping."""


# The mapping's output, field by field: int64 as strings, enums as numbers, fields at their
# default value left out, keys in field-number order (tests/test_otlp_json.py compares).
def _spans_request(spans: Sequence[ReadableSpan]) -> dict[str, Any]:
    from otel_graph.export.otlp_fast import group_spans

    out = []
    for resource, scopes in group_spans(spans).items():
        attributes = _attributes(resource.attributes)
        body: dict[str, Any] = {"resource": {"attributes": attributes} if attributes else {}, "scopeSpans": [
            _scope_spans(scope, [spans[index] for index in members]) for scope, members in scopes.items()]}
        if resource.schema_url:
            body["schemaUrl"] = _text(resource.schema_url)
        out.append(body)
    return {"resourceSpans": out} if out else {}


def _scope_spans(scope: Any, spans: list[ReadableSpan]) -> dict[str, Any]:
    head: dict[str, Any] = {}
    if scope is not None:
        if scope.name:
            head["name"] = _text(scope.name)
        if scope.version:
            head["version"] = _text(scope.version)
        attributes = _attributes(scope.attributes)
        if attributes:
            head["attributes"] = attributes
    body = {"scope": head, "spans": [_span_or_mapped(span) for span in spans]}
    if scope is not None and scope.schema_url:
        body["schemaUrl"] = _text(scope.schema_url)
    return body


def _span_or_mapped(span: ReadableSpan) -> dict[str, Any]:
    try:
        return _span(span)
    except _Unusual:  # this span alone through the mapping: its encoding does not depend on the others
        from otel_graph.export.otlp_fast import encode_spans_fast

        body = MessageToDict(encode_spans_fast([span]), use_integers_for_enums=True)
        _hex_ids(body)
        return body["resourceSpans"][0]["scopeSpans"][0]["spans"][0]


def _span(span: ReadableSpan) -> dict[str, Any]:
    context, parent = span.get_span_context(), span.parent
    assert context is not None  # every span the SDK made has one; the type allows None
    out: dict[str, Any] = {"traceId": f"{_unsigned(context.trace_id, 128):032x}",
                           "spanId": f"{_unsigned(context.span_id, 64):016x}"}
    if context.trace_state:
        out["traceState"] = ",".join([f"{k}={v}" for k, v in context.trace_state.items()])
    if parent:
        out["parentSpanId"] = f"{_unsigned(parent.span_id, 64):016x}"
    if span.name:
        out["name"] = _text(span.name)
    out["kind"] = span.kind.value + 1  # SpanKind INTERNAL (0) is OTLP's SPAN_KIND_INTERNAL (1), and so on
    if span.start_time:
        out["startTimeUnixNano"] = str(_unsigned(span.start_time, 64))
    if span.end_time:
        out["endTimeUnixNano"] = str(_unsigned(span.end_time, 64))
    _put_attributes(out, span.attributes, span.dropped_attributes)
    if span.events:
        out["events"] = [_event(event) for event in span.events]
    if span.dropped_events:
        out["droppedEventsCount"] = span.dropped_events
    if span.links:
        raise _Unusual  # rare in otel_graph's spans: the mapping writes them
    if span.dropped_links:
        out["droppedLinksCount"] = span.dropped_links
    status = span.status
    if status is not None:
        written: dict[str, Any] = {}
        if status.description:
            written["message"] = _text(status.description)
        if status.status_code.value:
            written["code"] = status.status_code.value
        out["status"] = written
    out["flags"] = 0x300 if parent and parent.is_remote else 0x100  # has-is-remote, and is-remote
    return out


def _event(event: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if event.timestamp:
        out["timeUnixNano"] = str(_unsigned(event.timestamp, 64))
    if event.name:
        out["name"] = _text(event.name)
    _put_attributes(out, event.attributes, event.dropped_attributes)
    return out


def _put_attributes(out: dict[str, Any], attributes: Any, dropped: int) -> None:
    written = _attributes(attributes)
    if written:
        out["attributes"] = written
    if dropped:
        out["droppedAttributesCount"] = dropped


def _attributes(attributes: Any) -> list[dict[str, Any]] | None:
    if not attributes:
        return None
    out = []
    for key, value in attributes.items():
        if type(key) is not str or not key:
            raise _Unusual
        out.append({"key": _text(key), "value": _value(value)})
    return out


def _value(value: Any) -> dict[str, Any]:
    kind = type(value)
    if kind is str:
        return {"stringValue": _text(value)}
    if kind is bool:
        return {"boolValue": value}
    if kind is int and -(2**63) <= value < 2**63:
        return {"intValue": str(value)}
    if kind is float and math.isfinite(value):
        return {"doubleValue": value}
    if kind is tuple or kind is list:
        return {"arrayValue": {"values": [_value(item) for item in value]} if value else {}}
    raise _Unusual


def _unsigned(number: Any, bits: int) -> int:
    """An id or a time as the encoder takes it: a plain int of ``bits`` bits at most."""
    if type(number) is not int or not 0 <= number < 1 << bits:
        raise _Unusual  # the mapping's path fails on it, or writes it its own way (True: 1)
    return number


def _text(text: Any) -> str:
    if type(text) is not str:
        raise _Unusual
    try:
        text.encode()
    except UnicodeEncodeError:  # a lone surrogate: the mapping's path logs and leaves it out
        raise _Unusual from None
    return text


class JsonLinesFile:
    """An append-only file of lines, created with owner-only permissions.

    Safe across threads and processes (a cluster's workers inherit the same directory):
    each line goes out in one ``write`` to a file opened ``O_APPEND``, which the kernel
    places whole at the end, so lines from different processes never interleave.
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.path = path
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._lock = threading.Lock()

    def write(self, line: str) -> None:
        data = (line + "\n").encode("utf-8")
        with self._lock:
            if self._fd is None:
                raise ValueError(f"{self.path} is closed")
            written = os.write(self._fd, data)
            if written != len(data):  # only on a full disk: the line is cut, say so
                raise OSError(f"short write to {self.path}: {written} of {len(data)} bytes")

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


class OtlpJsonSpanExporter(SpanExporter):
    def __init__(self, path: Path) -> None:
        self._file = JsonLinesFile(path)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            self._file.write(span_request_json(spans))
        except (OSError, ValueError):  # a full disk or a closed file: counted as undelivered
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self._file.close()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


class OtlpJsonMetricExporter(MetricExporter):
    def __init__(self, path: Path) -> None:
        super().__init__(preferred_temporality={})  # cumulative, the SDK's default, for every kind
        self._file = JsonLinesFile(path)

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics

        try:
            self._file.write(request_json(encode_metrics(metrics_data)))
        except (OSError, ValueError):
            return MetricExportResult.FAILURE
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._file.close()
