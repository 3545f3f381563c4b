"""The collector's ``prometheus`` exporter, as the stack runs it, for tests without a collector.

The dashboards and alert rules query what the OpenTelemetry Collector's ``prometheus``
exporter serves, not what the Python SDK's own Prometheus exporter serves. The two differ:

* **``_ratio``.** The collector (through ``github.com/prometheus/otlptranslator``) appends
  ``_ratio`` to gauges whose unit is ``1`` (``process.cpu.utilization`` becomes
  ``process_cpu_utilization_ratio``); the Python SDK exporter maps ``1`` to nothing.
* **``job`` and ``instance``** come from the resource on the collector's side
  (``service.namespace/service.name`` and ``service.instance.id``); behind the SDK
  exporter they are whatever the scrape config says.
* **Resource labels.** The collector copies the resource attributes its config's
  ``resource_constant_labels`` selects onto every series; the SDK exporter copies none.

No collector binary can run here, so this module is the collector's naming rules, ported
from otlptranslator (``metric_namer.go``, ``unit_namer.go``, ``label_namer.go``) and
checked against that project's own test cases (``tests/test_collector_naming.py``), plus
an exposition of what an :class:`~otlp_receiver.OtlpReceiver` received, named by those
rules and shaped by the exporter settings read from ``collector/otelcol-config.yaml``.
A real Prometheus scrapes it (``honor_labels``, as the stack's ``prometheus.yml`` does).

Usage::

    with OtlpReceiver() as receiver, CollectorExposition(receiver) as exposition:
        ...  # apps export OTLP to receiver.grpc_endpoint
        PrometheusServer({"otel-collector": [exposition.target]}, honor_labels=True)
"""

from __future__ import annotations

import fnmatch
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

from otlp_receiver import OtlpReceiver

COLLECTOR_CONFIG = Path(__file__).resolve().parent.parent / "collector" / "otelcol-config.yaml"

# otlptranslator's unit map (UCUM -> Prometheus), and its "per" unit map.
UNITS = {"d": "days", "h": "hours", "min": "minutes", "s": "seconds", "ms": "milliseconds",
         "us": "microseconds", "ns": "nanoseconds", "By": "bytes", "KiBy": "kibibytes", "MiBy": "mebibytes",
         "GiBy": "gibibytes", "TiBy": "tebibytes", "KBy": "kilobytes", "MBy": "megabytes", "GBy": "gigabytes",
         "TBy": "terabytes", "m": "meters", "V": "volts", "A": "amperes", "J": "joules", "W": "watts",
         "g": "grams", "Cel": "celsius", "Hz": "hertz", "1": "", "%": "percent"}
PER_UNITS = {"s": "second", "m": "minute", "h": "hour", "d": "day", "w": "week", "mo": "month", "y": "year"}

GAUGE, COUNTER, NON_MONOTONIC, HISTOGRAM = "gauge", "counter", "non-monotonic", "histogram"
_INVALID = re.compile(r"[^a-zA-Z0-9:]")


def _tokens(text: str) -> list[str]:
    return [token for token in _INVALID.split(text) if token]


def _clean_unit(unit: str) -> str:
    return re.sub(r"__+", "_", _INVALID.sub("_", unit)).lstrip("_")


def _unit_suffixes(unit: str) -> tuple[str, str]:
    """The main and per-unit suffixes; a part with a ``{annotation}`` contributes nothing."""
    main, _, per = unit.partition("/")
    main, per = main.strip(), per.strip()
    main_suffix = UNITS.get(main, main) if main and not set("{}") & set(main) else ""
    per_suffix = ""
    if per and not set("{}") & set(per):
        per_suffix = "per_" + PER_UNITS.get(per, per)
    return main_suffix, per_suffix


def metric_name(name: str, unit: str, kind: str) -> str:
    """The collector's Prometheus name (``UnderscoreEscapingWithSuffixes``, no namespace)."""
    tokens = _tokens(name)
    main, per = (_clean_unit(part) for part in _unit_suffixes(unit))
    if main in tokens:
        main = ""
    if per == "per_":
        per = ""
    else:
        per = per.removesuffix("_")
        if per in tokens:
            per = ""
    if per:
        main = main.removesuffix("_")
    tokens += [suffix for suffix in (main, per) if suffix]
    if kind == COUNTER:
        tokens = [t for t in tokens if t != "total"] + ["total"]
    if unit == "1" and kind == GAUGE:
        tokens = [t for t in tokens if t != "ratio"] + ["ratio"]
    joined = "_".join(tokens)
    return "_" + joined if joined[:1].isdigit() else joined


def label_name(key: str) -> str:
    """The collector's label name for an attribute key (underscore escaping)."""
    if not key:
        raise ValueError("empty label name")
    label = re.sub(r"[^a-zA-Z0-9_]", "_", key)
    if label[0].isdigit():
        return "key_" + label
    if label.startswith("_") and not label.startswith("__"):
        return "key" + label
    return label


def _value(any_value: Any) -> str:
    kind = any_value.WhichOneof("value")
    if kind is None:
        return ""
    value = getattr(any_value, kind)
    if kind == "bool_value":
        return "true" if value else "false"
    return str(value)


def exporter_settings(path: Path = COLLECTOR_CONFIG) -> dict[str, Any]:
    """The ``prometheus`` exporter's settings in the shipped collector config."""
    config = yaml.safe_load(path.read_text())
    return config["exporters"]["prometheus"]


