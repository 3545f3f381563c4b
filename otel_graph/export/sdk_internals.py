"""Every private part of the OpenTelemetry SDK and its stock exporters that otel_graph
uses, in one module, each checked before it is used.

otel_graph leans on a few internals, for speed and for an exit that a hung collector
cannot hold. Each is checked when first needed: present, and a method taking the
arguments it is called with. Where a release changed one, otel_graph takes the stock
path instead, and says so once (:func:`_changed`), never exporting wrongly:

===========================================  ===========================================  ==========================
private part                                 what otel_graph does with it                 without it
===========================================  ===========================================  ==========================
``TracerProvider._active_span_processor``    hands finished task spans to the processors  spans through
                                             (``telemetry.spans.DirectEmitter``)          ``Tracer.start_span``
its ``_span_processors``                     tells otel_graph's processors from others    the tracker's thread
                                             (small computes drained inline)              drains every compute
``Tracer._is_enabled``                       a disabled tracer's computes take            (none: no configurator,
                                             ``start_span`` (``telemetry.compute_span``)  every tracer enabled)
``ParentBased``'s delegates (``_root``...)   the default sampler's decision for a         the sampler is asked
                                             compute's root span, without asking it
gRPC ``OTLPSpanExporter._translate_data``    encodes with ``export.otlp_fast``            the stock encoder
its ``_stub``, ``_client``, ``_channel``     sends those bytes unparsed                   parsed, then sent
HTTP ``OTLPSpanExporter._shutdown``,         sends the fast encoding's bytes              the stock exporter
``_metrics``, ``_max_request_size``,         (:class:`_FastHttpSpanExporter`)
``_client``; ``http._common`` helpers
gRPC ``_shutdown_in_progress``, HTTP         cuts retry waits at exit                     exit waits out the
``_client._shutdown_event``                  (:func:`stop_retry_waits`)                   exporter's backoff
``MetricExporter._preferred_temporality``,   a counting wrapper keeps the wrapped         the SDK's defaults
``_preferred_aggregation``                   exporter's preferences
``PrometheusMetricReader._receive_metrics``  adds the pre-aggregated histograms           no task or compute
                                                                                          histograms scraped
===========================================  ===========================================  ==========================

Checked against the SDK and exporters 1.45.2 (``make test-latest`` runs the suite on the
newest releases).
"""

from __future__ import annotations

import inspect
import logging
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.semconv.attributes.http_attributes import HTTP_RESPONSE_STATUS_CODE

from otel_graph.export.otlp_fast import _encode_request, encode_spans_fast

logger = logging.getLogger("otel_graph")
_logger = logging.getLogger("opentelemetry.exporter.otlp.proto.http.trace_exporter")  # as the stock one logs
_SAID: set[str] = set()


def _changed(part: str, instead: str) -> None:
    """Say once per process that a release changed ``part``, and what otel_graph does instead."""
    if part in _SAID:
        return
    _SAID.add(part)
    logger.warning("otel_graph: the installed OpenTelemetry SDK changed %s; %s", part, instead)


def _takes(function: Any, *args: Any) -> bool:
    """Whether ``function`` can be called with ``args`` (its signature, not a call)."""
    try:
        inspect.signature(function).bind(*args)
    except (TypeError, ValueError):
        return False
    return True


# -- the tracer provider --------------------------------------------------------------------
def span_processor(provider: Any) -> Any:
    """The processor a provider hands ended spans to; None (said once) where it has none."""
    processor = getattr(provider, "_active_span_processor", None)
    if processor is not None and callable(getattr(processor, "on_end", None)) and _takes(processor.on_end, None):
        return processor
    _changed("TracerProvider._active_span_processor", "task spans go through Tracer.start_span (slower)")
    return None


def processors_behind(processor: Any) -> tuple[Any, ...] | None:
    """The span processors the provider's processor (:func:`span_processor`'s) hands spans to;
    None (said once) where a release changed how it keeps them."""
    found = getattr(processor, "_span_processors", None)
    if isinstance(found, tuple):
        return found
    _changed("the provider's list of span processors", "small computes are drained by the tracker's thread")
    return None


def tracer_enabled(tracer: Any) -> Callable[[], bool]:
    """What tells whether the SDK's tracer configurator leaves ``tracer`` enabled (``start_span``
    makes recording spans): the tracer's own check, asked per compute; always True where the
    SDK has no configurator."""
    enabled = getattr(tracer, "_is_enabled", None)
    return enabled if callable(enabled) else _always


def _always() -> bool:
    return True


_DEFAULT_DELEGATES = ("_root", "_remote_parent_sampled", "_remote_parent_not_sampled", "_local_parent_sampled",
                      "_local_parent_not_sampled")


