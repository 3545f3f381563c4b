"""OTEL_TRACES_EXPORTER / OTEL_METRICS_EXPORTER as the SDK reads them: lists, names other
packages register, case; and checked only when otel_graph builds the SDK itself.

Driven by the environment of a fresh interpreter, as a user's script is. The third-party
exporter is a tiny distribution under ``tests/dists`` (on ``PYTHONPATH``: registered by
its ``entry_points.txt``, as an installed package is), writing what it gets to a file.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import subprocess_env
from test_exporters_env import TASKS, console_spans, otlp_env, receiver, run_app, task_duration_count  # noqa: F401

from otel_graph.config import ConfigurationError, exporter_names, load_settings

DISTS = Path(__file__).parent / "dists"


def with_dists(env: dict[str, str], lines: Path) -> dict[str, str]:
    env["PYTHONPATH"] = os.pathsep.join([str(DISTS), env["PYTHONPATH"]])
    env["TEST_EXPORTER_FILE"] = str(lines)
    return env


def test_names_are_read_as_the_sdk_reads_them():
    assert exporter_names(" console , otlp ") == ("console", "otlp")
    assert exporter_names("otlp,otlp") == ("otlp",)
    assert exporter_names("None") == () and exporter_names("") == ("otlp",) and exporter_names(None) == ("otlp",)
    assert exporter_names("Console") == ("Console",)  # entry points are case-sensitive, as in the SDK


def test_a_list_sends_every_span_and_point_to_each_exporter(receiver):
    run = run_app(env=otlp_env(receiver.grpc_endpoint, "grpc", OTEL_TRACES_EXPORTER="console,otlp",
                               OTEL_METRICS_EXPORTER="otlp,console"))
    printed = [s for s in console_spans(run.stdout) if "resource_metrics" not in s]  # spans, not metrics
    assert len([s for s in printed if s["name"] == "inc"]) == TASKS
    assert len([s for s in receiver.spans() if s["name"] == "inc"]) == TASKS
    assert task_duration_count(receiver) == TASKS
    assert '"dask.task.duration"' in run.stdout  # the console metric exporter's JSON
    assert "not delivered" not in run.stderr


def test_an_exporter_another_package_registers_is_used(receiver, tmp_path):
    lines = tmp_path / "lines.txt"
    env = with_dists(otlp_env(receiver.grpc_endpoint, "grpc", OTEL_TRACES_EXPORTER="test_lines,otlp",
                              OTEL_METRICS_EXPORTER="test_lines"), lines)
    run_app(env=env)
    written = lines.read_text().splitlines()
    assert written.count("inc") == TASKS and written.count("dask.compute") == 1
    assert "metric dask.task.duration" in written
    assert len([s for s in receiver.spans() if s["name"] == "inc"]) == TASKS
    assert receiver.requests("metrics") == []  # metrics went to test_lines alone


@pytest.mark.parametrize(("value", "says"), [
    ("jaeger", "names 'jaeger', which no installed package provides; accepted values: otlp, "),
    ("console,jaeger", "names 'jaeger'"),
    ("Console", "names 'Console'"),
    ("not_an_exporter", "'not_an_exporter' (otel_graph_test_exporter:NotAnExporter) is not a trace exporter"),
])
def test_a_name_nothing_answers_to_fails_at_instrument_scheduler_naming_it(tmp_path, value, says):
    import subprocess
    import sys

    env = with_dists(subprocess_env(OTEL_TRACES_EXPORTER=value), tmp_path / "lines.txt")
    code = "import otel_graph; otel_graph.instrument_scheduler()"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("otel_graph.config.ConfigurationError: OTEL_TRACES_EXPORTER"), proc.stderr[-2000:]
    assert says in last
    if value == "jaeger":  # the installed names are offered, the test distribution's among them
        assert "test_lines" in last and "none" in last


def test_names_are_not_checked_when_the_application_brings_its_own_providers(monkeypatch):
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider

    import otel_graph

    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "jaeger")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "statsd")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon")
    load_settings()  # read, not checked: the SDK that reads them is not ours to build
    handle = otel_graph.instrument_scheduler(tracer_provider=TracerProvider(), meter_provider=MeterProvider(),
                                             resources=False)
    handle.uninstrument()
    with pytest.raises(ConfigurationError, match="OTEL_EXPORTER_OTLP_PROTOCOL"):
        otel_graph.instrument_scheduler(resources=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_PROTOCOL")
    with pytest.raises(ConfigurationError, match="OTEL_TRACES_EXPORTER"):
        otel_graph.instrument_scheduler(resources=False)
