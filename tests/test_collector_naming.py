"""The collector's Prometheus naming rules, tested explicitly (see ``collector_exporter.py``).

The port in ``collector_exporter`` must give what otlptranslator gives: its own test cases
(``metric_namer_test.go``, ``UnderscoreEscapingWithSuffixes``) are the table below. Then the
names otel_graph's instruments get from those rules, GPU ones included (no GPU here to
produce them), are the names the dashboards and alert rules query.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from collector_exporter import COUNTER, GAUGE, HISTOGRAM, NON_MONOTONIC, exporter_settings, label_name, metric_name
from grafana_files import alert_rules, dashboard_queries

# (name, unit, kind, expected): otlptranslator's cases for suffixes on, UTF-8 escaped.
UPSTREAM = [
    ("requests", "", COUNTER, "requests_total"),
    ("cpu_usage", "1", GAUGE, "cpu_usage_ratio"),
    ("items", "1", COUNTER, "items_total"),
    ("response_time", "ms", GAUGE, "response_time_milliseconds"),
    ("memory_usage", "By", GAUGE, "memory_usage_bytes"),
    ("requests", "1/s", GAUGE, "requests_per_second"),
    ("throughput", "By/s", GAUGE, "throughput_bytes_per_second"),
    ("custom_metric", "custom_unit", GAUGE, "custom_metric_custom_unit"),
    ("custom_metric", "{custom}", GAUGE, "custom_metric"),
    ("custom_metric", "By/{custom}", GAUGE, "custom_metric_bytes"),
    ("requests_total", "", COUNTER, "requests_total"),
    ("cpu_usage_ratio", "1", GAUGE, "cpu_usage_ratio"),
    ("response_time_seconds", "s", GAUGE, "response_time_seconds"),
    ("metric__with__multiple__underscores", "unit__multiple__underscores", GAUGE,
     "metric_with_multiple_underscores_unit_multiple_underscores"),
    ("custom_metric", "unit@with#special/chars", GAUGE, "custom_metric_unit_with_special_per_chars"),
    ("@#$%", "", GAUGE, ""),
    ("request_duration", "s", HISTOGRAM, "request_duration_seconds"),
    ("active_connections", "", NON_MONOTONIC, "active_connections"),
    ("uptime", "d", GAUGE, "uptime_days"),
    ("duration", "h", GAUGE, "duration_hours"),
    ("123metric", "", GAUGE, "_123metric"),
    ("http.server.duration", "s", HISTOGRAM, "http_server_duration_seconds"),
    ("memory.usage", "By", GAUGE, "memory_usage_bytes"),
    ("requests.count", "1", COUNTER, "requests_count_total"),
]


@pytest.mark.parametrize(("name", "unit", "kind", "expected"), UPSTREAM)
def test_the_port_gives_what_otlptranslator_gives(name, unit, kind, expected):
    assert metric_name(name, unit, kind) == expected


def test_label_names_are_escaped_like_the_collectors():
    assert label_name("dask.task.prefix") == "dask_task_prefix"
    assert label_name("host.name") == "host_name"
    assert label_name("1st") == "key_1st"
    assert label_name("_private") == "key_private"
    assert label_name("__reserved") == "__reserved"


class _Recorder:
    """A meter that records what each create_* call asked for: (name, unit, kind)."""

    def __init__(self) -> None:
        self.made: list[tuple[str, str, str]] = []

    def __getattr__(self, method: str) -> Any:
        kinds = {"create_observable_gauge": GAUGE, "create_observable_up_down_counter": NON_MONOTONIC,
                 "create_observable_counter": COUNTER, "create_histogram": HISTOGRAM, "create_counter": COUNTER,
                 "create_up_down_counter": NON_MONOTONIC}

        def create(name: str, callbacks: Any = None, unit: str = "", description: str = "") -> None:
            self.made.append((name, unit, kinds[method]))

        return create


def collector_names_of_gpu_instruments() -> set[str]:
    from otel_graph.readings.gpu import observe_gpus

    recorder = _Recorder()
    observe_gpus(recorder)  # type: ignore[arg-type]
    return {metric_name(*made) for made in recorder.made}


def test_gpu_names_the_dashboards_use_are_the_collectors():
    names = collector_names_of_gpu_instruments()
    assert names == {"hw_gpu_utilization_ratio", "hw_gpu_memory_utilization_ratio", "hw_gpu_memory_usage_bytes",
                     "hw_gpu_memory_limit_bytes"}
    used = queried_metric_names()
    assert {n for n in used if n.startswith("hw_gpu")} <= names
    assert "hw_gpu_memory_usage_bytes" in used and "hw_gpu_utilization_ratio" in used


_NAME = re.compile(r"\b(dask|process|system|hw|otel_sdk|otelcol|traces_span_metrics)_[a-z0-9_]+")


def queried_metric_names() -> set[str]:
    """Every metric name in a dashboard, variable or alert query, histogram series folded."""
    texts = [query for _, _, query in dashboard_queries()]
    texts += [d["model"].get("expr", "") for rule in alert_rules().values() for d in rule["data"]]
    return {re.sub(r"_(bucket|sum|count)$", "", m.group(0)) for text in texts for m in _NAME.finditer(text)}


def test_the_shipped_exporter_keeps_the_naming_the_dashboards_assume():
    settings = exporter_settings()
    assert settings.get("translation_strategy") == "UnderscoreEscapingWithSuffixes"
    assert not settings.get("namespace")
    # The host and worker variables filter on these resource labels.
    assert {"host.name", "dask.worker.id"} <= set(settings["resource_constant_labels"]["included"])