def follows_parent(sampler: Any) -> bool:
    """Whether ``sampler`` is the SDK's default, ``ParentBased(ALWAYS_ON)`` with the default
    delegates: a span is then sampled exactly when its parent is, or when it has none, and
    takes its parent's trace state. False for any other sampler (it is then asked)."""
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBased

    if type(sampler) is not ParentBased:
        return False
    delegates = [getattr(sampler, name, None) for name in _DEFAULT_DELEGATES]
    defaults = (ALWAYS_ON, ALWAYS_ON, ALWAYS_OFF, ALWAYS_ON, ALWAYS_OFF)
    return all(a is b for a, b in zip(delegates, defaults, strict=False))


# -- metric exporters -----------------------------------------------------------------------
def preferences(exporter: Any) -> tuple[Any, Any]:
    """(temporality, aggregation) preferences a metric exporter was made with."""
    if hasattr(exporter, "_preferred_temporality") and hasattr(exporter, "_preferred_aggregation"):
        return exporter._preferred_temporality, exporter._preferred_aggregation
    _changed("MetricExporter._preferred_temporality", "counted metrics use the SDK's default temporality")
    return None, None


def prometheus_reader(PrometheusMetricReader: type, merge: Any) -> Any:  # noqa: N803 (a class)
    """A Prometheus reader that passes what it collects through ``merge`` first (adds the
    pre-aggregated histograms); the plain one where that cannot be done."""
    receive = getattr(PrometheusMetricReader, "_receive_metrics", None)
    if receive is None or not _takes(receive, None, None, 10_000):
        _changed("PrometheusMetricReader._receive_metrics",
                 "Prometheus scrapes get no dask.task.duration or dask.compute.duration")
        return PrometheusMetricReader()

    class MergingPrometheusReader(PrometheusMetricReader):
        def _receive_metrics(self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any) -> None:
            if metrics_data is not None:
                metrics_data = merge(metrics_data)
            super()._receive_metrics(metrics_data, timeout_millis, **kwargs)

    return MergingPrometheusReader()


def takes_encoded_chunks(exporter: SpanExporter) -> bool:
    """Whether ``exporter`` is one :func:`fast_span_exporter` made, which reuses :func:`encode_chunks`' parts."""
    return isinstance(exporter, _FastHttpSpanExporter) or (
        getattr(exporter, "__dict__", {}).get("_translate_data") in (encode_spans_fast, _encode_request))


_TRACE_EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


class _BytesTraceStub:
    """The trace service's client for requests already serialized (:mod:`otel_graph.export.otlp_fast`'s
    bytes): parsed into messages only for gRPC to serialize them again, a request of 512
    spans held the GIL about 0.4 ms longer, while the user's tasks waited for it."""

    def __init__(self, channel: Any) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

        self.Export = channel.unary_unary(_TRACE_EXPORT, request_serializer=None,  # bytes go as they are
                                          response_deserializer=ExportTraceServiceResponse.FromString)


