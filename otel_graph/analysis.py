"""Offline analyses of recorded traces: bottlenecks by prefix, slowest tasks, worker balance, critical path.

Input is what :mod:`otel_graph.otlp_read` reads: the ``dask.compute`` spans, the task
spans under them (plain, or aggregate spans standing for many tasks), and metric
points (GPU readings, for the per-prefix GPU columns).

Critical path
-------------
The chain of dependent tasks that bounds a compute's wall time. Starting from the task
that finished last, it steps to the dependency that finished last (the one that held
the task back), and so on, back to a task with no recorded dependency. For each step
it reports the idle gap between the dependency's end and the task's start: time the
path spent waiting for a worker rather than computing. ``time on path / wall time``
near 1 means the graph is as parallel as it can be and only faster tasks on the path
help; a low figure means the path waited (scheduling, too few workers, transfers).

It needs task spans with keys and dependencies: tasks folded into aggregate spans by
the span budget are invisible to it (use ``OTEL_GRAPH_MAX_TASK_SPANS=unlimited`` for a
complete path), and a task lists at most 32 dependencies.

>>> from otel_graph.otlp_read import Span
>>> def task(key, start, end, deps=()):
...     attributes = {"dask.task.key": key, "dask.task.prefix": key.split("-")[0],
...                   "dask.task.dependencies": list(deps), "dask.task.dependency_count": len(deps)}
...     return Span("t", key, "root", key.split("-")[0], start, end, attributes, 0, {})
>>> root = Span("t", "root", "", "dask.compute", 0, 100, {"dask.graph.tasks": 3}, 0, {})
>>> compute = Compute(root, [task("a-1", 0, 40), task("b-1", 0, 10), task("c-1", 50, 90, ["a-1", "b-1"])])
>>> path = critical_path(compute)
>>> [step.span.attributes["dask.task.key"] for step in path.steps], path.on_path_ns, path.gaps_ns
(['a-1', 'c-1'], 80, 10)
"""

from __future__ import annotations

import bisect
import heapq
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from otel_graph.otlp_read import Point, Span

COMPUTE = "dask.compute"


@dataclass
class Compute:
    """One ``dask.compute`` span and the task spans under it."""

    root: Span
    tasks: list[Span] = field(default_factory=list)

    @property
    def wall_ns(self) -> int:
        return self.root.duration_ns

    @property
    def task_count(self) -> int:
        return sum(_count(span) for span in self.tasks)


def _count(span: Span) -> int:
    return int(span.attributes.get("dask.task.count", 1))


def _is_aggregate(span: Span) -> bool:
    return "dask.task.count" in span.attributes


def _duration_sum_ns(span: Span) -> int:
    if _is_aggregate(span):
        return int(float(span.attributes.get("dask.task.duration.sum", 0.0)) * 1e9)
    return span.duration_ns


def group_computes(spans: Iterable[Span]) -> list[Compute]:
    """Computes in start order, each with its task spans (phases and user spans left out)."""
    roots: dict[str, Compute] = {}
    children: dict[str, list[Span]] = defaultdict(list)
    for span in spans:
        if span.name == COMPUTE:
            roots[span.span_id] = Compute(span)
        elif "dask.task.prefix" in span.attributes and span.parent_id:
            children[span.parent_id].append(span)
    for parent, tasks in children.items():
        compute = roots.get(parent)
        if compute is not None:
            compute.tasks.extend(tasks)
    return sorted(roots.values(), key=lambda c: c.root.start_ns)


# -- bottlenecks ------------------------------------------------------------------------------
@dataclass
class PrefixRow:
    prefix: str
    duration_s: float
    share: float
    tasks: int
    mean_s: float
    mean_bytes: float
    throughput_mb_s: float
    gpu_utilization: float | None
    gpu_memory_bytes: float | None
    errors: int


def prefix_table(computes: Iterable[Compute], points: Iterable[Point] = ()) -> list[PrefixRow]:
    """DASF's bottleneck table, one row per task prefix, most time first."""
    duration: dict[str, int] = defaultdict(int)
    count: dict[str, int] = defaultdict(int)
    nbytes: dict[str, int] = defaultdict(int)
    sized: dict[str, int] = defaultdict(int)
    sized_ns: dict[str, int] = defaultdict(int)  # time of the tasks whose output size is known
    errors: dict[str, int] = defaultdict(int)
    intervals: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for compute in computes:
        for span in compute.tasks:
            prefix = str(span.attributes.get("dask.task.prefix", span.name))
            duration[prefix] += _duration_sum_ns(span)
            count[prefix] += _count(span)
            size = span.attributes.get("dask.task.nbytes")
            if isinstance(size, int) and size >= 0:
                nbytes[prefix] += size
                sized[prefix] += _count(span)
                sized_ns[prefix] += _duration_sum_ns(span)
            errors[prefix] += span.failed
            intervals[prefix].append((span.start_ns, span.end_ns))
    gpu = _GpuReadings(points)
    total = sum(duration.values()) or 1
    rows = []
    for prefix, nanos in duration.items():
        seconds = nanos / 1e9
        rows.append(PrefixRow(
            prefix=prefix, duration_s=seconds, share=nanos / total, tasks=count[prefix],
            mean_s=seconds / count[prefix] if count[prefix] else 0.0,
            mean_bytes=nbytes[prefix] / sized[prefix] if sized[prefix] else 0.0,
            throughput_mb_s=nbytes[prefix] / 1e3 / sized_ns[prefix] if sized_ns[prefix] > 0 else 0.0,
            gpu_utilization=gpu.mean("hw.gpu.utilization", intervals[prefix]),
            gpu_memory_bytes=gpu.mean("hw.gpu.memory.usage", intervals[prefix]),
            errors=errors[prefix],
        ))
    return sorted(rows, key=lambda row: row.duration_s, reverse=True)


