"""The OpenTelemetry SDK, built from the standard environment when the application did not.

This is the only module that constructs SDK providers and exporters. It is used only
when ``instrument_scheduler()`` got no providers and no SDK provider is set globally;
an application that configured OpenTelemetry itself keeps its own.

What it builds, from the standard variables:

* a **Resource** from ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES``, plus
  ``service.instance.id`` (unique per process), ``process.pid`` and ``host.name``;
  ``service.name`` defaults to ``dask`` rather than ``unknown_service``;
* a **TracerProvider** (sampler from ``OTEL_TRACES_SAMPLER``) whose spans go through
  :class:`~otel_graph.pipeline.ReliableSpanProcessor` to the exporter that
  ``OTEL_TRACES_EXPORTER`` names: ``otlp`` (``OTEL_EXPORTER_OTLP_PROTOCOL`` ``grpc``
  or ``http/protobuf``; the stock exporters read endpoint, headers, timeout,
  compression and certificates themselves), ``console`` or ``none``;
* a **MeterProvider** whose reader ``OTEL_METRICS_EXPORTER`` names: ``otlp`` and
  ``console`` export every ``OTEL_METRIC_EXPORT_INTERVAL`` ms (default here 1000, as
  often as dask's ResourceProfiler samples, rather than the SDK's 60000), and
  ``prometheus`` serves ``/metrics`` on ``OTEL_EXPORTER_PROMETHEUS_HOST``/``_PORT``
  (default ``localhost:9464``);
* ``otlp_file`` for either signal: OTLP JSON lines under ``OTEL_GRAPH_FILE_DIR``
  (:mod:`otel_graph.otlp_json`), the embedded default of ``otel-graph demo``.

Neither provider registers the SDK's own exit hook, which would block up to 30 s on a
hung collector: :meth:`OwnedSdk.deliver_at_exit` bounds that instead.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import AggregationTemporality, MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_graph.config import ConfigurationError, Settings, otlp_protocol
from otel_graph.histograms import HistogramSet
from otel_graph.pipeline import CountingMetricExporter, ReliableSpanProcessor

logger = logging.getLogger("otel_graph")


def build_resource(extra: dict[str, Any] | None = None) -> Resource:
    resource = Resource.create({
        "service.instance.id": str(uuid.uuid4()),
        "process.pid": os.getpid(),
        "host.name": socket.gethostname(),
        **(extra or {}),
    })
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": "dask"}))
    return resource


def _in_file_dir(settings: Settings, make: Callable[[Path], Any]) -> Any:
    """An ``otlp_file`` exporter, or a clear error naming the variable where its file cannot be."""
    try:
        return make(Path(settings.file_dir))
    except OSError as exc:
        raise ConfigurationError(f"OTEL_GRAPH_FILE_DIR={settings.file_dir!r} cannot hold the otlp_file "
                                 f"exporters' files: {exc.strerror or exc}") from None


def _span_exporter(settings: Settings) -> SpanExporter | None:
    if settings.traces_exporter == "none":
        return None
    if settings.traces_exporter == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if settings.traces_exporter == "otlp_file":
        from otel_graph.otlp_json import OtlpJsonSpanExporter

        return _in_file_dir(settings, lambda directory: OtlpJsonSpanExporter(directory / "traces.jsonl"))
    from otel_graph.otlp_fast import otlp_span_exporter

    return otlp_span_exporter(protocol=otlp_protocol("traces"))


def _metric_exporter(settings: Settings) -> Any:
    if settings.metrics_exporter == "console":
        from opentelemetry.sdk.metrics.export import ConsoleMetricExporter

        return ConsoleMetricExporter()
    if settings.metrics_exporter == "otlp_file":
        from otel_graph.otlp_json import OtlpJsonMetricExporter

        return _in_file_dir(settings, lambda directory: OtlpJsonMetricExporter(directory / "metrics.jsonl"))
    if otlp_protocol("metrics") == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

        from otel_graph.otlp_fast import GRPC_CHANNEL_OPTIONS

        return OTLPMetricExporter(channel_options=GRPC_CHANNEL_OPTIONS)
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetricExporter

    from otel_graph.http_session import certificate_session

    return HttpMetricExporter(session=certificate_session("metrics"))


def _prometheus_reader(settings: Settings, histograms: HistogramSet) -> MetricReader:
    try:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from prometheus_client import start_http_server
    except ImportError:
        raise ConfigurationError(
            "OTEL_METRICS_EXPORTER='prometheus' needs the prometheus exporter: "
            "pip install 'otel-graph[prometheus]'"
        ) from None
    class MergingPrometheusReader(PrometheusMetricReader):
        def _receive_metrics(self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any) -> None:
            if metrics_data is not None:
                metrics_data = histograms.merge_into(metrics_data, AggregationTemporality.CUMULATIVE)
            super()._receive_metrics(metrics_data, timeout_millis, **kwargs)

    # Listen first: the reader registers itself in prometheus_client's global registry as
    # it is made, so a reader made for a port we cannot have would linger and serve twice.
    try:
        start_http_server(port=settings.prometheus_port, addr=settings.prometheus_host)
    except OSError as exc:
        raise PortInUse(
            f"OTEL_EXPORTER_PROMETHEUS_HOST/PORT: cannot listen on "
            f"{settings.prometheus_host}:{settings.prometheus_port}: {exc}"
        ) from None
    reader = MergingPrometheusReader()
    return reader


class PortInUse(ConfigurationError):
    """The Prometheus pull endpoint's port cannot be had (cluster processes try the next)."""


