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
lines are the same OTLP/JSON, and it encodes faster (31 against 52 us a span, measured
here on 2,048-span batches, 0.66b1), but it is a beta that brings a second beta
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
    from otel_graph.otlp_fast import encode_spans_fast

    return request_json(encode_spans_fast(spans))


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