class CollectorExposition:
    """Serve what ``receiver`` holds, as the collector's ``prometheus`` exporter would."""

    def __init__(self, receiver: OtlpReceiver, *, config: Path = COLLECTOR_CONFIG) -> None:
        settings = exporter_settings(config)
        strategy = settings.get("translation_strategy", "UnderscoreEscapingWithSuffixes")
        if strategy != "UnderscoreEscapingWithSuffixes" or settings.get("namespace"):
            raise ValueError(f"only the stack's naming is emulated here, not {strategy!r}")
        self._included = list((settings.get("resource_constant_labels") or {}).get("included", []))
        self._const = {label_name(k): str(v) for k, v in (settings.get("const_labels") or {}).items()}
        self._receiver = receiver
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.port = 0

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> CollectorExposition:
        from ports import free_port

        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        self.port = free_port()
        self._server, self._thread = start_http_server(self.port, addr="127.0.0.1", registry=registry)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop serving, as a collector that went down (idempotent)."""
        self._server.shutdown()
        self._server.server_close()

    # -- prometheus_client's Collector protocol ------------------------------------------------
    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        latest: dict[tuple, tuple[int, str, dict[str, str], Any]] = {}
        targets: dict[tuple[str, str], dict[str, str]] = {}
        for received in self._receiver.requests("metrics"):
            for resource_metrics in received.request.resource_metrics:
                resource = {kv.key: _value(kv.value) for kv in resource_metrics.resource.attributes}
                identity = self._identity(resource)
                targets[(identity.get("job", ""), identity.get("instance", ""))] = self._target_info(resource, identity)
                constant = {**self._constant_labels(resource), **identity}
                for scope_metrics in resource_metrics.scope_metrics:
                    scope = {"otel_scope_name": scope_metrics.scope.name,
                             "otel_scope_version": scope_metrics.scope.version,
                             "otel_scope_schema_url": scope_metrics.schema_url}
                    for metric in scope_metrics.metrics:
                        self._points(metric, {**scope, **constant}, families, latest)
        for (name, _), (_, kind, labels, point) in sorted(latest.items(), key=lambda item: item[0][0]):
            self._add(families[name], kind, labels, point)
        info = Metric("target", "Target metadata", "info")
        for labels in targets.values():
            info.add_sample("target_info", labels, 1.0)
        yield from families.values()
        if targets:
            yield info

    def _identity(self, resource: dict[str, str]) -> dict[str, str]:
        found = {}
        if "service.name" in resource:
            namespace = resource.get("service.namespace")
            found["job"] = f"{namespace}/{resource['service.name']}" if namespace else resource["service.name"]
        if "service.instance.id" in resource:
            found["instance"] = resource["service.instance.id"]
        return found

    def _constant_labels(self, resource: dict[str, str]) -> dict[str, str]:
        chosen = {label_name(key): value for key, value in resource.items()
                  if any(fnmatch.fnmatchcase(key, pattern) for pattern in self._included)}
        return {**chosen, **self._const}

    def _target_info(self, resource: dict[str, str], identity: dict[str, str]) -> dict[str, str]:
        skip = {"service.name", "service.namespace", "service.instance.id"}
        return {**{label_name(k): v for k, v in resource.items() if k not in skip}, **identity}

    def _points(self, metric: Any, base: dict[str, str], families: dict[str, Metric],
                latest: dict[tuple, tuple[int, str, dict[str, str], Any]]) -> None:
        data = metric.WhichOneof("data")
        if data == "gauge":
            kind, points = GAUGE, metric.gauge.data_points
        elif data == "sum":
            kind = COUNTER if metric.sum.is_monotonic else NON_MONOTONIC
            points = metric.sum.data_points
        elif data == "histogram":
            kind, points = HISTOGRAM, metric.histogram.data_points
        else:
            return  # exponential histograms and summaries: otel_graph makes none
        name = metric_name(metric.name, metric.unit, kind)
        if name not in families:
            family = name.removesuffix("_total") if kind == COUNTER else name
            families[name] = Metric(family, metric.description or metric.name,
                                    {COUNTER: "counter", HISTOGRAM: "histogram"}.get(kind, "gauge"))
        for point in points:
            # A data point's own attribute wins over a resource label of the same name.
            labels = {**base, **{label_name(kv.key): _value(kv.value) for kv in point.attributes}}
            series = (name, tuple(sorted(labels.items())))
            if series not in latest or latest[series][0] <= point.time_unix_nano:
                latest[series] = (point.time_unix_nano, kind, labels, point)

    def _add(self, family: Metric, kind: str, labels: dict[str, str], point: Any) -> None:
        name = family.name
        if kind == HISTOGRAM:
            running = 0
            for bound, count in zip([*point.explicit_bounds, float("inf")], point.bucket_counts, strict=True):
                running += count
                family.add_sample(f"{name}_bucket", {**labels, "le": floatToGoString(bound)}, float(running))
            family.add_sample(f"{name}_sum", labels, point.sum)
            family.add_sample(f"{name}_count", labels, float(point.count))
            return
        value = point.as_double if point.WhichOneof("value") == "as_double" else float(point.as_int)
        family.add_sample(f"{name}_total" if kind == COUNTER else name, labels, value)
