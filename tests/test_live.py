"""What telemetry shows while a compute is still running: spans of a long job, results held in memory."""

from __future__ import annotations

import subprocess
import sys
import threading
from itertools import pairwise
from pathlib import Path

import dask
import dask.multiprocessing
import dask.threaded
import pytest
from opentelemetry.sdk.trace import SpanProcessor

from otlp_receiver import OtlpReceiver
from test_otlp_export import otlp_env


class _Counting(SpanProcessor):
    """A span processor that signals once enough spans of a name have ended."""

    def __init__(self, name: str, count: int) -> None:
        self.name, self.count, self.seen = name, count, 0
        self.enough = threading.Event()

    def on_end(self, span) -> None:
        if span.name == self.name:
            self.seen += 1
            if self.seen >= self.count:
                self.enough.set()


@pytest.mark.parametrize("telemetry", [{"drain_interval_s": 0.2}], indirect=True)
def test_long_job_spans_arrive_while_it_runs(telemetry):
    # The last task blocks, inside the compute, until the earlier tasks' spans were exported.
    counting = _Counting("early", 5)
    telemetry.tracer_provider.add_span_processor(counting)

    def early(i: int) -> int:
        return i

    def wait_for_spans(*parts: int) -> bool:
        return counting.enough.wait(timeout=10)

    graph = {("early", i): (early, i) for i in range(5)}
    graph["late"] = (wait_for_spans, *graph)
    assert dask.get(graph, "late") is True
    (root,) = telemetry.roots()
    assert root.attributes["dask.graph.tasks"] == 6


def _early(i: int) -> int:
    return i


def _wait_for_file(path: str, *parts: int) -> bool:
    # A task of a process pool cannot wait on the test's Event: the test makes a file instead.
    import os
    import time

    deadline = time.monotonic() + 20
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.mark.parametrize("scheduler", ["threads", "processes"])
@pytest.mark.parametrize("telemetry", [{"drain_interval_s": 600}], indirect=True)
def test_a_pool_computes_spans_are_made_while_it_runs(telemetry, scheduler, tmp_path):
    # Not at the next drain interval (600 s): once OTEL_GRAPH_EARLY_DRAIN (256) task records await the
    # tracker. The last task waits, inside the compute, for that many spans to have ended.
    from otel_graph.config import DEFAULT_EARLY_DRAIN_TASKS as EARLY_DRAIN_EVENTS

    counting = _Counting("early", EARLY_DRAIN_EVENTS)
    telemetry.tracer_provider.add_span_processor(counting)
    seen = tmp_path / "seen"
    watcher = threading.Thread(target=lambda: counting.enough.wait(30) and seen.touch(), daemon=True)
    watcher.start()
    tasks = EARLY_DRAIN_EVENTS + 44
    graph = {("early", i): (_early, i) for i in range(tasks)}
    graph["late"] = (_wait_for_file, str(seen), *graph)
    get = {"threads": dask.threaded.get, "processes": dask.multiprocessing.get}[scheduler]
    assert get(graph, "late") is True
    (root,) = telemetry.roots()
    assert root.attributes["dask.scheduler"] == scheduler
    assert root.attributes["dask.graph.tasks"] == tasks + 1
    assert sorted(s.name for s in telemetry.children(root)) == ["early"] * tasks + ["late"]


@pytest.mark.parametrize("telemetry", [{"drain_interval_s": 600, "early_drain_tasks": "unlimited"}], indirect=True)
def test_early_drain_unlimited_leaves_a_pool_compute_to_the_interval(telemetry):
    # OTEL_GRAPH_EARLY_DRAIN=unlimited: no span is made while the compute runs (with the default,
    # the test above sees 256 within moments); all of them when it ends.
    from otel_graph.config import DEFAULT_EARLY_DRAIN_TASKS as EARLY_DRAIN_EVENTS

    counting = _Counting("early", 1)
    telemetry.tracer_provider.add_span_processor(counting)
    tasks = 2 * EARLY_DRAIN_EVENTS
    graph = {("early", i): (_early, i) for i in range(tasks)}
    graph["late"] = (lambda *parts: counting.enough.wait(1), *graph)
    assert dask.threaded.get(graph, "late") is False
    (root,) = telemetry.roots()
    assert sorted(s.name for s in telemetry.children(root)) == ["early"] * tasks + ["late"]


def test_results_held_in_memory_are_gauged(telemetry):
    import numpy as np

    def big() -> np.ndarray:
        return np.ones(1_000_000, dtype="uint8")

    def observe(array: np.ndarray) -> dict:
        data = telemetry.reader.get_metrics_data()
        found = {}
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name in ("dask.memory.tasks", "dask.memory.usage"):
                        for point in metric.data.data_points:
                            if point.attributes.get("dask.scheduler") == "sync":
                                found[metric.name] = point.value
        return found

    seen = dask.get({"big": (big,), "look": (observe, "big")}, "look")
    assert seen["dask.memory.tasks"] >= 1
    assert seen["dask.memory.usage"] >= 1_000_000
    # Once the compute is over nothing is held, and the gauges say so.
    telemetry.handle.flush(timeout_s=10)
    after = {}
    for resource in telemetry.reader.get_metrics_data().resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == "dask.memory.tasks":
                    after = {p.attributes.get("dask.scheduler"): p.value for p in metric.data.data_points}
    assert after.get("sync", 0) == 0


