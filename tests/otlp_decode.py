"""Decode OTLP export requests into plain Python data that tests can assert on.

An OTLP request nests three levels deep: resource, then instrumentation scope,
then the records. An assertion like "the task span has parent X and attribute
Y" should not need three loops and protobuf accessors, so each function here
walks one request and yields one flat ``dict`` per record (a span, a metric
data point or a log record). Each dict carries its own copy of the resource
attributes and the scope name.

Attribute values (``AnyValue``) become the Python values the SDK was given:
``str``, ``bool``, ``int``, ``float``, ``bytes``, arrays become ``list`` and
key-value lists become ``dict``. Ids become lowercase hex strings, and an
absent parent id becomes ``""``, so ``span["parent_span_id"] ==
parent["span_id"]`` reads the same as in the SDK's own tests. A span's W3C
trace state is its header string (``"vendor=on"``; ``""`` for none).

``decompress_body`` undoes an OTLP/HTTP ``Content-Encoding`` before parsing.

Examples
--------
>>> from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
...     ExportTraceServiceRequest)
>>> request = ExportTraceServiceRequest()
>>> span = request.resource_spans.add().scope_spans.add().spans.add()
>>> span.name = "inc"
>>> span.span_id = bytes.fromhex("00000000000000ab")
>>> [(s["name"], s["span_id"], s["parent_span_id"]) for s in flatten_spans(request, transport="grpc")]
[('inc', '00000000000000ab', '')]
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterable, Iterator
from typing import Any

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

__all__ = [
    "decode_any",
    "decode_attributes",
    "decompress_body",
    "flatten_logs",
    "flatten_metrics",
    "flatten_spans",
]


def decompress_body(body: bytes, content_encoding: str) -> bytes:
    """Undo an OTLP/HTTP ``Content-Encoding`` (none, gzip or deflate); ValueError otherwise."""
    encoding = content_encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding == "gzip":
        return gzip.decompress(body)
    if encoding == "deflate":
        # The SDK sends zlib-wrapped data, as HTTP specifies; some clients send raw deflate.
        try:
            return zlib.decompress(body)
        except zlib.error:
            return zlib.decompress(body, -zlib.MAX_WBITS)
    raise ValueError(f"unsupported Content-Encoding {encoding!r}")


def decode_any(value: AnyValue) -> Any:
    """Turn an ``AnyValue`` into the Python value it carries (``None`` when empty)."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [decode_any(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return decode_attributes(value.kvlist_value.values)
    # The scalar cases (string, bool, int, double, bytes, strindex) map one to one.
    return getattr(value, kind)


def decode_attributes(attributes: Iterable[KeyValue]) -> dict[str, Any]:
    """Turn repeated ``KeyValue`` into a ``dict``; a repeated key keeps its last value."""
    return {kv.key: decode_any(kv.value) for kv in attributes}


def flatten_spans(request: ExportTraceServiceRequest, *, transport: str) -> Iterator[dict[str, Any]]:
    """Yield one dict per span in ``request``."""
    for resource_spans in request.resource_spans:
        resource = decode_attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                yield {
                    "name": span.name,
                    "trace_id": span.trace_id.hex(),
                    "span_id": span.span_id.hex(),
                    "parent_span_id": span.parent_span_id.hex(),
                    "trace_state": span.trace_state,
                    "kind": int(span.kind),
                    "start_ns": span.start_time_unix_nano,
                    "end_ns": span.end_time_unix_nano,
                    "attributes": decode_attributes(span.attributes),
                    "status_code": int(span.status.code),
                    "status_message": span.status.message,
                    "events": [
                        {
                            "name": event.name,
                            "time_ns": event.time_unix_nano,
                            "attributes": decode_attributes(event.attributes),
                        }
                        for event in span.events
                    ],
                    "links": [
                        {
                            "trace_id": link.trace_id.hex(),
                            "span_id": link.span_id.hex(),
                            "attributes": decode_attributes(link.attributes),
                        }
                        for link in span.links
                    ],
                    "resource": resource,
                    "scope": scope_spans.scope.name,
                    "transport": transport,
                }