#: What exit still gives a collector that just failed again: one more round of retries.
UNREACHABLE_GRACE_S = 0.1


def exit_window(answers: bool | None, timeout_s: float) -> float:
    """How long exit may wait on the collector: ``timeout_s``, or a moment if it is down or hung.

    ``answers`` is :meth:`OwnedSdk.collector_answers`'s. Waiting out the whole window for
    a collector that cannot answer only delays the exit, and on a cluster once per
    process, one after another (a worker's teardown, its exit, the client's exit): 3.3 s
    after the last compute with the collector down, where 2 s is the bar.
    """
    return min(timeout_s, UNREACHABLE_GRACE_S) if answers is False else timeout_s


@dataclass
class OwnedSdk:
    """Providers otel_graph built and therefore shuts down, with their delivery counters."""

    tracer_provider: TracerProvider | None = None
    meter_provider: MeterProvider | None = None
    span_processor: ReliableSpanProcessor | None = None
    metric_exporter: CountingMetricExporter | None = None
    histograms: HistogramSet | None = None
    #: (host, port) the OTLP span exporter sends to, if over TCP: asked at exit (endpoint.py).
    collector: tuple[str, int] | None = None

    def adopt(self, other: OwnedSdk) -> None:
        """Take the signal ``other`` was built for, which this one lacks."""
        if self.tracer_provider is None and other.tracer_provider is not None:
            self.tracer_provider, self.span_processor = other.tracer_provider, other.span_processor
            self.collector = other.collector
        if self.meter_provider is None and other.meter_provider is not None:
            self.meter_provider, self.metric_exporter = other.meter_provider, other.metric_exporter
            self.histograms = other.histograms

    def stats(self) -> dict[str, int]:
        spans, points = self.span_processor, self.metric_exporter
        return {
            "spans_exported": spans.exported if spans else 0,
            "spans_undelivered": spans.undelivered if spans else 0,
            "spans_queued": spans.pending if spans else 0,
            "points_exported": points.exported if points else 0,
            "points_undelivered": points.undelivered if points else 0,
        }

    def flush(self, timeout_s: float) -> bool:
        """Export everything recorded so far, spans and metrics side by side, within ``timeout_s``."""
        metrics_done: list[bool] = []
        thread = None
        # A pull reader (Prometheus) has nothing to push, and collecting for it early makes
        # its next scrape list every series twice.
        if self.meter_provider is not None and self.metric_exporter is not None:
            provider = self.meter_provider

            def flush_metrics() -> None:
                try:
                    metrics_done.append(provider.force_flush(int(timeout_s * 1000)))
                except Exception:
                    logger.debug("otel_graph: metric flush raised", exc_info=True)
                    metrics_done.append(False)

            thread = threading.Thread(target=flush_metrics, name="otel-graph-flush", daemon=True)
            thread.start()
        started = time.monotonic()
        ok = True
        if self.tracer_provider is not None:
            ok = self.tracer_provider.force_flush(int(timeout_s * 1000))
        if thread is not None:
            thread.join(max(0.0, timeout_s - (time.monotonic() - started)))
            ok = ok and metrics_done == [True]
        return bool(ok)

    def collector_answers(self, timeout_s: float) -> bool | None:
        """At exit: True if the collector takes spans now, False if it is down or hung, else None.

        Asked, not read from the last export (before its first export a processor looks
        healthy, and a collector that failed it may be back): with what is queued
        (``ReliableSpanProcessor.probe``, backoffs cut short), and, when that does not
        go through, with a TCP connection (``endpoint.listening``). Refused there: down.
        An export (of spans or metrics) still out for over a second once retry waits are
        cut short: hung. A failed export alone says neither: the exporter's channel may
        just not have reconnected to a collector back a moment ago.
        """
        metrics, processor = self.metric_exporter, self.span_processor
        if metrics is not None:
            metrics.hurry()  # a metric export asleep in its retry backoff ends now

        def hung() -> bool:  # an export held by the collector itself, past its cut retry waits
            return (processor is not None and processor.stuck) or (metrics is not None and metrics.stuck)

        spans_asked = processor is not None and not (processor.healthy and not processor.pending)
        # The first, short wait lets an export asleep in an exporter's retry backoff end.
        if spans_asked:
            answer = processor.probe(timeout_s=min(timeout_s, 0.05))
        else:
            answer = True
            if metrics is not None and metrics.inflight:
                time.sleep(0.05)
        if hung():
            return False
        if answer is None:
            answer = processor.probe(timeout_s=timeout_s)
            if hung():
                return False
        if answer:
            return True
        if self.collector is not None:
            from otel_graph.endpoint import listening

            if listening(self.collector, timeout_s=min(timeout_s, 0.2)) is False:
                return False
        return None

    def answers_at_exit(self, timeout_s: float) -> bool | None:
        """:meth:`collector_answers`, asked within part of an exit window of ``timeout_s``."""
        return self.collector_answers(min(0.5, timeout_s / 2))

    def exit_budget(self, timeout_s: float) -> float:
        """:func:`exit_window` for the collector's answer now."""
        return exit_window(self.answers_at_exit(timeout_s), timeout_s)

    def deliver_at_exit(self, *, timeout_s: float) -> None:
        """Deliver what is left; give up after ``timeout_s`` without progress, counting the rest.

        The final metric collection runs beside span delivery, not after it, so a hung
        collector costs one ``timeout_s`` in all, not one per signal.
        """
        metrics_done = threading.Event()
        if self.metric_exporter is not None:
            # A periodic export asleep in its retry backoff would hold the final one back.
            self.metric_exporter.hurry()
        if self.meter_provider is not None:
            provider = self.meter_provider

            def shut_metrics() -> None:
                try:
                    provider.shutdown(int(timeout_s * 1000))
                except Exception:
                    logger.debug("otel_graph: metric shutdown raised", exc_info=True)
                metrics_done.set()

            threading.Thread(target=shut_metrics, name="otel-graph-metrics-exit", daemon=True).start()
        else:
            metrics_done.set()
        started = time.monotonic()
        if self.span_processor is not None:
            self.span_processor.deliver_remaining(timeout_s=timeout_s)
        metrics_done.wait(max(0.0, timeout_s - (time.monotonic() - started)))
        if self.metric_exporter is not None:
            # Even when shutdown returned: the SDK's reader returns from it on its own
            # timeout, its export still running.
            self.metric_exporter.give_up()


