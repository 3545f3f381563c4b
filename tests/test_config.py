"""Configuration: bad values fail at instrument_scheduler() with a message naming the variable."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import subprocess_env

from otel_graph.config import ConfigurationError, load_settings


@pytest.mark.parametrize(("name", "value", "accepted"), [
    ("OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon", "grpc, http/protobuf"),
    ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "smoke", "grpc, http/protobuf"),
    ("OTEL_TRACES_EXPORTER", "jaeger", "otlp, console, none"),
    ("OTEL_METRICS_EXPORTER", "statsd", "otlp, console, none, prometheus"),
    ("OTEL_TRACES_SAMPLER", "sometimes", "always_on"),
    ("OTEL_TRACES_SAMPLER_ARG", "2.5", "between 0 and 1"),
    ("OTEL_SDK_DISABLED", "maybe", "true, false"),
    ("OTEL_EXPORTER_OTLP_INSECURE", "perhaps", "true, false"),
    ("OTEL_METRIC_EXPORT_INTERVAL", "-5", "> 0"),
    ("OTEL_EXPORTER_OTLP_TIMEOUT", "soon", "> 0"),
    ("OTEL_EXPORTER_OTLP_COMPRESSION", "zip", "gzip, none"),
    ("OTEL_EXPORTER_OTLP_ENDPOINT", "localhost:4317", "a URL"),
    ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/nonexistent/ca.pem", "a readable file"),
    ("OTEL_RESOURCE_ATTRIBUTES", "novalue", "key=value"),
    ("OTEL_EXPORTER_PROMETHEUS_PORT", "99999", "1-65535"),
    ("OTEL_GRAPH_MAX_TASK_SPANS", "lots", "unlimited"),
    ("OTEL_GRAPH_MAX_TASK_SPANS", "-1", "unlimited"),
    ("OTEL_GRAPH_EXIT_TIMEOUT", "0", "> 0"),
    ("OTEL_GRAPH_RESOURCES", "sometimes", "true, false"),
])
def test_bad_values_name_the_variable_and_what_it_accepts(name, value, accepted):
    env = {name: value}
    if name == "OTEL_TRACES_SAMPLER_ARG":
        env["OTEL_TRACES_SAMPLER"] = "parentbased_traceidratio"
    with pytest.raises(ConfigurationError) as info:
        load_settings(env)
    message = str(info.value)
    assert message.startswith(f"{name}=")
    assert accepted in message


def test_header_values_are_never_echoed_in_errors():
    with pytest.raises(ConfigurationError) as info:
        load_settings({"OTEL_EXPORTER_OTLP_HEADERS": "Bearer-s3cret"})
    assert "s3cret" not in str(info.value)
    assert "OTEL_EXPORTER_OTLP_HEADERS" in str(info.value)


def test_defaults_and_overrides():
    settings = load_settings({})
    assert settings.max_task_spans == 1000 and settings.metric_export_interval_ms == 1000
    assert load_settings({"OTEL_GRAPH_MAX_TASK_SPANS": "unlimited"}).max_task_spans is None
    assert load_settings({"OTEL_GRAPH_MAX_TASK_SPANS": "5"}, max_task_spans=7).max_task_spans == 7
    assert load_settings({"OTEL_METRIC_EXPORT_INTERVAL": "250"}).metric_export_interval_ms == 250
    assert load_settings({"OTEL_SDK_DISABLED": "TRUE"}).sdk_disabled


def test_unknown_option_is_an_error():
    with pytest.raises(ConfigurationError, match="unknown option"):
        load_settings({}, max_spans=3)


def test_bad_environment_fails_at_instrument_scheduler_with_a_clear_message():
    code = "import otel_graph; otel_graph.instrument_scheduler()"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env=subprocess_env(OTEL_EXPORTER_OTLP_PROTOCOL="carrier-pigeon"))
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last == ("otel_graph.config.ConfigurationError: OTEL_EXPORTER_OTLP_PROTOCOL='carrier-pigeon' "
                    "is not valid; accepted values: grpc, http/protobuf")


def test_sdk_disabled_leaves_dask_untouched():
    code = (
        "import dask, dask.local, otel_graph\n"
        "before = dask.local.get_async\n"
        "handle = otel_graph.instrument_scheduler()\n"
        "assert dask.local.get_async is before\n"
        "assert dask.get({'x': 1, 'y': (abs, 'x')}, 'y') == 1\n"
        "assert handle.flush() and otel_graph.instrument_scheduler() is handle\n"
        "print('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env=subprocess_env(OTEL_SDK_DISABLED="true"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
