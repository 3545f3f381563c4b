"""Exporter choices made only through OTEL_* variables, checked where the telemetry lands.

Each test runs ``tests/apps/compute.py`` in a fresh interpreter configured by the
environment alone, as a user's script is, and reads the result where a user would:
a Prometheus scrape, the console, or a real OTLP receiver. When the app has exited,
everything it was going to deliver has been delivered, so the receiver's contents
are final and "nothing arrived" is a real assertion.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

import subprocesses
from conftest import subprocess_env
from otlp_receiver import OtlpReceiver
from ports import free_port
from subprocesses import Run, otlp_env, printed

APP = subprocesses.APPS / "compute.py"
TASKS = 9


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as running:
        yield running


def run_app(*args: str, env: dict[str, str], timeout_s: float = 120) -> Run:
    """The app on TASKS tasks, run to its end: it must exit cleanly with their sum."""
    run = subprocesses.run_app(APP, "--tasks", str(TASKS), *args, env=env, timeout_s=timeout_s)
    assert run.value("RESULT") == str(sum(range(1, TASKS + 1))), run.stdout
    return run


@contextmanager
def waiting_app(*args: str, env: dict[str, str]) -> Iterator[str]:
    """Run the app until it has computed and blocks on stdin; yield what it printed so far.

    On leaving, a line on stdin lets the app exit, and it must exit cleanly.
    """
    proc = subprocess.Popen([sys.executable, str(APP), "--tasks", str(TASKS), "--wait-stdin", *args], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        seen = []
        for line in proc.stdout:  # blocks until the app prints; ends if it dies
            seen.append(line)
            if line.startswith("COMPUTED"):
                break
        else:
            raise AssertionError(f"the app exited before COMPUTED: {''.join(seen)!r} {proc.stderr.read()!r}")
        yield "".join(seen)
        _, err = proc.communicate("go\n", timeout=60)
        assert proc.returncode == 0, err
    finally:
        proc.kill()
        proc.wait()


def task_duration_count(receiver: OtlpReceiver) -> int:
    """The task count of the last cumulative ``dask.task.duration`` point for prefix ``inc``."""
    points = [p for p in receiver.metrics()
              if p["name"] == "dask.task.duration" and p["attributes"]["dask.task.prefix"] == "inc"]
    assert points, "no dask.task.duration point for inc"
    return max(points, key=lambda p: p["time_ns"])["count"]


def assert_full_trace(spans: list[dict]) -> None:
    (root,) = [s for s in spans if s["name"] == "dask.compute"]
    tasks = [s for s in spans if s["name"] == "inc"]
    assert len(tasks) == TASKS
    assert {t["parent_span_id"] for t in tasks} == {root["span_id"]}
    assert root["attributes"]["dask.graph.tasks"] == TASKS


# -- Prometheus ---------------------------------------------------------------------------------

def scrape_after_flush() -> list:
    """Samples of one scrape of the app's /metrics, taken after ``handle.flush()`` returned True.

    The flush makes the scrape deterministic: the task metrics are recorded by then.
    """
    parser = pytest.importorskip("prometheus_client.parser", reason="the prometheus extra is not installed")
    port = free_port()
    env = subprocess_env(OTEL_METRICS_EXPORTER="prometheus", OTEL_EXPORTER_PROMETHEUS_HOST="127.0.0.1",
                         OTEL_EXPORTER_PROMETHEUS_PORT=str(port), OTEL_TRACES_EXPORTER="none",
                         OTEL_SERVICE_NAME="etl-test", OTEL_GRAPH_RESOURCES="true")
    with waiting_app("--flush-before-wait", env=env) as stdout:
        assert printed(stdout, "FLUSHED").startswith("True "), stdout
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
            text = response.read().decode()
    return [sample for family in parser.text_string_to_metric_families(text) for sample in family.samples]


def test_prometheus_serves_task_and_process_metrics():
    samples = scrape_after_flush()

    def named(name: str, **labels: str) -> list:
        found = [s for s in samples if s.name == name and labels.items() <= s.labels.items()]
        assert found, f"{name} {labels} not served"
        return found

    # Values, not how many copies: see test_a_scrape_after_flush_lists_each_series_once.
    counts = named("dask_task_duration_seconds_count", dask_task_prefix="inc")
    assert {s.value for s in counts} == {TASKS}
    assert {(s.labels["dask_task_outcome"], s.labels["dask_scheduler"], s.labels["otel_scope_name"])
            for s in counts} == {("success", "sync", "otel_graph")}
    infinite = named("dask_task_duration_seconds_bucket", dask_task_prefix="inc", le="+Inf")
    assert {s.value for s in infinite} == {TASKS}
    assert {s.value for s in named("dask_compute_duration_seconds_count")} == {1}
    # Ours, from otel_graph's scope, not prometheus_client's own process collector
    # (process_resident_memory_bytes and friends, which carry no scope label).
    cpu = named("process_cpu_utilization", otel_scope_name="otel_graph")
    assert {s.labels["cpu_mode"] for s in cpu} >= {"user", "system"}
    assert all(s.value > 0 for s in named("process_memory_usage_bytes", otel_scope_name="otel_graph"))
    assert {s.labels["service_name"] for s in named("target_info")} == {"etl-test"}


def test_a_scrape_after_flush_lists_each_series_once():
    series = [(s.name, tuple(sorted(s.labels.items()))) for s in scrape_after_flush()]
    duplicated = sorted({name for name, labels in series if series.count((name, labels)) > 1})
    assert duplicated == []


# -- console ----------------------------------------------------------------------------------

def console_spans(stdout: str) -> list[dict]:
    """The JSON objects ConsoleSpanExporter printed: each starts with a ``{`` line, ends with ``}``."""
    spans, lines = [], None
    for line in stdout.splitlines():
        if line == "{":
            lines = []
        if lines is not None:
            lines.append(line)
            if line == "}":
                spans.append(json.loads("\n".join(lines)))
                lines = None
    return spans


def test_console_exporter_prints_the_trace_as_json():
    run = run_app(env=subprocess_env(OTEL_TRACES_EXPORTER="console", OTEL_METRICS_EXPORTER="none"))
    spans = console_spans(run.stdout)
    (root,) = [s for s in spans if s["name"] == "dask.compute"]
    tasks = [s for s in spans if s["name"] == "inc"]
    assert len(tasks) == TASKS
    assert root["parent_id"] is None
    assert root["attributes"]["dask.graph.tasks"] == TASKS
    assert root["attributes"]["dask.scheduler"] == "sync"
    assert {t["parent_id"] for t in tasks} == {root["context"]["span_id"]}
    assert {t["context"]["trace_id"] for t in tasks} == {root["context"]["trace_id"]}
    assert {t["attributes"]["dask.task.prefix"] for t in tasks} == {"inc"}
    assert root["resource"]["attributes"]["service.name"] == "dask"


# -- which signals and spans go out -----------------------------------------------------------

def test_traces_exporter_none_still_exports_metrics(receiver):
    run = run_app(env=otlp_env(receiver.grpc_endpoint, "grpc", OTEL_TRACES_EXPORTER="none",
                               OTEL_METRICS_EXPORTER="otlp"))
    assert receiver.requests("traces") == []
    assert task_duration_count(receiver) == TASKS
    assert "not delivered" not in run.stderr


@pytest.mark.parametrize("sampler, arg", [("always_off", None), ("traceidratio", "0.0"),
                                          ("parentbased_always_off", None)])
def test_a_sampler_that_drops_everything_keeps_the_metrics(receiver, sampler, arg):
    extra = {"OTEL_TRACES_SAMPLER": sampler}
    if arg is not None:
        extra["OTEL_TRACES_SAMPLER_ARG"] = arg
    run = run_app(env=otlp_env(receiver.grpc_endpoint, "grpc", **extra))
    assert receiver.spans() == []
    assert task_duration_count(receiver) == TASKS
    computes = [p for p in receiver.metrics() if p["name"] == "dask.compute.duration"]
    assert max(p["count"] for p in computes) == 1
    assert "not delivered" not in run.stderr


def test_traceidratio_one_traces_everything(receiver):
    run_app(env=otlp_env(receiver.grpc_endpoint, "grpc", OTEL_TRACES_SAMPLER="traceidratio",
                         OTEL_TRACES_SAMPLER_ARG="1.0"))
    assert_full_trace(receiver.spans())
    assert task_duration_count(receiver) == TASKS


# -- transport settings -----------------------------------------------------------------------

def test_per_signal_endpoint_and_protocol_win(receiver):
    # The general variables point at nothing: only the per-signal ones can deliver.
    nowhere = f"http://127.0.0.1:{free_port()}"
    run = run_app(env=otlp_env(
        nowhere, "grpc",
        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=f"{receiver.http_endpoint}/v1/traces",
        OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="http/protobuf",
        OTEL_EXPORTER_OTLP_METRICS_ENDPOINT=receiver.grpc_endpoint,
        OTEL_EXPORTER_OTLP_METRICS_PROTOCOL="grpc",
    ))
    spans, points = receiver.spans(), receiver.metrics()
    assert_full_trace(spans)
    assert {s["transport"] for s in spans} == {"http"}
    assert {p["transport"] for p in points} == {"grpc"}
    assert task_duration_count(receiver) == TASKS
    assert "not delivered" not in run.stderr


def test_gzip_compression_over_http_delivers(receiver):
    run = run_app(env=otlp_env(receiver.http_endpoint, "http/protobuf", OTEL_EXPORTER_OTLP_COMPRESSION="gzip"))
    assert_full_trace(receiver.spans())
    assert task_duration_count(receiver) == TASKS
    requests = receiver.requests()
    assert {r.signal for r in requests} == {"traces", "metrics"}
    assert {r.headers.get("content-encoding") for r in requests} == {"gzip"}
    assert "not delivered" not in run.stderr


# -- flush against a collector that is down ----------------------------------------------------

FLUSH_TIMEOUT_S = 2.0
#: Past the flush's timeout by this much, it waited on something: the exporters' own timeout
#: is 30 s here. (Scheduling on a loaded machine may add a little to any wait.)
FLUSH_SLACK_S = 3.0


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_flush_against_a_down_collector_says_false_within_its_timeout(protocol):
    env = otlp_env(f"http://127.0.0.1:{free_port()}", protocol, OTEL_EXPORTER_OTLP_TIMEOUT="30")
    run = run_app("--flush", "--flush-timeout", str(FLUSH_TIMEOUT_S), env=env)
    flushed, took_s = printed(run.stdout, "FLUSHED"), float(printed(run.stdout, "FLUSH_SECONDS"))
    assert flushed.startswith("False "), flushed
    assert took_s < FLUSH_TIMEOUT_S + FLUSH_SLACK_S, took_s


PROVIDER_THEN_OWN = """
import dask
import otel_graph
from opentelemetry.sdk.trace import TracerProvider

handle = otel_graph.instrument_scheduler(tracer_provider=TracerProvider(), resources=False)
dask.get({"mine": (abs, -1)}, "mine")  # traced to the caller's provider, which exports nowhere
handle.uninstrument()
handle = otel_graph.instrument_scheduler(resources=False)  # now from OTEL_*, traces too
dask.get({"ours": (abs, -2)}, "ours")
print("FLUSHED", handle.flush(timeout_s=30))
"""


def test_instrumenting_again_without_the_caller_s_provider_exports_traces_from_the_environment(receiver):
    """The first call built otel_graph's SDK for metrics only (the caller brought a tracer
    provider); a later plain call got the API's no-op tracer: no spans, flush() True, no word."""
    env = otlp_env(receiver.grpc_endpoint, "grpc")
    proc = subprocess.run([sys.executable, "-c", PROVIDER_THEN_OWN], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "FLUSHED True"
    keys = [s["attributes"]["dask.task.key"] for s in receiver.spans() if "dask.task.key" in s["attributes"]]
    assert keys == ["ours"]
    assert [s["name"] for s in receiver.spans()].count("dask.compute") == 1
