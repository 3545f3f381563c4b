"""The exporters ``OTEL_TRACES_EXPORTER`` and ``OTEL_METRICS_EXPORTER`` name, made.

The variables are read as the SDK reads them (:func:`otel_graph.config.exporter_names`):
a comma-separated list, each name one exporter, all of them used. A name is:

========================================  ==================================================
``otlp``                                  OTLP over ``OTEL_EXPORTER_OTLP_[TRACES_|METRICS_]PROTOCOL``
                                          (``grpc``, the default, or ``http/protobuf``); spans
                                          through otel_graph's own encoder (:mod:`.otlp_fast`)
``otlp_proto_grpc``, ``otlp_proto_http``  the same over that protocol (the names the SDK's
                                          OTLP exporters are registered under)
``console``                               the SDK's console exporter
``otlp_file``                             OTLP JSON lines under ``OTEL_GRAPH_FILE_DIR``
                                          (:mod:`.otlp_json`)
``prometheus`` (metrics)                  the pull endpoint (:func:`.sdk.build_sdk`)
any other                                 what an installed package registers under that name
                                          in the ``opentelemetry_traces_exporter`` or
                                          ``opentelemetry_metrics_exporter`` entry-point group,
                                          made with no arguments, as the SDK's configurator
                                          makes it (a metrics one may be a pull reader)
========================================  ==================================================

:func:`resolve` looks every name up before anything is made, so a name nothing answers
to fails alone, with a :class:`~otel_graph.ConfigurationError` naming the
variable, the name and every name this process accepts.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from otel_graph.config import ConfigurationError, Settings, otlp_protocol

_VARIABLES = {"traces": "OTEL_TRACES_EXPORTER", "metrics": "OTEL_METRICS_EXPORTER"}
_GROUPS = {"traces": "opentelemetry_traces_exporter", "metrics": "opentelemetry_metrics_exporter"}
_PROTOCOLS = {"otlp_proto_grpc": "grpc", "otlp_proto_http": "http/protobuf"}
_OWN = {"traces": ("otlp", *_PROTOCOLS, "console", "otlp_file"),
        "metrics": ("otlp", *_PROTOCOLS, "console", "otlp_file", "prometheus")}


def is_otlp(name: str) -> bool:
    return name == "otlp" or name in _PROTOCOLS


def protocol(name: str, signal: str) -> str:
    """The OTLP protocol of an OTLP exporter's name."""
    return _PROTOCOLS.get(name) or otlp_protocol(signal)


def _registered(signal: str) -> dict[str, Any]:
    return {point.name: point for point in entry_points(group=_GROUPS[signal])}


def resolve(signal: str, settings: Settings) -> list[tuple[str, Callable[[], Any]]]:
    """(name, maker) for each exporter of ``signal`` (``traces`` or ``metrics``), in order.

    Makers of otel_graph's own names take no time; an entry point is loaded here, so a
    package that cannot be imported is named now, before any exporter exists.
    """
    names = settings.traces_exporters if signal == "traces" else settings.metrics_exporters
    own = _own_spans if signal == "traces" else _own_metrics
    made: list[tuple[str, Callable[[], Any]]] = []
    registered: dict[str, Any] | None = None
    for name in names:
        if name in _OWN[signal]:
            made.append((name, _bind(own, name, settings)))
            continue
        if registered is None:
            registered = _registered(signal)
        point = registered.get(name)
        if point is None:
            accepted = ", ".join([*_OWN[signal], *sorted(set(registered) - set(_OWN[signal]))])
            raise ConfigurationError(f"{_VARIABLES[signal]}={', '.join(names)!r} names {name!r}, which no "
                                     f"installed package provides; accepted values: a comma-separated list "
                                     f"of {accepted}; or none alone")
        try:
            kind = point.load()
        except Exception as exc:
            raise ConfigurationError(f"{_VARIABLES[signal]}: the exporter {name!r} ({point.value}) cannot be "
                                     f"loaded: {type(exc).__name__}: {exc}") from None
        if not (isinstance(kind, type) and issubclass(kind, _expected(signal))):
            raise ConfigurationError(f"{_VARIABLES[signal]}: {name!r} ({point.value}) is not a "
                                     f"{signal[:-1]} exporter")
        made.append((name, _third_party(signal, name, kind)))
    return made


def _expected(signal: str) -> tuple[type, ...]:
    if signal == "traces":
        from opentelemetry.sdk.trace.export import SpanExporter

        return (SpanExporter,)
    from opentelemetry.sdk.metrics.export import MetricExporter, MetricReader

    return (MetricExporter, MetricReader)  # a metrics one may be a pull reader


def _bind(make: Callable[[str, Settings], Any], name: str, settings: Settings) -> Callable[[], Any]:
    return lambda: make(name, settings)


def _third_party(signal: str, name: str, kind: Any) -> Callable[[], Any]:
    def make() -> Any:
        try:
            return kind()
        except Exception as exc:
            raise ConfigurationError(f"{_VARIABLES[signal]}: the exporter {name!r} could not be made: "
                                     f"{type(exc).__name__}: {exc}") from None

    return make


def _in_file_dir(settings: Settings, make: Callable[[Path], Any]) -> Any:
    """An ``otlp_file`` exporter, or a clear error naming the variable where its file cannot be."""
    try:
        return make(Path(settings.file_dir))
    except OSError as exc:
        raise ConfigurationError(f"OTEL_GRAPH_FILE_DIR={settings.file_dir!r} cannot hold the otlp_file "
                                 f"exporters' files: {exc.strerror or exc}") from None


def _own_spans(name: str, settings: Settings) -> Any:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if name == "otlp_file":
        from otel_graph.export.otlp_json import OtlpJsonSpanExporter

        return _in_file_dir(settings, lambda directory: OtlpJsonSpanExporter(directory / "traces.jsonl"))
    from otel_graph.export.sdk_internals import otlp_span_exporter

    return otlp_span_exporter(protocol=protocol(name, "traces"))


def _own_metrics(name: str, settings: Settings) -> Any:
    if name == "prometheus":
        return None  # a reader of its own, made with the meter provider (sdk.build_sdk)
    if name == "console":
        from opentelemetry.sdk.metrics.export import ConsoleMetricExporter

        return ConsoleMetricExporter()
    if name == "otlp_file":
        from otel_graph.export.otlp_json import OtlpJsonMetricExporter

        return _in_file_dir(settings, lambda directory: OtlpJsonMetricExporter(directory / "metrics.jsonl"))
    if protocol(name, "metrics") == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

        from otel_graph.export.sdk_internals import GRPC_CHANNEL_OPTIONS

        # The SDK annotates a single string-valued option; gRPC takes any number, of any type.
        return OTLPMetricExporter(channel_options=GRPC_CHANNEL_OPTIONS)  # type: ignore[arg-type]
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetricExporter

    from otel_graph.export.http_session import certificate_session

    return HttpMetricExporter(session=certificate_session("metrics"))
