"""Faults around the computation (issue 6): dying worker processes, TLS, a collector lost mid-run.

Each is driven the user's way, a subprocess configured through OTEL_* variables, against a
real OTLP receiver; what must hold is that the computation ends as it would without
otel_graph, the telemetry says what happened, and nothing hangs.
"""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from otlp_receiver import HAVE_OPENSSL, OtlpReceiver, make_self_signed_cert
from test_otlp_export import APP, EXIT_HANG_S, EXPORTER_TIMEOUT_S, otlp_env, run_app

pytestmark = pytest.mark.slow  # faults run to their end: dying processes, TLS, outages


@pytest.mark.parametrize("how", ["kill", "term", "exit"])
def test_a_process_pool_worker_dying_mid_graph_is_reported_and_nothing_hangs(how):
    with OtlpReceiver() as receiver:
        env = otlp_env(receiver.grpc_endpoint, "grpc", OTEL_GRAPH_MAX_TASK_SPANS="unlimited")
        run = run_app("--scheduler", "processes", "--tasks", "40", "--die", how, "--flush", env=env)
        assert run.returncode == 0, run.stderr
        # As without otel_graph: Dask raises BrokenProcessPool (a RuntimeError) to the caller.
        assert run.value("FAILED").startswith("A process in the process pool was terminated abruptly")
        assert run.exit_latency_s < EXIT_HANG_S, run.exit_latency_s
        assert "Traceback" not in run.stderr
        spans = receiver.spans()
    (root,) = [s for s in spans if s["name"] == "dask.compute"]
    assert root["status_code"] == 2  # ERROR
    assert root["attributes"]["error.type"].endswith("BrokenProcessPool")
    # Tasks whose results came back before the pool broke keep their spans.
    assert all(s["parent_span_id"] == root["span_id"] for s in spans if s["name"] == "inc")


@pytest.mark.skipif(not HAVE_OPENSSL, reason="needs the openssl command to make a certificate")
@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_tls_to_the_collector_with_its_certificate(tmp_path, protocol):
    cert, key = make_self_signed_cert(tmp_path)
    with OtlpReceiver(tls_cert_file=cert, tls_key_file=key) as receiver:
        endpoint = receiver.grpc_endpoint if protocol == "grpc" else receiver.http_endpoint
        assert endpoint.startswith("https://")
        run = run_app("--tasks", "5", "--flush", env=otlp_env(endpoint, protocol,
                                                                 OTEL_EXPORTER_OTLP_CERTIFICATE=str(cert)))
        assert run.returncode == 0, run.stderr
        assert run.value("FLUSHED").startswith("True")
        assert [s["name"] for s in receiver.spans()].count("inc") == 5
        assert any(p["name"] == "dask.task.duration" for p in receiver.metrics())


@pytest.mark.skipif(not HAVE_OPENSSL, reason="needs the openssl command to make a certificate")
def test_tls_without_the_certificate_is_counted_not_hung(tmp_path):
    cert, key = make_self_signed_cert(tmp_path)
    with OtlpReceiver(tls_cert_file=cert, tls_key_file=key) as receiver:
        run = run_app("--tasks", "5", env=otlp_env(receiver.grpc_endpoint, "grpc",
                                                  OTEL_EXPORTER_OTLP_TIMEOUT=EXPORTER_TIMEOUT_S))
        assert run.returncode == 0, run.stderr
        assert run.value("RESULT") == "15"
        assert run.exit_latency_s < EXIT_HANG_S, run.exit_latency_s
        assert len([line for line in run.stderr.splitlines() if "not delivered" in line]) == 1, run.stderr
        assert receiver.spans() == []