def build_sdk(settings: Settings, *, traces: bool, metrics: bool, scope: InstrumentationScope,
              resource_attributes: dict[str, Any] | None = None) -> OwnedSdk:
    owned = OwnedSdk()
    resource = build_resource(resource_attributes)
    # Metrics first: the Prometheus port may be taken, and nothing else (no exporter
    # thread) must have been started by then. A span exporter that cannot be made (a file
    # directory that cannot be) is made first, though: it must not leave a metric reader running.
    span_exporter = _span_exporter(settings) if traces else None
    if metrics:
        readers: list[MetricReader] = []
        owned.histograms = HistogramSet(scope)
        if settings.metrics_exporter == "prometheus":
            readers.append(_prometheus_reader(settings, owned.histograms))
        elif settings.metrics_exporter != "none":
            owned.metric_exporter = CountingMetricExporter(_metric_exporter(settings),
                                                           histograms=owned.histograms)
            readers.append(PeriodicExportingMetricReader(
                owned.metric_exporter, export_interval_millis=settings.metric_export_interval_ms))
        owned.meter_provider = MeterProvider(resource=resource, metric_readers=readers, shutdown_on_exit=False)
    if traces:
        provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        exporter = span_exporter
        if settings.traces_exporter == "otlp":
            from otel_graph.endpoint import collector_address

            owned.collector = collector_address(otlp_protocol("traces"))
        if exporter is not None:
            owned.span_processor = ReliableSpanProcessor(exporter, max_queued=settings.max_queued_spans)
            provider.add_span_processor(owned.span_processor)
        owned.tracer_provider = provider
    return owned