def _optional(point: Any, field: str) -> float | None:
    # sum/min/max are proto3 `optional` in histogram points: 0.0 and "absent" differ.
    return getattr(point, field) if point.HasField(field) else None


def _point(metric_type: str, point: Any) -> dict[str, Any]:
    """The data-point part of a flattened metric; keys not used by the type are None."""
    flat: dict[str, Any] = {
        "attributes": decode_attributes(point.attributes),
        "time_ns": point.time_unix_nano,
        "start_ns": point.start_time_unix_nano,
        "value": None,
        "count": None,
        "sum": None,
        "bucket_counts": None,
        "explicit_bounds": None,
        "min": None,
        "max": None,
    }
    if metric_type in ("sum", "gauge"):
        kind = point.WhichOneof("value")
        flat["value"] = getattr(point, kind) if kind else None
    elif metric_type == "summary":
        flat.update(count=point.count, sum=point.sum)
        flat["quantiles"] = {q.quantile: q.value for q in point.quantile_values}
    else:
        flat.update(count=point.count, sum=_optional(point, "sum"))
        flat.update(min=_optional(point, "min"), max=_optional(point, "max"))
        if metric_type == "histogram":
            flat["bucket_counts"] = list(point.bucket_counts)
            flat["explicit_bounds"] = list(point.explicit_bounds)
        else:
            flat.update(scale=point.scale, zero_count=point.zero_count)
            flat["positive"] = {"offset": point.positive.offset, "bucket_counts": list(point.positive.bucket_counts)}
            flat["negative"] = {"offset": point.negative.offset, "bucket_counts": list(point.negative.bucket_counts)}
    return flat


def flatten_metrics(request: ExportMetricsServiceRequest, *, transport: str) -> Iterator[dict[str, Any]]:
    """Yield one dict per metric data point in ``request``.

    ``type`` is the name of the ``Metric.data`` oneof: ``"sum"``, ``"gauge"``,
    ``"histogram"``, ``"exponential_histogram"`` or ``"summary"``. ``monotonic``
    is None except for sums, and ``temporality`` is None for gauges and
    summaries (1 = delta, 2 = cumulative).
    """
    for resource_metrics in request.resource_metrics:
        resource = decode_attributes(resource_metrics.resource.attributes)
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                metric_type = metric.WhichOneof("data")
                if metric_type is None:
                    continue
                data = getattr(metric, metric_type)
                common = {
                    "name": metric.name,
                    "unit": metric.unit,
                    "description": metric.description,
                    "type": metric_type,
                    "monotonic": data.is_monotonic if metric_type == "sum" else None,
                    "temporality": (
                        int(data.aggregation_temporality) if hasattr(data, "aggregation_temporality") else None
                    ),
                    "resource": resource,
                    "scope": scope_metrics.scope.name,
                    "transport": transport,
                }
                for point in data.data_points:
                    yield {**common, **_point(metric_type, point)}


def flatten_logs(request: ExportLogsServiceRequest, *, transport: str) -> Iterator[dict[str, Any]]:
    """Yield one dict per log record in ``request``."""
    for resource_logs in request.resource_logs:
        resource = decode_attributes(resource_logs.resource.attributes)
        for scope_logs in resource_logs.scope_logs:
            for record in scope_logs.log_records:
                yield {
                    "body": decode_any(record.body),
                    "severity_number": int(record.severity_number),
                    "severity_text": record.severity_text,
                    "event_name": record.event_name,
                    "attributes": decode_attributes(record.attributes),
                    "trace_id": record.trace_id.hex(),
                    "span_id": record.span_id.hex(),
                    "time_ns": record.time_unix_nano,
                    "observed_time_ns": record.observed_time_unix_nano,
                    "resource": resource,
                    "scope": scope_logs.scope.name,
                    "transport": transport,
                }