LONG_JOB = Path(__file__).parent / "apps" / "long_job.py"


@pytest.mark.parametrize("scheduler", ["sync", "threads"])
def test_a_running_jobs_trace_is_in_the_collector_before_its_root_span(scheduler):
    # A long job, shortened by the intervals: the collector must have its task spans and a
    # progress span naming the compute while the compute is still running.
    tasks = 20
    with OtlpReceiver() as receiver:
        env = otlp_env(receiver.grpc_endpoint, "grpc", OTEL_GRAPH_DRAIN_INTERVAL="0.1",
                       OTEL_GRAPH_PROGRESS_INTERVAL="0.3", OTEL_METRICS_EXPORTER="none")
        proc = subprocess.Popen([sys.executable, str(LONG_JOB), "--scheduler", scheduler, "--tasks", str(tasks)],
                                env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        try:
            assert proc.stdout.readline().strip() == "RUNNING"

            def progressed(r: OtlpReceiver) -> bool:
                progress = [s for s in r.spans() if s["name"] == "dask.compute.progress"]
                return len(progress) >= 2 and progress[-1]["attributes"]["dask.compute.tasks_done"] == tasks

            assert receiver.wait_for(progressed, timeout_s=30)
            running = receiver.spans()
            out, err = proc.communicate("go\n", timeout=60)
            assert receiver.wait_for(lambda r: any(s["name"] == "dask.compute" for s in r.spans()), timeout_s=30)
        finally:
            proc.kill()
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    assert not [s for s in running if s["name"] == "dask.compute"]
    assert len([s for s in running if s["name"] == "nap"]) == tasks
    (root,) = [s for s in receiver.spans() if s["name"] == "dask.compute"]
    progress = sorted((s for s in receiver.spans() if s["name"] == "dask.compute.progress"),
                      key=lambda s: s["start_ns"])
    # The running trace's spans are the ones the finished trace nests under its root.
    assert {s["parent_span_id"] for s in running} == {root["span_id"]}
    assert {s["trace_id"] for s in running} == {root["trace_id"]}
    # Progress spans tile the run from its start, and count what was done by then.
    assert progress[0]["start_ns"] == root["start_ns"]
    assert all(a["end_ns"] == b["start_ns"] for a, b in pairwise(progress))
    assert progress[-1]["end_ns"] <= root["end_ns"]
    done = [s["attributes"]["dask.compute.tasks_done"] for s in progress]
    assert done == sorted(done) and done[-1] == tasks
    assert progress[-1]["attributes"]["dask.compute.tasks_running"] == 1  # the gate
    assert progress[-1]["attributes"]["dask.compute.tasks_waiting"] == 0
    assert root["attributes"]["dask.graph.tasks"] == tasks + 1  # progress spans are not tasks


@pytest.mark.parametrize("telemetry", [{"drain_interval_s": 0.001, "progress_interval_s": 0.001}], indirect=True)
def test_progress_spans_thin_out_so_a_long_trace_stays_bounded(telemetry):
    # Every 100 progress spans the interval doubles: 100 at >= 1 ms, 100 at >= 2 ms, ...
    import time

    dask.get({"nap": (time.sleep, 3.0)}, "nap")  # the first progress span comes after 1 s
    progress = sorted((s for s in telemetry.spans() if s.name == "dask.compute.progress"), key=lambda s: s.start_time)
    assert len(progress) > 200  # it ran through two doublings at least
    for index, span in enumerate(progress[1:], start=1):
        assert span.end_time - span.start_time >= 10**6 << (index // 100), index


class _RefusesProgress(SpanProcessor):
    """An application's span processor that raises on progress spans."""

    def on_end(self, span) -> None:
        if span.name == "dask.compute.progress":
            raise RuntimeError("no progress spans here")


@pytest.mark.parametrize("telemetry", [{"drain_interval_s": 0.05, "progress_interval_s": 0.1}], indirect=True)
def test_a_progress_span_refused_costs_only_that_span(telemetry):
    import time

    telemetry.tracer_provider.add_span_processor(_RefusesProgress())
    graph = {("nap", i): (time.sleep, 0.3) for i in range(5)}
    dask.get(graph, list(graph))
    (root,) = telemetry.roots()
    # The compute was not abandoned mid-run: its root carries the whole count, no error mark.
    assert root.attributes["dask.graph.tasks"] == 5
    assert "otel_graph.processing_error" not in root.attributes
    assert len(telemetry.children(root)) == 5