class _GpuReadings:
    """GPU readings by time, to average those taken while a prefix's tasks ran."""

    def __init__(self, points: Iterable[Point]) -> None:
        self._by_name: dict[str, list[tuple[int, float]]] = defaultdict(list)
        for point in points:
            if point.name.startswith("hw.gpu."):
                self._by_name[point.name].append((point.time_ns, point.value))
        for readings in self._by_name.values():
            readings.sort()

    def mean(self, name: str, intervals: list[tuple[int, int]]) -> float | None:
        readings = self._by_name.get(name)
        if not readings or not intervals:
            return None
        times = [t for t, _ in readings]
        total, seen = 0.0, 0
        for start, end in _merged(intervals):
            for index in range(bisect.bisect_left(times, start), bisect.bisect_right(times, end)):
                total += readings[index][1]
                seen += 1
        return total / seen if seen else None


def _merged(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def slowest_tasks(computes: Iterable[Compute], *, top: int = 10) -> list[Span]:
    spans = (span for compute in computes for span in compute.tasks if not _is_aggregate(span))
    return heapq.nlargest(top, spans, key=lambda span: span.duration_ns)


# -- worker balance ---------------------------------------------------------------------------
@dataclass
class WorkerRow:
    worker: str
    tasks: int
    busy_s: float
    concurrency: list[float]  # mean tasks running at once, per time slice


def worker_balance(computes: Iterable[Compute], *, slices: int = 10) -> tuple[list[WorkerRow], int, int]:
    """Per worker: tasks, busy time, and how busy it was in each of ``slices`` equal slices of time."""
    spans = [span for compute in computes for span in compute.tasks if not _is_aggregate(span)]
    if not spans:
        return [], 0, 0
    begin = min(span.start_ns for span in spans)
    end = max(span.end_ns for span in spans)
    width = max(1, (end - begin) / slices)
    rows: dict[str, WorkerRow] = {}
    for span in spans:
        worker = str(span.attributes.get("dask.worker.id", "?"))
        row = rows.get(worker) or rows.setdefault(worker, WorkerRow(worker, 0, 0.0, [0.0] * slices))
        row.tasks += 1
        row.busy_s += span.duration_ns / 1e9
        first = min(slices - 1, int((span.start_ns - begin) / width))
        last = min(slices - 1, int((span.end_ns - begin) / width))
        for index in range(first, last + 1):
            low, high = begin + index * width, begin + (index + 1) * width
            overlap = min(high, span.end_ns) - max(low, span.start_ns)
            if overlap > 0:
                row.concurrency[index] += overlap / width
    return sorted(rows.values(), key=lambda row: row.worker), begin, end


# -- critical path -----------------------------------------------------------------------------
@dataclass
class Step:
    span: Span
    gap_ns: int  # idle time between the dependency it waited for (or the compute's start) and its start
    truncated: bool  # its recorded dependency list was cut short


@dataclass
class CriticalPath:
    compute: Compute
    steps: list[Step]

    @property
    def on_path_ns(self) -> int:
        return sum(step.span.duration_ns for step in self.steps)

    @property
    def gaps_ns(self) -> int:
        return sum(step.gap_ns for step in self.steps)


def critical_path(compute: Compute) -> CriticalPath:
    by_key: dict[str, Span] = {}
    for span in compute.tasks:
        key = span.attributes.get("dask.task.key")
        if key is None or _is_aggregate(span):
            continue
        known = by_key.get(key)
        if known is None or span.end_ns > known.end_ns:  # a retried key: its last run counts
            by_key[key] = span
    if not by_key:
        return CriticalPath(compute, [])
    chain = [max(by_key.values(), key=lambda span: span.end_ns)]
    seen = {chain[0].span_id}
    while True:
        dependencies = [by_key[d] for d in chain[-1].attributes.get("dask.task.dependencies") or () if d in by_key]
        if not dependencies:
            break
        gating = max(dependencies, key=lambda span: span.end_ns)
        if gating.span_id in seen:  # malformed input must not loop
            break
        seen.add(gating.span_id)
        chain.append(gating)
    chain.reverse()
    steps = []
    previous_end = compute.root.start_ns
    for span in chain:
        listed = len(span.attributes.get("dask.task.dependencies") or ())
        total = int(span.attributes.get("dask.task.dependency_count", listed) or 0)
        steps.append(Step(span, max(0, span.start_ns - previous_end), truncated=total > listed))
        previous_end = span.end_ns
    return CriticalPath(compute, steps)


def describe_tasks(computes: list[Compute]) -> dict[str, Any]:
    """Totals a report starts with."""
    return {
        "computes": len(computes),
        "tasks": sum(c.task_count for c in computes),
        "task_spans": sum(1 for c in computes for s in c.tasks if not _is_aggregate(s)),
        # Tasks whose spans a lost worker took with it, counted by the scheduler instead.
        "recovered": sum(_count(s) for c in computes for s in c.tasks if s.attributes.get("dask.task.recovered")),
        "failed": sum(1 for c in computes if c.root.failed),
    }
