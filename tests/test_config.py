"""Configuration: bad values fail at instrument_scheduler() with a message naming the variable."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import subprocess_env
from otel_graph.config import ConfigurationError, check_sdk_environment, load_settings


@pytest.mark.parametrize(("name", "value", "accepted"), [
    ("OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon", "grpc, http/protobuf"),
    ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "smoke", "grpc, http/protobuf"),
    ("OTEL_TRACES_SAMPLER", "sometimes", "always_on"),
    ("OTEL_TRACES_SAMPLER_ARG", "2.5", "between 0 and 1"),
    ("OTEL_SDK_DISABLED", "maybe", "true, false"),
    ("OTEL_EXPORTER_OTLP_INSECURE", "perhaps", "true, false"),
    # Only "true" is true to the SDK's exporters: "1" would pass as true here and mean TLS there.
    ("OTEL_EXPORTER_OTLP_INSECURE", "1", "true, false"),
    ("OTEL_EXPORTER_OTLP_TRACES_INSECURE", "yes", "true, false"),
    ("OTEL_SDK_DISABLED", "on", "true, false"),
    ("OTEL_METRIC_EXPORT_INTERVAL", "-5", "> 0"),
    ("OTEL_METRIC_EXPORT_INTERVAL", "1e308", "at most 10^7"),
    ("OTEL_GRAPH_DRAIN_INTERVAL", "nan", "> 0"),
    ("OTEL_GRAPH_EARLY_DRAIN", "soon", ">= 1, or unlimited"),
    ("OTEL_GRAPH_EARLY_DRAIN", "0", ">= 1, or unlimited"),
    ("OTEL_GRAPH_PROGRESS_INTERVAL", "-inf", "> 0"),
    ("OTEL_EXPORTER_PROMETHEUS_PORT", "²", "1-65535"),
    ("OTEL_EXPORTER_OTLP_TIMEOUT", "soon", "> 0"),
    ("OTEL_EXPORTER_OTLP_COMPRESSION", "zip", "gzip, none"),
    ("OTEL_EXPORTER_OTLP_ENDPOINT", "localhost:4317", "a URL"),
    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://[::1", "a URL"),
    ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://collector:notaport", "a URL"),
    ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://:4318", "a URL"),
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
        check_sdk_environment(env)  # what building the SDK checks first
    message = str(info.value)
    assert message.startswith(f"{name}=")
    assert accepted in message


def test_header_values_are_never_echoed_in_errors():
    with pytest.raises(ConfigurationError) as info:
        check_sdk_environment({"OTEL_EXPORTER_OTLP_HEADERS": "Bearer-s3cret"})
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
    assert last == ("otel_graph.ConfigurationError: OTEL_EXPORTER_OTLP_PROTOCOL='carrier-pigeon' "
                    "is not valid; accepted values: grpc, http/protobuf")


@pytest.mark.parametrize(("signal", "names"), [("TRACES", "otlp_file"), ("METRICS", "otlp_file"),
                                               ("METRICS", "otlp,otlp_file"), ("TRACES", "otlp,otlp_file")])
def test_a_file_dir_that_cannot_be_made_is_a_clear_error_that_leaves_nothing_running(tmp_path, signal, names):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    code = (
        "import threading, otel_graph\n"
        "for attempt in (1, 2):\n"
        "    try:\n"
        "        otel_graph.instrument_scheduler(resources=False)\n"
        "    except otel_graph.ConfigurationError as exc:\n"
        "        print('ERROR', exc)\n"
        # The SDK's resource detection runs on a thread pool of its own that ends just after:
        # given a moment, only what was left running is still there.
        "others = [t for t in threading.enumerate() if t is not threading.main_thread()]\n"
        "for t in others:\n"
        "    t.join(5 / len(others))\n"
        "print('THREADS', sorted(t.name for t in others if t.is_alive()))\n"
    )
    env = subprocess_env(**{f"OTEL_{signal}_EXPORTER": names, "OTEL_GRAPH_FILE_DIR": str(blocker / "out"),
                            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"})
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    errors = [line for line in proc.stdout.splitlines() if line.startswith("ERROR ")]
    assert len(errors) == 2 and all("OTEL_GRAPH_FILE_DIR=" in e and "Not a directory" in e for e in errors), proc.stdout
    # Not a metric reader (or span exporter thread) left running per attempt.
    assert proc.stdout.splitlines()[-1] == "THREADS []", proc.stdout


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


# -- fuzzing: any value of any variable we read is accepted or refused clearly ----------------------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from otel_graph import config as config_module  # noqa: E402

VARIABLES = sorted({*config_module.CHOICES, *config_module._BOOLEANS, *config_module._POSITIVE_NUMBERS,
                    *config_module._KEY_VALUE_LISTS, *config_module._ENDPOINTS, *config_module._FILES,
                    *config_module.OWN_VARIABLES, "OTEL_TRACES_SAMPLER_ARG", "OTEL_EXPORTER_PROMETHEUS_PORT",
                    "OTEL_EXPORTER_PROMETHEUS_HOST"})
# Text of every kind: numbers in odd spellings, unicode digits, surrogates, huge values.
values = st.one_of(
    st.text(),
    st.sampled_from(["nan", "inf", "-inf", "1e308", "1e-320", "0", "-0", "²", "٣", " 80 ", "0x10", "1_000",
                     "true ", "TRUE", "unlimited", "http://[::1", "://", "a=b,=c", "%zz=1"]),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.integers().map(str),
)


@settings(max_examples=600, deadline=None)
@given(st.sampled_from(VARIABLES), values)
def test_any_value_of_any_variable_is_accepted_or_refused_clearly(name, value):
    env = {name: value}
    if name == "OTEL_TRACES_SAMPLER_ARG":
        env["OTEL_TRACES_SAMPLER"] = "traceidratio"
    try:
        loaded = load_settings(env)
        check_sdk_environment(env)  # what building the SDK checks first
    except ConfigurationError as error:
        message = str(error)
        assert message.startswith(f"{name}=") and "accepted values" in message
        if "HEADERS" in name:
            assert message.startswith(f"{name}=<hidden> ")  # header values carry credentials
        return
    # Accepted values are usable: finite, positive timings a thread can wait on, a real port.
    import math
    import threading

    for timing in (loaded.exit_timeout_s, loaded.drain_interval_s, loaded.metric_export_interval_ms / 1000):
        assert math.isfinite(timing) and 0 < timing <= threading.TIMEOUT_MAX
    assert 0 < loaded.prometheus_port < 65536


def test_every_variable_the_package_reads_is_in_the_configuration_catalogue():
    """The docs' configuration page is generated from these catalogues: a variable read
    anywhere in the package and missing from them would be undocumented."""
    import re
    from pathlib import Path

    source = "\n".join(path.read_text(encoding="utf-8")
                       for path in Path(config_module.__file__).parent.rglob("*.py"))
    read = set(re.findall(r"[\"'](OTEL_[A-Z0-9_]+)", source))
    catalogue = " ".join([*config_module.OWN_VARIABLES, *config_module.OWN_VARIABLES.values(),
                          *config_module.STANDARD_VARIABLES, *config_module.STANDARD_VARIABLES.values()])

    def documented(name: str) -> bool:
        # A per-signal variant is documented with its general variable ("with per-signal variants").
        general = name.replace("_TRACES_", "_").replace("_METRICS_", "_")
        suffix = general.removeprefix("OTEL_EXPORTER_OTLP")
        return name in catalogue or general in catalogue or f"`{suffix}`" in catalogue

    assert sorted(name for name in read if not documented(name)) == []
    assert set(config_module.OPTIONS.values()) <= set(config_module.OWN_VARIABLES)
