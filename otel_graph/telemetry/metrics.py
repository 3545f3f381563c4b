"""Task metrics: what every task and compute adds to the metric stream.

=========================  =========  ================================================
name                       unit       attributes
=========================  =========  ================================================
``dask.task.duration``     ``s``      ``dask.task.prefix``, ``dask.scheduler``,
                                      ``dask.task.outcome`` (``success``/``error``);
                                      ``dask.task.recovered`` on runs a lost
                                      worker never exported (:meth:`TaskMetrics.record_recovered`)
``dask.task.output.size``  ``By``     ``dask.task.prefix``
``dask.compute.duration``  ``s``      ``dask.scheduler``, ``dask.task.outcome``,
                                      ``dask.compute.name``
``dask.compute.tasks``     ``{task}`` the same: tasks a compute ran (dask.distributed:
                                      tasks in the graph it submitted)
``dask.compute.failed_tasks`` ``{task}`` the same: tasks of a compute that failed
                                      (dask.distributed: counted by the scheduler)
``dask.compute.output.size`` ``By``   the same: its results' ``dask.sizeof`` total
                                      (dask.distributed: as its workers measured them)
``dask.memory.tasks``      ``{task}`` ``dask.scheduler``: results held right now (the
                                      CacheProfiler view)
``dask.memory.usage``      ``By``     ``dask.scheduler``: their ``dask.sizeof`` total
=========================  =========  ================================================

The histograms' count is the task (or compute) count. Their bucket boundaries are
given as advice, fitted to task times (10 µs to 5 min; computes' to a day), result sizes
(64 B to 4 GiB; a compute's to 16 TiB) and task counts; a View in the application's own
provider overrides them. The compute histograms are each job's history (one point a
compute, by ``dask.compute.name``, :mod:`otel_graph.telemetry.job`): a process labels them
with its first :data:`~otel_graph.telemetry.job.MAX_NAMES` job names, the rest
``(other jobs)``.

The task prefix is the only per-task dimension, so the number of attribute sets stays
bounded however many distinct keys run. A key's prefix is what Dask's ``key_split``
makes of it: ``"x-1"`` and ``"x-2"`` share ``x``, but a key without a ``-`` (``"x0"``,
``"job_17"``) is a prefix of its own. A process therefore labels metrics with its first
:data:`MAX_METRIC_PREFIXES` prefixes only (the SDK's default cardinality limit); the
tasks of any later prefix are recorded with ``otel.metric.overflow=true`` in place of
``dask.task.prefix``, as the SDK does past its limit, and one warning says so.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from otel_graph import conventions
from otel_graph.export.histograms import HistogramSet, PreAggregatedHistogram
from otel_graph.naming import INT64_MAX, OTHER_PREFIXES
from otel_graph.telemetry.events import TaskEvent
from otel_graph.telemetry.job import Names

DURATION_BUCKETS_S = (
    0.00001, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
)
SIZE_BUCKETS_BY = tuple(float(64 * 4**i) for i in range(14))  # 64 B .. 4 GiB
#: A compute's: a nightly job runs for hours.
COMPUTE_DURATION_BUCKETS_S = (*DURATION_BUCKETS_S, 600.0, 1800.0, 3600.0, 7200.0, 14400.0, 43200.0, 86400.0)
COMPUTE_SIZE_BUCKETS_BY = tuple(float(64 * 4**i) for i in range(19))  # 64 B .. 16 TiB
TASK_COUNT_BUCKETS = (0.0, 1.0, 10.0, 100.0, 1000.0, 10000.0, 100000.0, 1000000.0, 10000000.0)

#: Runs (or computes) recorded before they are added to the histograms in bulk.
FOLD_AT = 1024
#: Task prefixes a process labels its metrics with; later ones share the overflow label.
MAX_METRIC_PREFIXES = 2000
_OVERFLOW = ("otel.metric.overflow", True)
#: A task run as recorded, in plain values: (its prefix's label, or None for the overflow label;
#: scheduler; failed; duration in ns; result bytes, or -1 unknown).
Run = tuple[str | None, str, bool, int, int]
#: A compute as recorded: (scheduler, failed, seconds, job name, tasks, failed tasks, result
#: bytes), the last three -1 where unknown (a dask.distributed compute the scheduler did not count).
Compute = tuple[str, bool, float, str, int, int, int]
#: Records values under one attribute set: a pre-aggregated histogram's, or an SDK instrument's.
Record = Callable[[tuple[tuple[str, str], ...], Sequence[float]], None]

logger = logging.getLogger("otel_graph")


class TaskMetrics:
    """The task and compute histograms, through the API or pre-aggregated (see histograms.py)."""

    def __init__(self, meter: Meter, *, histograms: HistogramSet | None = None) -> None:
        specs = [(name, conventions.metric(name).unit, conventions.metric(name).brief, bounds) for name, bounds in (
            ("dask.task.duration", DURATION_BUCKETS_S), ("dask.task.output.size", SIZE_BUCKETS_BY),
            ("dask.compute.duration", COMPUTE_DURATION_BUCKETS_S), ("dask.compute.tasks", TASK_COUNT_BUCKETS),
            ("dask.compute.failed_tasks", TASK_COUNT_BUCKETS), ("dask.compute.output.size", COMPUTE_SIZE_BUCKETS_BY))]
        self._histograms = histograms
        #: Runs and computes recorded, not yet added to the histograms: (label, scheduler,
        #: failed, duration in ns, nbytes) and (scheduler, failed, seconds), plain values.
        self._runs: list[Run] = []
        self._computes: list[Compute] = []
        self._duration: Record
        self._size: Record
        self._compute: Record
        self._compute_tasks: Record
        self._compute_failed: Record
        self._compute_size: Record
        #: The job names the compute histograms are labelled with, bounded.
        self.names = Names()
        if histograms is not None:
            made = [histograms.add(PreAggregatedHistogram(name, unit, text, bounds))
                    for name, unit, text, bounds in specs]
            (self._duration, self._size, self._compute, self._compute_tasks, self._compute_failed,
             self._compute_size) = (h.record for h in made)
            self._lock = histograms.lock
            # Added in bulk, by the recording thread past FOLD_AT or by a collection, which
            # folds them first: a small compute's drain costs an append per task, not a
            # histogram update per task, each in code evicted from the CPU's caches since.
            self._fold_at = FOLD_AT
            histograms.folds(self._fold)
        else:
            instruments = [meter.create_histogram(name, unit=unit, description=text,
                                                  explicit_bucket_boundaries_advisory=bounds)
                           for name, unit, text, bounds in specs]
            (self._duration, self._size, self._compute, self._compute_tasks, self._compute_failed,
             self._compute_size) = (_api_record(h) for h in instruments)
            self._lock = threading.Lock()
            self._fold_at = 1  # the SDK's instruments: recorded at once, as it collects on its own
        self._attributes: dict[tuple[str | None, str, bool], tuple[tuple[str, Any], ...]] = {}
        self._by_prefix: dict[str | None, tuple[tuple[str, Any], ...]] = {None: (_OVERFLOW,)}
        self._compute_attributes: dict[tuple[str, bool, str], tuple[tuple[str, Any], ...]] = {}
        self._prefixes: set[str] = set()
        self._warned_overflow = False

    def record_tasks(self, events: Sequence[TaskEvent], prefixes: Sequence[str], scheduler: str) -> None:
        admitted = self._prefixes  # label()'s test, inline: a large compute's drain asks it per task
        self.record_runs([(prefix if prefix in admitted else self._admit(prefix), scheduler, ev.error is not None,
                           ev.end_ns - ev.start_ns, ev.nbytes) for ev, prefix in zip(events, prefixes, strict=False)])

    def record_runs(self, runs: list[Run]) -> None:
        """Task runs as :data:`Run` tuples, labelled by :meth:`label`, in the order their tasks were labelled."""
        with self._lock:
            self._runs += runs
            if len(self._runs) >= self._fold_at:
                self._fold()

    def _fold(self) -> None:
        """Under the lock: the runs and computes recorded since the last fold, into the histograms."""
        runs, self._runs = self._runs, []
        groups: dict[tuple[str | None, str, bool], list[tuple[int, int]]] = {}
        for label, scheduler, failed, duration_ns, nbytes in runs:
            group = groups.get((label, scheduler, failed))
            if group is None:
                group = groups[(label, scheduler, failed)] = []
            group.append((duration_ns, nbytes))
        for (label, scheduler, failed), group in groups.items():
            self._duration(self._task_attributes(label, scheduler, failed), [d / 1e9 for d, _ in group])
            if not failed:
                self._size(self._size_attributes(label), [nbytes for _, nbytes in group if nbytes >= 0])
        computes, self._computes = self._computes, []
        for scheduler, failed, seconds, job, tasks, failed_tasks, nbytes in computes:
            label = self.names.label(job)
            attributes = self._compute_attributes.get((scheduler, failed, label))
            if attributes is None:
                attributes = self._compute_attributes[(scheduler, failed, label)] = (
                    ("dask.scheduler", scheduler), ("dask.task.outcome", "error" if failed else "success"),
                    ("dask.compute.name", label))
            self._compute(attributes, [seconds])
            if tasks >= 0:
                self._compute_tasks(attributes, [tasks])
            if failed_tasks >= 0:
                self._compute_failed(attributes, [failed_tasks])
            if nbytes >= 0:
                self._compute_size(attributes, [nbytes])

    def label(self, prefix: str) -> str | None:
        """``prefix``'s label in the metrics: itself, or None (the overflow label) past the
        limit. A prefix is admitted by the first run labelled with it."""
        return prefix if prefix in self._prefixes else self._admit(prefix)

    def _admit(self, prefix: str) -> str | None:
        """``prefix`` if it may still label metrics; None (the overflow label) past the limit."""
        if len(self._prefixes) < MAX_METRIC_PREFIXES:
            self._prefixes.add(prefix)
            return prefix
        if not self._warned_overflow:
            self._warned_overflow = True
            logger.warning("otel_graph: tasks of more than %d prefixes ran in this process; the task metrics of "
                           "further prefixes are labelled otel.metric.overflow=true instead of dask.task.prefix "
                           "(a key without a '-' is a prefix of its own)", MAX_METRIC_PREFIXES)
        return None

    def span_name(self, prefix: str) -> str:
        """The name of a span of ``prefix``: the prefix if it labels metrics, else OTHER_PREFIXES.

        Span names are low-cardinality too: Jaeger lists each as an operation, and the
        collector's span metrics make series per name.
        """
        return prefix if prefix in self._prefixes else OTHER_PREFIXES

    def record_recovered(self, prefix: str, *, failed: bool, count: int, duration_s: float) -> None:
        """``count`` runs of a lost worker's, from the scheduler's count: ``dask.task.recovered=true``.

        Their own times are gone: each is recorded at the mean, so the histogram's count and
        sum are exact and its buckets approximate. ``OTHER_PREFIXES`` stands for runs the
        worker labelled with the overflow attribute.
        """
        label = None if prefix == OTHER_PREFIXES else self.label(prefix)
        attributes = (*self._task_attributes(label, "distributed", failed), ("dask.task.recovered", True))
        with self._lock:
            self._duration(attributes, [duration_s / count] * count)

    def admitted_name(self, prefix: str) -> str:
        """:meth:`span_name`, admitting ``prefix`` if there is room, as :meth:`record_tasks` would
        (spans of tasks about to be recorded, or that a lost worker ran)."""
        if prefix in self._prefixes:  # asked per task span of a small compute: no call when admitted
            return prefix
        return OTHER_PREFIXES if self._admit(prefix) is None else prefix

    def _task_attributes(self, prefix: str | None, scheduler: str, failed: bool) -> tuple[tuple[str, Any], ...]:
        attributes = self._attributes.get((prefix, scheduler, failed))
        if attributes is None:
            attributes = self._attributes[(prefix, scheduler, failed)] = (
                ("dask.scheduler", scheduler),
                ("dask.task.outcome", "error" if failed else "success"),
                ("dask.task.prefix", prefix) if prefix is not None else _OVERFLOW,
            )
        return attributes

    def _size_attributes(self, prefix: str | None) -> tuple[tuple[str, Any], ...]:
        attributes = self._by_prefix.get(prefix)
        if attributes is None:
            attributes = self._by_prefix[prefix] = (("dask.task.prefix", prefix),)
        return attributes

    def record_compute(self, compute: Compute, *, runs: list[Run] | None = None) -> None:
        """A compute; with ``runs``, its task runs too (:meth:`record_runs`), under one lock."""
        self.record_computes([compute], runs)

    def record_computes(self, computes: list[Compute], runs: list[Run] | None = None) -> None:
        """Computes (:data:`Compute`), and their task runs, under one lock."""
        with self._lock:
            if runs:
                self._runs += runs
            self._computes += computes
            if len(self._computes) >= self._fold_at or len(self._runs) >= self._fold_at:
                self._fold()


def run_totals(runs: Iterable[Run]) -> tuple[int, int]:
    """Of a compute's task runs: how many failed, and the bytes of the results measured."""
    return outcome_totals((run[2], run[4]) for run in runs)