def _sends_bytes(exporter: Any) -> bool:
    """Give a stock gRPC span exporter a client that sends serialized requests; False (and
    nothing changed) where its stub, client or channel are not the ones this knows."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub

    channel = getattr(exporter, "_channel", None)
    if vars(exporter).get("_stub") is not TraceServiceStub or not isinstance(getattr(exporter, "_client", None),
                                                                             TraceServiceStub) \
            or not callable(getattr(channel, "unary_unary", None)) \
            or not callable(getattr(exporter, "_initialize_channel_and_stub", None)):
        return False
    # _initialize_channel_and_stub() remakes the client with self._stub on each reconnect.
    exporter._stub = _BytesTraceStub
    exporter._client = _BytesTraceStub(channel)
    return True




# -- the stock OTLP span exporters ------------------------------------------------------------

_HTTP_PARTS = ("_shutdown", "_metrics", "_max_request_size", "_client")


def _stock_class(transport: str) -> Any:
    # From sys.modules only: an instance means the module is loaded, and grpc is slow to import.
    module = sys.modules.get(f"opentelemetry.exporter.otlp.proto.{transport}.trace_exporter")
    return getattr(module, "OTLPSpanExporter", None)


def fast_span_exporter(exporter: SpanExporter) -> SpanExporter:
    """Make a stock OTLP span exporter encode with :func:`encode_spans_fast`.

    The gRPC exporter is changed in place and returned. The HTTP exporter is
    wrapped by one that repeats its ``export`` with the fast encoder and leaves
    the rest to it. Any other exporter, subclasses included, is returned unchanged.
    """
    kind = type(exporter)
    if kind is _stock_class("grpc"):
        translate = getattr(exporter, "_translate_data", None)
        if callable(translate) and _takes(translate, []):
            # Its _export() calls self._translate_data(spans) on each try; an instance attribute wins.
            if _sends_bytes(exporter):
                exporter._translate_data = _encode_request  # type: ignore[attr-defined]
            else:
                _changed("the gRPC OTLPSpanExporter's _stub, _client or _channel",
                         "each request is parsed into messages before it is sent (slower)")
                exporter._translate_data = encode_spans_fast  # type: ignore[attr-defined]
        else:
            _changed("the gRPC OTLPSpanExporter's _translate_data", "spans are encoded by the stock encoder (slower)")
    elif kind is _stock_class("http"):
        _common: ModuleType | None
        try:
            from opentelemetry.exporter.otlp.proto.http import _common
        except ImportError:
            _common = None
        client: Any = getattr(exporter, "_client", None)
        if _common is not None and all(hasattr(exporter, part) for part in _HTTP_PARTS) \
                and callable(getattr(_common, "_is_request_too_large", None)) \
                and _takes(_common._is_request_too_large, b"", 0) \
                and hasattr(_common, "RequestPayloadTooLargeError") \
                and callable(getattr(client, "export", None)) and _takes(client.export, b""):
            return _FastHttpSpanExporter(exporter, _common)
        _changed("the HTTP OTLPSpanExporter's private parts", "spans are exported by the stock exporter (slower)")
    return exporter


#: gRPC channel options for otel_graph's OTLP exporters. A channel whose collector went
#: away backs off its reconnects up to 120 s by default, and channels made anew share
#: that state through the global subchannel pool: the exporter's own remaking of its
#: channel then fails at once, "failed to connect", for a minute after the collector is
#: back. A pool of the channel's own, and backoff capped at 1 s, make a collector that
#: returns reachable within a second: one restarted on its port gets the metrics at exit
#: as well as the spans.
GRPC_CHANNEL_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 1000),
)


def otlp_span_exporter(*, protocol: str) -> SpanExporter:
    """The stock OTLP span exporter for ``protocol`` (``grpc`` or ``http/protobuf``), made fast.

    The stock constructor reads endpoint, headers, timeout, compression and
    certificates from ``OTEL_EXPORTER_OTLP_*``. Only the transport used is imported.
    """
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        # The SDK annotates a single string-valued option; gRPC takes any number, of any type.
        return fast_span_exporter(GrpcExporter(channel_options=GRPC_CHANNEL_OPTIONS))  # type: ignore[arg-type]
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

        from otel_graph.export.http_session import certificate_session

        return fast_span_exporter(HttpExporter(session=certificate_session("traces")))
    raise ValueError(f"OTLP protocol {protocol!r} is not supported; use 'grpc' or 'http/protobuf'")


def stop_retry_waits(exporter: Any) -> None:
    """From now on, a stock OTLP exporter (of spans or metrics) tries each export once.

    The stock exporters retry inside ``export()`` with exponential backoff (1, 2, 4 s...)
    until their timeout, and wait on an event that their ``shutdown()`` sets. Setting it
    alone, at exit, cuts short a retry sleeping through a collector that has just come
    back, and leaves retrying to otel_graph's processor, which retries at once then.
    Each try cut short logs as the exporter always does ("Shutdown in progress, aborting
    retry.", or "Failed to export ... due to timeout, max retries or shutdown."); those
    records are the exporter's, left as they are, and exit's paced retries
    (:data:`otel_graph.export.pipeline.EXIT_FIRST_RETRY_S`) keep them few.
    """
    stock = exporter._stock if isinstance(exporter, _FastHttpSpanExporter) else exporter
    events: list[Any] = [event for event in (getattr(stock, "_shutdown_in_progress", None),  # gRPC
                                  getattr(getattr(stock, "_client", None), "_shutdown_event", None))  # HTTP
              if callable(getattr(event, "set", None))]
    for event in events:
        event.set()
    if not events and _is_stock(stock):
        _changed("the OTLP exporters' shutdown event", "exit may wait out an exporter's retry backoff")


def _is_stock(exporter: Any) -> bool:
    """A stock OTLP exporter, of spans or metrics, over either transport."""
    module = type(exporter).__module__
    return module.startswith("opentelemetry.exporter.otlp.proto.") and type(exporter).__name__.startswith("OTLP")


class _FastHttpSpanExporter(SpanExporter):
    """The stock HTTP exporter's ``export`` with the fast encoder; all else is the stock exporter's."""

    def __init__(self, stock: Any, common: Any) -> None:
        self._stock, self._common = stock, common

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        stock, limit = self._stock, self._stock._max_request_size
        if stock._shutdown:
            _logger.warning("Exporter already shutdown, ignoring batch")
            return SpanExportResult.FAILURE
        with stock._metrics.export_operation(len(spans)) as result:
            try:
                data = _encode_request(spans)  # bytes already: no round trip through the messages
            except Exception as error:
                # Stock returns FAILURE here, and a processor retries the same batch forever.
                # Raised, otel_graph's processor finds the span that cannot be encoded and
                # drops it alone (pipeline.ReliableSpanProcessor), as with the gRPC exporter.
                result.error = error
                raise
            if self._common._is_request_too_large(data, limit):
                message = f"Serialized span request size {len(data)} bytes exceeds max_request_size {limit} bytes."
                _logger.warning("Dropping span batch: %s", message)
                result.error = self._common.RequestPayloadTooLargeError(message)
                return SpanExportResult.FAILURE
            sent = stock._client.export(data)
            if not sent.success:
                result.error = sent.error
                code = sent.status_code
                result.error_attrs = {HTTP_RESPONSE_STATUS_CODE: code} if code is not None else None
                return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self._stock.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return bool(self._stock.force_flush(timeout_millis))
