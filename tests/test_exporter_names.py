"""OTEL_TRACES_EXPORTER / OTEL_METRICS_EXPORTER as the SDK reads them: lists, names other
packages register, case; checked only when otel_graph builds the SDK itself; and the
SDK's span limits on the spans otel_graph makes without the SDK's Span.

Driven by the environment of a fresh interpreter, as a user's script is. The third-party
exporter is a tiny distribution under ``tests/dists`` (on ``PYTHONPATH``: registered by
its ``entry_points.txt``, as an installed package is), writing what it gets to a file.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import subprocess_env
from otel_graph.config import exporter_names
from subprocesses import otlp_env
from test_exporters_env import TASKS, console_spans, receiver, run_app, task_duration_count  # noqa: F401

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
    ("jaeger", "names 'jaeger', which no installed package provides; accepted values: a comma-separated list "
               "of otlp, "),
    ("otlp,none", "names 'none'"),
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
    assert last.startswith("otel_graph.ConfigurationError: OTEL_TRACES_EXPORTER"), proc.stderr[-2000:]
    assert says in last
    if value == "jaeger":  # the installed names are offered, the test distribution's among them
        assert "test_lines" in last and "none" in last


OWN_PROVIDERS = r"""
import otel_graph
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from otel_graph.config import ConfigurationError

handle = otel_graph.instrument_scheduler(tracer_provider=TracerProvider(), meter_provider=MeterProvider(),
                                         resources=False)
handle.uninstrument()
print("OWN PROVIDERS: accepted")
try:
    otel_graph.instrument_scheduler(resources=False)
except ConfigurationError as error:
    print("BUILT:", error)
"""


@pytest.mark.parametrize(("name", "value"), [("OTEL_TRACES_EXPORTER", "jaeger"),
                                             ("OTEL_METRICS_EXPORTER", "statsd"),
                                             ("OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon")])
def test_names_are_not_checked_when_the_application_brings_its_own_providers(name, value):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", OWN_PROVIDERS], env=subprocess_env(**{name: value}),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "OWN PROVIDERS: accepted" in proc.stdout
    assert f"BUILT: {name}" in proc.stdout  # refused once otel_graph builds the SDK itself


LONG_KEYS = r"""
import dask, otel_graph
handle = otel_graph.instrument_scheduler(resources=False)
def inc(x): return x + 1
graph = {("k" * 300) + str(i): (inc, i) for i in range(5)}
graph["total-" + "t" * 300] = (sum, list(graph))
print("RESULT", dask.get(graph, "total-" + "t" * 300, scheduler="sync"))
print("FLUSHED", handle.flush(timeout_s=30))
"""


@pytest.mark.parametrize("limits", [{"OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "50"},
                                    {"OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT": "40",
                                     "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT": "4"}])
def test_the_sdks_span_limits_apply_to_task_spans(receiver, limits):
    import subprocess
    import sys

    env = otlp_env(receiver.grpc_endpoint, "grpc", OTEL_METRICS_EXPORTER="none", **limits)
    proc = subprocess.run([sys.executable, "-c", LONG_KEYS], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "FLUSHED True" in proc.stdout, proc.stderr[-2000:]
    spans = receiver.spans()
    tasks = [s for s in spans if s["name"] != "dask.compute"]
    assert len(tasks) == 6, [s["name"] for s in spans]
    length = int(limits.get("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", limits.get("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT")))
    count = int(limits.get("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "128"))
    for span in spans:  # the compute span (the SDK's own) and the task spans (otel_graph's) alike
        assert all(len(v) <= length for v in span["attributes"].values() if isinstance(v, str)), span["name"]
        assert len(span["attributes"]) <= count, span["attributes"]
    if count == 128:  # the key is there, cut to the limit
        assert {len(t["attributes"]["dask.task.key"]) for t in tasks} == {length}
    else:  # the last attributes set are kept, as the SDK keeps them
        assert {len(t["attributes"]) for t in tasks} == {count}


def test_the_sdks_span_limits_apply_to_aggregate_spans(receiver):
    """With a span budget of 2, most of the graph's tasks fold into aggregate spans: those
    are otel_graph's own spans too, and are cut to the same limits."""
    import subprocess
    import sys

    env = otlp_env(receiver.grpc_endpoint, "grpc", OTEL_METRICS_EXPORTER="none", OTEL_GRAPH_MAX_TASK_SPANS="2",
                   OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT="30")
    proc = subprocess.run([sys.executable, "-c", LONG_KEYS], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "FLUSHED True" in proc.stdout, proc.stderr[-2000:]
    spans = receiver.spans()
    folded = [s for s in spans if s["attributes"].get("dask.task.count", 1) > 1]
    assert folded, [s["attributes"] for s in spans]
    assert sum(s["attributes"].get("dask.task.count", 1) for s in spans if s["name"] != "dask.compute") == 6
    for span in spans:  # strings in sequences (dask.task.dependencies) too, as the SDK cuts them
        texts = [v for value in span["attributes"].values() for v in (value if isinstance(value, list) else [value])
                 if isinstance(v, str)]
        assert texts and all(len(v) <= 30 for v in texts), span
