"""What telemetry shows while a compute is still running: spans of a long job, results held in memory."""

from __future__ import annotations

import threading

import dask
import pytest
from opentelemetry.sdk.trace import SpanProcessor


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
