"""Offline analyses of recorded traces: bottlenecks by prefix, slowest tasks, worker balance, critical path.

Input is what :mod:`otel_graph.report.otlp_read` reads: the ``dask.compute`` spans, the task
spans under them (plain, or aggregate spans standing for many tasks), and metric
points (GPU readings, for the per-prefix GPU columns).

Grouping (:func:`group`) also keeps every distinct span by trace id (:attr:`Grouped.traces`),
the spans the analyses leave out included, for the HTML report's trace browser.
A span is one (trace id, span id); the same span seen again
(a file given twice, an exporter's retry the collector wrote twice) is left out and
counted. Task spans whose ``dask.compute`` span is missing (a compute killed, or still
running when the file was cut) are kept, as an **incomplete** compute per missing
parent, whose times are those of its tasks.

Critical path
-------------
The chain of dependent tasks that bounds a compute's wall time. Starting from the sink
(a task no recorded task depends on) that finished last, it steps to the dependency
that finished last (the one that held the task back), and so on, back to a task with
no recorded dependency. Starting from a sink rather than from whatever ended last keeps
the path a chain of dependencies when workers' clocks disagree. For each step it
reports the idle gap between the dependency's end and the task's start: time the path
spent waiting for a worker rather than computing. ``time on path / wall time`` near 1
means the graph is as parallel as it can be and only faster tasks on the path help; a
low figure means the path waited (scheduling, too few workers, transfers).

It needs task spans with keys and dependencies. A dependency folded into an aggregate
span by the span budget has no end time of its own: when its aggregate ended after the
recorded dependencies, the step may have waited for it, so the step is marked with
those dependencies (:attr:`Step.unseen`) and its gap is not counted as idle (use
``OTEL_GRAPH_MAX_TASK_SPANS=unlimited`` for a complete path). A task lists at most 32
dependencies.

>>> from otel_graph.report.otlp_read import Span
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

from otel_graph.naming import OTHER_PREFIXES, task_prefix
from otel_graph.report.otlp_read import Point, Span

COMPUTE = "dask.compute"


@dataclass
class Compute:
    """One ``dask.compute`` span and the task spans under it.

    ``incomplete``: the ``dask.compute`` span is missing, and ``root`` stands in for it
    (named after the missing span's id, from its first task's start to its last task's end).
    """

    root: Span
    tasks: list[Span] = field(default_factory=list)
    incomplete: bool = False

    @property
    def wall_ns(self) -> int:
        return self.root.duration_ns

    @property
    def task_count(self) -> int:
        return sum(tasks_in(span) for span in self.tasks)


def tasks_in(span: Span) -> int:
    """The tasks a task span stands for: 1, or an aggregate span's ``dask.task.count``."""
    return int(span.attributes.get("dask.task.count", 1))


def is_aggregate(span: Span) -> bool:
    """Whether a task span stands for several tasks (the span budget's aggregates, recovered spans)."""
    return "dask.task.count" in span.attributes


def _duration_sum_ns(span: Span) -> int:
    # The reader keeps dask.task.duration.sum within int64 nanoseconds (it skips spans past it).
    if is_aggregate(span):
        return int(float(span.attributes.get("dask.task.duration.sum", 0.0)) * 1e9)
    return span.duration_ns


@dataclass
class Grouped:
    computes: list[Compute]
    duplicates: int  # spans seen again (same trace and span id), left out
    #: Every distinct span by trace id, in the order read: computes, tasks, and what the
    #: analyses leave out (progress and phase spans, users' own spans), for the trace browser.
    traces: dict[str, list[Span]] = field(default_factory=dict)


def distinct_spans(spans: Iterable[Span]) -> tuple[list[Span], int]:
    """Each (trace id, span id) once, and how many repeats were left out."""
    seen: set[tuple[str, str]] = set()
    kept = []
    repeats = 0
    for span in spans:
        ident = (span.trace_id, span.span_id)
        if ident in seen:
            repeats += 1
        else:
            seen.add(ident)
            kept.append(span)
    return kept, repeats


def group(spans: Iterable[Span]) -> Grouped:
    """Computes in start order, each with its task spans (phases and user spans left out)."""
    unique, duplicates = distinct_spans(spans)
    roots: dict[tuple[str, str], Compute] = {}
    children: dict[tuple[str, str], list[Span]] = defaultdict(list)
    traces: dict[str, list[Span]] = {}
    for span in unique:
        trace = traces.get(span.trace_id)
        if trace is None:
            trace = traces[span.trace_id] = []
        trace.append(span)
        if span.name == COMPUTE:
            roots[(span.trace_id, span.span_id)] = Compute(span)
        elif "dask.task.prefix" in span.attributes:
            children[(span.trace_id, span.parent_id)].append(span)
    for parent, tasks in children.items():
        compute = roots.get(parent)
        if compute is None:  # never dropped: the report must say these tasks ran
            compute = roots[parent] = _incomplete(parent, tasks)
        compute.tasks.extend(tasks)
    return Grouped(sorted(roots.values(), key=lambda c: c.root.start_ns), duplicates, traces)


def _incomplete(parent: tuple[str, str], tasks: list[Span]) -> Compute:
    trace_id, span_id = parent
    root = Span(trace_id, span_id, "", COMPUTE, min(t.start_ns for t in tasks), max(t.end_ns for t in tasks),
                {}, 0, {})
    return Compute(root, incomplete=True)


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
    intervals: dict[str, list[tuple[Any, int, int]]] = defaultdict(list)  # (host, start, end)
    for compute in computes:
        for span in compute.tasks:
            prefix = str(span.attributes.get("dask.task.prefix", span.name))
            duration[prefix] += _duration_sum_ns(span)
            count[prefix] += tasks_in(span)
            size = span.attributes.get("dask.task.nbytes")
            if isinstance(size, int) and size >= 0:
                nbytes[prefix] += size
                sized[prefix] += tasks_in(span)
                sized_ns[prefix] += _duration_sum_ns(span)
            errors[prefix] += span.failed
            intervals[prefix].append((span.resource.get("host.name"), span.start_ns, span.end_ns))
    gpu = _GpuReadings(points)
    total = sum(duration.values()) or 1
    rows = []
    for prefix, nanos in duration.items():
        seconds = nanos / 1e9
        rows.append(PrefixRow(
            prefix=prefix, duration_s=seconds, share=nanos / total, tasks=count[prefix],
            mean_s=seconds / count[prefix] if count[prefix] else 0.0,
            mean_bytes=nbytes[prefix] / sized[prefix] if sized[prefix] else 0.0,
            # bytes per ns is 1e9 B/s, i.e. 1e3 MB/s
            throughput_mb_s=nbytes[prefix] * 1e3 / sized_ns[prefix] if sized_ns[prefix] > 0 else 0.0,
            gpu_utilization=gpu.mean("hw.gpu.utilization", intervals[prefix]),
            gpu_memory_bytes=gpu.mean("hw.gpu.memory.usage", intervals[prefix]),
            errors=errors[prefix],
        ))
    return sorted(rows, key=lambda row: row.duration_s, reverse=True)


class _GpuReadings:
    """GPU readings by host and time, to average those taken on the hosts a prefix's tasks
    ran on, while they ran: on a cluster, another host's idle GPUs (or busy ones) say
    nothing of these tasks. Which of a host's GPUs a task used is not recorded (NVML sees
    every GPU of the host, whatever a worker's ``CUDA_VISIBLE_DEVICES``): a host's GPUs are
    averaged. Readings or spans with no ``host.name`` are matched with each other.
    """

    def __init__(self, points: Iterable[Point]) -> None:
        self._by_key: dict[tuple[str, Any], tuple[list[int], list[float]]] = {}
        by_key: dict[tuple[str, Any], list[tuple[int, float]]] = defaultdict(list)
        for point in points:
            if point.name.startswith("hw.gpu."):
                by_key[(point.name, point.resource.get("host.name"))].append((point.time_ns, point.value))
        for key, readings in by_key.items():
            readings.sort()
            self._by_key[key] = ([t for t, _ in readings], [v for _, v in readings])

    def mean(self, name: str, intervals: list[tuple[Any, int, int]]) -> float | None:
        by_host: dict[Any, list[tuple[int, int]]] = defaultdict(list)
        for host, start, end in intervals:
            by_host[host].append((start, end))
        total, seen = 0.0, 0
        for host, spans in by_host.items():
            readings = self._by_key.get((name, host))
            if readings is None:
                continue
            times, values = readings
            for start, end in _merged(spans):
                low, high = bisect.bisect_left(times, start), bisect.bisect_right(times, end)
                total += sum(values[low:high])
                seen += high - low
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
    spans = (span for compute in computes for span in compute.tasks if not is_aggregate(span))
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
    spans = [span for compute in computes for span in compute.tasks if not is_aggregate(span)]
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
    gap_ns: int  # time between the dependency it waited for (or the compute's start) and its start
    truncated: bool  # its recorded dependency list was cut short
    #: Dependencies without a span of their own (folded into aggregate spans) that may have
    #: held it back, by aggregate prefix: its gap may be their compute time, not idle time.
    unseen: dict[str, int] = field(default_factory=dict)


@dataclass
class CriticalPath:
    compute: Compute
    steps: list[Step]

    @property
    def on_path_ns(self) -> int:
        return sum(step.span.duration_ns for step in self.steps)

    @property
    def gaps_ns(self) -> int:
        """Idle time on the path: the gaps before steps that waited on recorded tasks only."""
        return sum(step.gap_ns for step in self.steps if not step.unseen)

    @property
    def unseen_ns(self) -> int:
        """The gaps before steps that may have waited on aggregated tasks: not known to be idle."""
        return sum(step.gap_ns for step in self.steps if step.unseen)


def critical_path(compute: Compute) -> CriticalPath:
    by_key = _by_key(compute)
    if not by_key:
        return CriticalPath(compute, [])
    aggregate_ends = _aggregate_ends(compute)
    chain: list[tuple[Span, dict[str, int]]] = []
    seen: set[str] = set()
    span: Span | None = _last_sink(by_key)
    while span is not None and span.span_id not in seen:  # malformed input must not loop
        seen.add(span.span_id)
        gating, unseen = _gating(span, by_key, aggregate_ends)
        chain.append((span, unseen))
        span = gating
    chain.reverse()
    steps = []
    previous_end = compute.root.start_ns
    for span, unseen in chain:
        listed = len(span.attributes.get("dask.task.dependencies") or ())
        total = int(span.attributes.get("dask.task.dependency_count", listed) or 0)
        steps.append(Step(span, max(0, span.start_ns - previous_end), truncated=total > listed, unseen=unseen))
        previous_end = span.end_ns
    return CriticalPath(compute, steps)


def _by_key(compute: Compute) -> dict[str, Span]:
    by_key: dict[str, Span] = {}
    for span in compute.tasks:
        key = span.attributes.get("dask.task.key")
        if key is None or is_aggregate(span):
            continue
        known = by_key.get(key)
        if known is None or span.end_ns > known.end_ns:  # a retried key: its last run counts
            by_key[key] = span
    return by_key


def _last_sink(by_key: dict[str, Span]) -> Span:
    """The task ending last among those no recorded task depends on.

    With clock skew between workers a dependency can seem to end after its dependent;
    starting from it would make a path that leaves out the task that really came last.
    """
    depended = {key for span in by_key.values() for key in span.attributes.get("dask.task.dependencies") or ()}
    sinks = [span for key, span in by_key.items() if key not in depended]
    return max(sinks or by_key.values(), key=lambda span: span.end_ns)  # no sink: a cycle, malformed


def _aggregate_ends(compute: Compute) -> dict[str, int]:
    """Per prefix folded into aggregate spans, when the last of its tasks ended."""
    ends: dict[str, int] = {}
    for span in compute.tasks:
        if is_aggregate(span):
            prefix = str(span.attributes.get("dask.task.prefix", span.name))
            ends[prefix] = max(ends.get(prefix, span.end_ns), span.end_ns)
    return ends


def _gating(span: Span, by_key: dict[str, Span],
            aggregate_ends: dict[str, int]) -> tuple[Span | None, dict[str, int]]:
    """The recorded dependency that ended last, and the aggregated ones that may have ended later."""
    listed = span.attributes.get("dask.task.dependencies") or ()
    gating = max((by_key[key] for key in listed if key in by_key), key=lambda dep: dep.end_ns, default=None)
    unseen: dict[str, int] = {}
    if not aggregate_ends:  # nothing folded: a dependency without a span was computed before this compute
        return gating, unseen
    for key in listed:
        if key in by_key:
            continue
        prefix = task_prefix(key)  # a tuple key is written as its repr, which the split reads too
        if prefix not in aggregate_ends:
            prefix = OTHER_PREFIXES
        end = aggregate_ends.get(prefix)
        # Not in an aggregate (an earlier compute's result), or all its aggregate's tasks
        # ended before the recorded dependency did: it cannot have held the task back.
        if end is None or (gating is not None and end <= gating.end_ns):
            continue
        unseen[prefix] = unseen.get(prefix, 0) + 1
    return gating, unseen


def describe_tasks(computes: list[Compute]) -> dict[str, Any]:
    """Totals a report starts with."""
    return {
        "computes": len(computes),
        "tasks": sum(c.task_count for c in computes),
        "task_spans": sum(1 for c in computes for s in c.tasks if not is_aggregate(s)),
        # Tasks whose spans a lost worker took with it, counted by the scheduler instead.
        "recovered": sum(tasks_in(s) for c in computes for s in c.tasks if s.attributes.get("dask.task.recovered")),
        "failed": sum(1 for c in computes if c.root.failed),
        "incomplete": sum(1 for c in computes if c.incomplete),
        "incomplete_tasks": sum(c.task_count for c in computes if c.incomplete),
    }
