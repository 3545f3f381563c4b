"""User code with its own OpenTelemetry spans inside tasks: they nest under the task's span.

Task spans are built after the tasks ran; the span ids handed out while they ran (see
``otel_graph/telemetry/task_context.py``) must be the ones the task spans arrive with, at a real
OTLP receiver, whatever the span budget.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import subprocess_env
from otlp_receiver import OtlpReceiver

APP = Path(__file__).parent / "apps" / "user_spans.py"


def user_steps(scheduler: str) -> tuple[list[dict], list[dict]]:
    """Every span the app sent, run on ``scheduler``, and its 21 ``user.step`` spans."""
    with OtlpReceiver() as receiver:
        env = subprocess_env(OTEL_EXPORTER_OTLP_ENDPOINT=receiver.grpc_endpoint, OTEL_GRAPH_RESOURCES="false",
                             OTEL_GRAPH_MAX_TASK_SPANS="4")  # fewer than the 21 tasks with user spans
        proc = subprocess.run([sys.executable, str(APP), "--scheduler", scheduler], env=env, capture_output=True,
                              text=True, timeout=180)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "RESULT 311" in proc.stdout and "FLUSHED True" in proc.stdout, proc.stdout
        spans = receiver.spans()
    steps = [s for s in spans if s["name"] == "user.step"]
    assert len(steps) == 21
    return spans, steps


@pytest.mark.parametrize("scheduler", ["sync", "threads"])
def test_user_spans_nest_under_their_task_span_whatever_the_budget(scheduler):
    spans, steps = user_steps(scheduler)
    by_id = {s["span_id"]: s for s in spans}
    for step in steps:
        task = by_id[step["parent_span_id"]]  # the parent arrived
        assert task["name"] == "work" and task["trace_id"] == step["trace_id"]
        assert task["attributes"]["dask.task.prefix"] == "work"
        assert "dask.task.aggregate" not in task["attributes"], "a task with children keeps its own span"
        (inner,) = [s for s in spans if s["name"] == "user.inner" and s["parent_span_id"] == step["span_id"]]
        assert inner["trace_id"] == step["trace_id"]
    # The nested compute is a child of the task that ran it, in the outer trace.
    (outer_root,) = [s for s in spans if s["name"] == "dask.compute" and not s["parent_span_id"]]
    (nested_task,) = [s for s in spans if s["name"] == "nested"]
    (inner_root,) = [s for s in spans if s["name"] == "dask.compute" and s["parent_span_id"]]
    assert inner_root["parent_span_id"] == nested_task["span_id"]
    assert {inner_root["trace_id"], nested_task["trace_id"]} == {outer_root["trace_id"]}
    # A span started outside any task is left alone.
    (outside,) = [s for s in spans if s["name"] == "user.outside"]
    assert outside["trace_id"] != outer_root["trace_id"] and not outside["parent_span_id"]


@pytest.mark.slow
@pytest.mark.parametrize("cluster", ["distributed", "distributed-inprocess"])
def test_user_spans_in_tasks_on_workers_nest_under_their_task_span_whatever_the_budget(cluster):
    pytest.importorskip("distributed")
    spans, steps = user_steps(cluster)
    by_id = {s["span_id"]: s for s in spans}
    keys = set()
    for step in steps:
        task = by_id.get(step["parent_span_id"])
        assert task is not None, "the task span arrived with the id its code was given"
        root = by_id[task["parent_span_id"]]  # the map's compute, or the submit's
        assert root["name"] == "dask.compute" and task["trace_id"] == step["trace_id"] == root["trace_id"]
        assert "dask.task.aggregate" not in task["attributes"], "a task with children keeps its own span"
        in_worker_process = task["resource"]["process.pid"] != root["resource"]["process.pid"]
        assert in_worker_process is (cluster == "distributed")
        keys.add(task["attributes"]["dask.task.key"])
        (inner,) = [s for s in spans if s["name"] == "user.inner" and s["parent_span_id"] == step["span_id"]]
        assert inner["trace_id"] == step["trace_id"]
    assert keys == {f"work-{i}" for i in range(20)} | {"awork-0"}  # threaded and async tasks alike