def outcome_totals(outcomes: Iterable[tuple[bool, int]]) -> tuple[int, int]:
    """Of tasks' (failed, result bytes or -1): how many failed, and the bytes of those that did not."""
    failed = nbytes = 0
    for task_failed, size in outcomes:
        if task_failed:
            failed += 1
        elif size > 0:
            nbytes += size
    return failed, nbytes


def _api_record(instrument: Any) -> Record:
    cache: dict[tuple, dict[str, str]] = {}

    def record(attributes: tuple[tuple[str, str], ...], values: Sequence[float]) -> None:
        as_dict = cache.get(attributes)
        if as_dict is None:
            as_dict = cache[attributes] = dict(attributes)
        for value in values:
            instrument.record(value, as_dict)

    return record


def observe_memory(meter: Meter, held: Callable[[], Iterable[tuple[str, int, int]]]) -> None:
    """Gauges of results held in memory; ``held()`` yields (scheduler, tasks, bytes) per compute."""

    def totals() -> dict[str, list[int]]:
        # Every local scheduler reports, zero when idle: a flat line, not a gap, on dashboards.
        by_scheduler: dict[str, list[int]] = {name: [0, 0] for name in ("sync", "threads", "processes")}
        for scheduler, tasks, nbytes in held():
            entry = by_scheduler.setdefault(scheduler, [0, 0])
            entry[0] += tasks
            entry[1] += nbytes
        return by_scheduler

    # A collection calls tasks() then usage(): measuring the cache (a sizeof per result)
    # once serves both.
    measured: list[dict[str, list[int]]] = []

    def tasks(options: CallbackOptions) -> Iterable[Observation]:
        current = totals()
        measured[:] = [current]
        return [Observation(v[0], {"dask.scheduler": s}) for s, v in current.items()]

    def usage(options: CallbackOptions) -> Iterable[Observation]:
        current = measured.pop() if measured else totals()
        # Lying __sizeof__s can add up past OTLP's int64.
        return [Observation(min(v[1], INT64_MAX), {"dask.scheduler": s}) for s, v in current.items()]

    conventions.observe(meter, "dask.memory.tasks", [tasks])
    conventions.observe(meter, "dask.memory.usage", [usage])


def observe_delivery(meter: Meter, stats: Callable[[], dict[str, Any]]) -> None:
    """Telemetry health: what our pipeline exported, folded and could not deliver."""

    def counter(name: str, key: str, error_key: str | None) -> None:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            current = stats()
            if not current:  # nothing of ours exports through this provider right now
                return []
            points = [Observation(current.get(key, 0), {})]
            if error_key is not None:
                points.append(Observation(current.get(error_key, 0), {"error.type": "undelivered"}))
            return points

        conventions.observe(meter, name, [observe])

    counter("otel.sdk.exporter.span.exported", "spans_exported", "spans_undelivered")
    counter("otel.sdk.exporter.metric_data_point.exported", "points_exported", "points_undelivered")
    counter("dask.task.aggregated", "tasks_aggregated", None)
    counter("dask.task.recovered", "tasks_recovered", None)
