"""The OpenTelemetry SDK, built from the standard environment when the application did not.

This is the only module that constructs SDK providers (the exporters they use are made
by :mod:`otel_graph.export.exporters`). It is used only
when ``instrument_scheduler()`` got no providers and no SDK provider is set globally;
an application that configured OpenTelemetry itself keeps its own.

What it builds, from the standard variables:

* a **Resource** from ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES``, plus
  ``service.instance.id`` (unique per process), ``process.pid`` and ``host.name``;
  ``service.name`` defaults to ``dask`` rather than ``unknown_service``;
* a **TracerProvider** (sampler from ``OTEL_TRACES_SAMPLER``) whose spans go, through a
  :class:`~otel_graph.export.pipeline.ReliableSpanProcessor` each, to every exporter that
  ``OTEL_TRACES_EXPORTER`` names (:mod:`otel_graph.export.exporters`: ``otlp``, ``console``,
  ``otlp_file``, or any an installed package registers; ``none`` for none; the stock
  OTLP exporters read endpoint, headers, timeout, compression and certificates themselves);
* a **MeterProvider** with a reader per exporter that ``OTEL_METRICS_EXPORTER`` names:
  push exporters export every ``OTEL_METRIC_EXPORT_INTERVAL`` ms (default here 1000, as
  often as dask's ResourceProfiler samples, rather than the SDK's 60000), and
  ``prometheus`` serves ``/metrics`` on ``OTEL_EXPORTER_PROMETHEUS_HOST``/``_PORT``
  (default ``localhost:9464``);
* ``otlp_file`` for either signal: OTLP JSON lines under ``OTEL_GRAPH_FILE_DIR``
  (:mod:`otel_graph.export.otlp_json`), the embedded default of ``otel-graph demo``.

With several exporters named, the counts of :meth:`OwnedSdk.stats` add up over them; the
first OTLP exporter named (else the first) is the *primary* one: its deliveries are what
a cluster's ledger counts, and its collector is the one asked at exit.

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
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import AggregationTemporality, MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_graph.config import ConfigurationError, Settings
from otel_graph.export.histograms import HistogramSet
from otel_graph.export.metric_counting import CountingMetricExporter
from otel_graph.export.pipeline import ReliableSpanProcessor

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


def _prometheus_reader(settings: Settings, histograms: HistogramSet) -> MetricReader:
    try:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from prometheus_client import start_http_server
    except ImportError:
        raise ConfigurationError(
            "OTEL_METRICS_EXPORTER='prometheus' needs the prometheus exporter: "
            "pip install 'otel-graph[prometheus]'"
        ) from None
    # Listen first: the reader registers itself in prometheus_client's global registry as
    # it is made, so a reader made for a port we cannot have would linger and serve twice.
    try:
        start_http_server(port=settings.prometheus_port, addr=settings.prometheus_host)
    except OSError as exc:
        raise PortInUse(
            f"OTEL_EXPORTER_PROMETHEUS_HOST/PORT: cannot listen on "
            f"{settings.prometheus_host}:{settings.prometheus_port}: {exc}"
        ) from None
    from otel_graph.export.sdk_internals import prometheus_reader

    return prometheus_reader(PrometheusMetricReader,
                             lambda data: histograms.merge_into(data, AggregationTemporality.CUMULATIVE))


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
    #: The primary span processor and metric exporter (see the module docs), and all of them.
    span_processor: ReliableSpanProcessor | None = None
    metric_exporter: CountingMetricExporter | None = None
    span_processors: list[ReliableSpanProcessor] = field(default_factory=list)
    metric_exporters: list[CountingMetricExporter] = field(default_factory=list)
    #: The readers that push (one per exporter in metric_exporters): what a flush collects for.
    push_readers: list[MetricReader] = field(default_factory=list)
    histograms: HistogramSet | None = None
    #: (host, port) the OTLP span exporter sends to, if over TCP: asked at exit (endpoint.py).
    collector: tuple[str, int] | None = None
    #: The exporter names (``OTEL_TRACES_EXPORTER``'s, ``OTEL_METRICS_EXPORTER``'s) of
    #: span_processors and metric_exporters, in their order: named in the exit warning.
    span_names: list[str] = field(default_factory=list)
    metric_names: list[str] = field(default_factory=list)

    def adopt(self, other: OwnedSdk) -> None:
        """Take the signal ``other`` was built for, which this one lacks."""
        if self.tracer_provider is None and other.tracer_provider is not None:
            self.tracer_provider, self.span_processor = other.tracer_provider, other.span_processor
            self.span_processors, self.span_names = other.span_processors, other.span_names
            self.collector = other.collector
        if self.meter_provider is None and other.meter_provider is not None:
            self.meter_provider, self.metric_exporter = other.meter_provider, other.metric_exporter
            self.metric_exporters, self.push_readers = other.metric_exporters, other.push_readers
            self.metric_names = other.metric_names
            self.histograms = other.histograms

    def stats(self) -> dict[str, int]:
        spans, points = self.span_processors, self.metric_exporters
        return {
            "spans_exported": sum(p.exported for p in spans),
            "spans_undelivered": sum(p.undelivered for p in spans),
            "spans_queued": sum(p.pending for p in spans),
            "points_exported": sum(e.exported for e in points),
            "points_undelivered": sum(e.undelivered for e in points),
        }

    def undelivering(self) -> list[str]:
        """The names of the exporters that did not deliver something, each once, in order."""
        named: list[tuple[str, ReliableSpanProcessor | CountingMetricExporter]] = [
            *zip(self.span_names, self.span_processors, strict=False),
            *zip(self.metric_names, self.metric_exporters, strict=False)]
        return list(dict.fromkeys(name for name, part in named if part.undelivered))

    def flush(self, timeout_s: float) -> bool:
        """Export everything recorded so far, spans and metrics side by side, within ``timeout_s``."""
        metrics_done: list[bool] = []
        thread = None
        # Only the readers that push: a pull reader (Prometheus) has nothing to push, and
        # collecting for it early makes its next scrape list every series twice.
        if self.meter_provider is not None and self.push_readers:
            readers = list(self.push_readers)

            def flush_metrics() -> None:
                try:
                    # Every reader flushed, even after one that failed (all() of a generator would stop there).
                    flushed = [reader.force_flush(int(timeout_s * 1000)) for reader in readers]
                    metrics_done.append(all(flushed))
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
        for exporter in self.metric_exporters:
            exporter.hurry()  # a metric export asleep in its retry backoff ends now

        def hung() -> bool:  # an export held by the collector itself, past its cut retry waits
            return (processor is not None and processor.stuck) or (metrics is not None and metrics.stuck)

        # Spans are asked unless the processor is healthy with nothing queued. The first, short
        # wait lets an export asleep in an exporter's retry backoff end.
        if processor is not None and not (processor.healthy and not processor.pending):
            answer = processor.probe(timeout_s=min(timeout_s, 0.05))
        else:
            answer = True
            if metrics is not None and metrics.inflight:
                time.sleep(0.05)
        if hung():
            return False
        if answer is None and processor is not None:  # None only from a probe: processor is set
            answer = processor.probe(timeout_s=timeout_s)
            if hung():
                return False
        if answer:
            return True
        if self.collector is not None:
            from otel_graph.export.endpoint import listening

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
        for exporter in self.metric_exporters:
            # A periodic export asleep in its retry backoff would hold the final one back.
            exporter.hurry()
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
        # Side by side: each exporter's window is the same one.
        others = [threading.Thread(target=processor.deliver_remaining, kwargs={"timeout_s": timeout_s},
                                   name="otel-graph-spans-exit", daemon=True)
                  for processor in self.span_processors if processor is not self.span_processor]
        for thread in others:
            thread.start()
        if self.span_processor is not None:
            self.span_processor.deliver_remaining(timeout_s=timeout_s)
        for thread in others:
            thread.join(max(0.0, 4 * timeout_s - (time.monotonic() - started)))
        metrics_done.wait(max(0.0, timeout_s - (time.monotonic() - started)))
        for exporter in self.metric_exporters:
            # Even when shutdown returned: the SDK's reader returns from it on its own
            # timeout, its export still running.
            exporter.give_up()


def build_sdk(settings: Settings, *, traces: bool, metrics: bool, scope: InstrumentationScope,
              resource_attributes: dict[str, Any] | None = None) -> OwnedSdk:
    from otel_graph.config import check_sdk_environment
    from otel_graph.export.exporters import is_otlp, protocol, resolve

    check_sdk_environment()
    owned = OwnedSdk()
    resource = build_resource(resource_attributes)
    # Every name is looked up before anything is made: a bad one fails alone.
    span_makers = resolve("traces", settings) if traces else []
    metric_makers = resolve("metrics", settings) if metrics else []
    # Everything that can fail and starts nothing first: the exporter objects (a file
    # directory that cannot be, a package's constructor) and the tracer provider (bad span
    # limits). Then the Prometheus port, which may be taken; only then threads: readers
    # and processors. A failure leaves nothing running.
    span_exporters = [(name, make()) for name, make in span_makers]
    metric_exporters = [(name, make()) for name, make in metric_makers]
    provider = TracerProvider(resource=resource, shutdown_on_exit=False) if traces else None
    if metrics:
        readers: list[MetricReader] = []
        owned.histograms = HistogramSet(scope)
        if any(name == "prometheus" for name, _ in metric_exporters):
            readers.append(_prometheus_reader(settings, owned.histograms))
        counted: list[tuple[str, CountingMetricExporter]] = []
        for name, made in metric_exporters:
            if made is None:  # prometheus: its reader is made above
                continue
            if isinstance(made, MetricReader):  # a pull exporter of another package's
                readers.append(made)
                continue
            counted.append((name, CountingMetricExporter(made, histograms=owned.histograms)))
        owned.metric_exporters = [counting for _, counting in counted]
        owned.metric_names = [name for name, _ in counted]
        owned.metric_exporter = _primary(counted)
        interval = settings.metric_export_interval_ms
        owned.push_readers = [PeriodicExportingMetricReader(counting, export_interval_millis=interval)
                              for counting in owned.metric_exporters]
        readers += owned.push_readers
        owned.meter_provider = MeterProvider(resource=resource, metric_readers=readers, shutdown_on_exit=False)
    if provider is not None:
        processed = [(name, ReliableSpanProcessor(exporter, max_queued=settings.max_queued_spans))
                     for name, exporter in span_exporters]
        for _, processor in processed:
            provider.add_span_processor(processor)
        owned.span_processors = [processor for _, processor in processed]
        owned.span_names = [name for name, _ in processed]
        owned.span_processor = _primary(processed)
        otlp = next((name for name, _ in processed if is_otlp(name)), None)
        if otlp is not None:
            from otel_graph.export.endpoint import collector_address

            owned.collector = collector_address(protocol(otlp, "traces"))
        owned.tracer_provider = provider
    return owned


def _primary(named: list[tuple[str, Any]]) -> Any:
    """The first of ``named`` made for an OTLP exporter name, else the first; None if none."""
    from otel_graph.export.exporters import is_otlp

    return next((made for name, made in named if is_otlp(name)), named[0][1] if named else None)