def test_a_collector_lost_mid_run_costs_only_telemetry():
    with OtlpReceiver() as receiver:
        proc = subprocess.Popen([sys.executable, str(APP), "--tasks", "100", "--wait-stdin"],
                                env=otlp_env(receiver.grpc_endpoint, "grpc", OTEL_METRIC_EXPORT_INTERVAL="200"),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().startswith("RESULT")
            # Some telemetry has gone out; then the collector dies with the app still running.
            assert receiver.wait_for(lambda r: r.requests_answered > 0, timeout_s=30)
            receiver.stop()
            out, err = proc.communicate("\n", timeout=60)
        finally:
            proc.kill()
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    assert len([line for line in err.splitlines() if "not delivered" in line]) <= 1, err


def test_a_failure_storm_behind_a_dead_collector_is_held_within_the_memory_budget():
    # 200 failed computes, each a task span and a root span with ~20 kB of exception text,
    # queued behind a collector that refuses everything. The budget of 60 spans (150 kB)
    # must bound their text too: counted by spans alone it would hold 60 x 20 kB.
    storm = 200
    with OtlpReceiver(fail=True) as receiver:
        proc = subprocess.Popen([sys.executable, str(APP), "--tasks", "1", "--storm", str(storm), "--wait-stdin",
                                 "--built-before-wait", "--flush"],
                                env=otlp_env(receiver.grpc_endpoint, "grpc", OTEL_GRAPH_MAX_QUEUED_SPANS="60",
                                             OTEL_METRICS_EXPORTER="none", OTEL_GRAPH_RESOURCES="false"),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().startswith("RESULT")
            assert proc.stdout.readline().startswith("LAST_COMPUTE_END")
            assert proc.stdout.readline().startswith("COMPUTED")
            assert receiver.wait_for(lambda r: r.requests_failed > 0, timeout_s=30)
            receiver.fail = False
            out, err = proc.communicate("go\n", timeout=60)
        finally:
            proc.kill()
        spans = receiver.spans()
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "span queue full" in err
    flushed = next(line for line in out.splitlines() if line.startswith("FLUSHED"))
    stats = ast.literal_eval(flushed.split(" ", 2)[2])
    failed = [s for s in spans if s["status_code"] == 2]
    text = sum(len(v) for s in failed for e in s["events"] for v in e["attributes"].values() if isinstance(v, str))
    assert 0 < len(failed) < 60 and text <= 60 * 2_500
    # Nothing silent: what arrived plus what was counted undelivered is every span made.
    made = 1 + 1 + 2 * storm  # the first compute's task and root, then a task and root per failure
    assert len(spans) + stats["spans_undelivered"] == made, (len(spans), stats)
    assert stats["spans_exported"] == len(spans)


class _Held:
    """A span exporter whose export takes ``hold_s`` (or until ``release``), then goes through."""

    def __init__(self, hold_s: float) -> None:
        import threading

        self.hold_s = hold_s
        self.started, self.release, self.ended = threading.Event(), threading.Event(), threading.Event()

    def export(self, spans):
        from opentelemetry.sdk.trace.export import SpanExportResult

        self.started.set()
        self.release.wait(self.hold_s)
        self.ended.set()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.release.set()


def _one_span_in_flight(exporter: _Held):
    """A processor whose one span's export has begun."""
    from opentelemetry.sdk.trace import TracerProvider

    from otel_graph.export.pipeline import ReliableSpanProcessor

    processor = ReliableSpanProcessor(exporter, max_queued=100, schedule_delay_s=0.01)
    provider = TracerProvider()
    provider.add_span_processor(processor)
    provider.get_tracer("t").start_span("only").end()
    assert exporter.started.wait(5)
    return processor


def test_exit_builds_spans_when_a_slow_batch_went_through_while_it_asked():
    # A batch in flight for over a second makes the processor look unhealthy; if it is
    # accepted while exit asks, the collector is up, and the last spans must be built.
    import time

    processor = _one_span_in_flight(_Held(1.3))
    deadline = time.monotonic() + 5
    while processor.healthy and time.monotonic() < deadline:
        time.sleep(0.05)  # the batch turns 'stuck' after a second in flight; no event marks that
    assert not processor.healthy
    assert processor.probe(timeout_s=1.0)
    assert processor.exported == 1


def test_exit_stops_asking_once_an_export_becomes_stuck():
    # A hung collector holds an export until the exporter's timeout (10 s by default); once
    # the export has been out a second, exit's question is answered: it stops waiting.
    exporter = _Held(4)  # then it goes through: a probe that waited it out would say True
    processor = _one_span_in_flight(exporter)
    assert not processor.stuck
    try:
        assert processor.probe(timeout_s=25.0) is None
        assert processor.stuck and not exporter.ended.is_set()  # it answered while the export was held
    finally:
        exporter.release.set()
    assert exporter.ended.wait(5)


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_a_backed_up_queue_goes_out_in_large_requests_under_the_size_limit(protocol, monkeypatch):
    # Behind a busy main thread each request costs the export thread a fixed wait for the
    # GIL, so a backlog goes out in batches of up to CATCH_UP_BATCH spans; requests are cut
    # by their encoded size, so spans of long keys with 32 dependencies each (~16 kB, one
    # default batch of 512 of them would be 8 MB) pass the collector's 4 MB limit.
    from opentelemetry.sdk.trace import TracerProvider

    from otel_graph.export.pipeline import MAX_REQUEST_BYTES, ReliableSpanProcessor
    from otel_graph.export.sdk_internals import otlp_span_exporter

    with OtlpReceiver(hang=True) as receiver:  # the first request waits until every span is queued
        if protocol == "grpc":
            monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", receiver.grpc_endpoint)
            monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_INSECURE", "true")
        else:
            monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"{receiver.http_endpoint}/v1/traces")
        processor = ReliableSpanProcessor(otlp_span_exporter(protocol=protocol), max_queued=100_000)
        provider = TracerProvider()
        provider.add_span_processor(processor)
        tracer = provider.get_tracer("otel_graph")
        dependencies = [f"{'k' * 480}-{i}" for i in range(32)]
        for _ in range(600):
            tracer.start_span("wide", attributes={"dask.task.dependencies": dependencies}).end()
        for i in range(6000):
            tracer.start_span("small", attributes={"dask.task.key": f"inc-{i}"}).end()
        assert receiver.wait_for(lambda r: r.requests_pending >= 1, timeout_s=10)
        receiver.hang = False
        try:
            assert processor.force_flush(60_000)
        finally:
            processor.shutdown()
        requests = [r.request for r in receiver.requests("traces")]
        counts = [sum(len(scope.spans) for rs in r.resource_spans for scope in rs.scope_spans) for r in requests]
        assert sum(counts) == 6600 and processor.undelivered == 0 and processor.failed_attempts == 0
        assert max(r.ByteSize() for r in requests) <= MAX_REQUEST_BYTES + 1_000
        assert max(counts) > 512, counts  # the backlog left in catch-up batches


def test_no_metric_export_after_exit_gave_up_changes_the_counters():
    # bench_faults, hung collector: the SDK reader's final collection waited behind the
    # export that hung and ran after the warning, which then said 33 points where the
    # counters said 49. Exit's count is final: an export after it is neither sent nor counted.
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricExportResult

    from otel_graph.export.metric_counting import CountingMetricExporter

    reader = InMemoryMetricReader()
    MeterProvider(metric_readers=[reader]).get_meter("t").create_counter("dask.task.count").add(1)
    data = reader.get_metrics_data()
    with OtlpReceiver() as receiver:
        counting = CountingMetricExporter(OTLPMetricExporter(endpoint=receiver.grpc_endpoint, insecure=True))
        try:
            assert counting.export(data) == MetricExportResult.SUCCESS
            counting.give_up()
            assert counting.export(data) == MetricExportResult.FAILURE
        finally:
            counting.shutdown()
        assert (counting.exported, counting.undelivered) == (1, 0)
        assert len(receiver.requests("metrics")) == 1


def test_a_request_refused_midway_through_a_batch_is_retried_with_the_rest_and_none_twice(monkeypatch):
    # A batch goes out as several requests; one refused is retried with those after it,
    # and the ones before it, delivered, are not sent again.
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExportResult
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from otel_graph.export import pipeline
    class RefusesTheSecond(InMemorySpanExporter):
        calls = 0

        def export(self, spans):
            self.calls += 1
            return SpanExportResult.FAILURE if self.calls == 2 else super().export(spans)

    monkeypatch.setattr(pipeline, "_takes_encoded_chunks", lambda exporter: True)
    monkeypatch.setattr(pipeline, "MAX_REQUEST_BYTES", 20_000)  # ~60 of these spans a request
    exporter = RefusesTheSecond()
    processor = pipeline.ReliableSpanProcessor(exporter, max_queued=10_000, schedule_delay_s=5.0)
    provider = TracerProvider()
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("otel_graph")
    for i in range(300):
        tracer.start_span(f"s{i}", attributes={"dask.task.key": "k" * 200}).end()
    try:
        assert processor.force_flush(30_000)
    finally:
        processor.shutdown()
    names = [span.name for span in exporter.get_finished_spans()]
    assert sorted(names) == sorted(f"s{i}" for i in range(300))  # every span, once
    assert exporter.calls >= 6 and processor.failed_attempts == 1 and processor.undelivered == 0
