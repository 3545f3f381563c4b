"""What a lost worker took with it: the scheduler's count of tasks whose telemetry never left.

A worker turns the runs it finishes into spans on a thread and exports them within
about a second and a half; what its span budget leaves over it folds into aggregates it
emits only when the compute settles there. A worker killed outright (SIGKILL, the
kernel's OOM killer) takes all that with it, and Dask reruns only what the graph still
needs from it: a task whose result had already moved on would be missing from the trace,
and the compute's task count would not add up.

So the scheduler keeps a :class:`Ledger`. It sees every run finish (``processing ->
memory`` or ``-> erred``, with the worker and the run's ``compute`` times), and each
worker says on its stream to the scheduler (:func:`.adapter.say_to_scheduler`, in order
with its ``task-finished`` messages; an earlier otel_graph sent an event on :data:`TOPIC`) what its exporter delivered, counted by :class:`Deliveries`
per compute and prefix. Per worker the ledger holds the difference, per compute (its
traceparent) and prefix: O(computes x prefixes) however many tasks run, and nothing
once the worker's exports catch up. When a worker is removed, what is left is what it
took with it (:meth:`Ledger.lost`): the client that submitted the compute makes a span of
each prefix's share, marked ``dask.task.recovered``, so that the compute's spans again
account for every task.

A worker that closes (gracefully, or on SIGTERM) says so in its last report
(``closing``): what it has not delivered by then it delivers on its way out or counts as
undelivered itself, so the ledger drops it, and keeps only what runs there afterwards
(a SIGTERMed worker's last runs, which its closed telemetry no longer sees). Retirement
is the same: the scheduler removes a retiring worker before it closes.

Only a worker that said it keeps accounts (:meth:`Ledger.join`, first thing on its
stream) is tallied: one whose telemetry goes through someone else's exporter (an
in-process worker) cannot say what was delivered.

Task metrics are kept the same way by a :class:`MetricLedger`: every run a worker
finishes (task metrics count every task, traced or not), per prefix and outcome,
against the cumulative ``dask.task.duration`` counts of the worker's last delivered
metric export (:class:`MetricDeliveries`). What a lost worker took with it, one
instrumented client records into its own task metrics, marked ``dask.task.recovered``.

Limits: a kill within milliseconds of an export, before its report reaches the
scheduler, counts those tasks twice; a worker whose stream to the scheduler breaks while
it lives on has its unreported tasks counted as lost, though it may still deliver them.

Prefixes: past :data:`~otel_graph.telemetry.policy.MAX_AGGREGATES` of a compute on a worker, the
ledger folds them into ``OTHER_PREFIXES`` as the worker folds its aggregates. The two may
fold differently (the worker only folds what its budget leaves over), so a delivery that
finds no tally of its prefix is taken from the compute's others: a compute's total is
exact, the split between prefixes a best effort.

Failures are tallied apart, by their own prefix (every failed run gets a span of its
own, never folded), and a delivered error span is taken only from its prefix's failures:
a failed attempt that Dask retries (``retries=``) goes ``processing -> waiting``, so the
scheduler never tallies it, yet its worker delivers its span; taken from the successes,
it hid a success the worker still owed. Task metrics keep failures apart the same way.
A successful run the scheduler turns away (a task cancelled while it ran) is still
delivered by its worker and taken from the compute's tallies: that is the one way the
total can come out short.

Sessions: each report names the worker's telemetry (a number that grows within its
process). A report of a newer one starts that worker's accounts afresh: its
predecessor (taken off with ``uninstrument()``, then instrumented again) has settled its
own, and a late report of the predecessor, its goodbye included, is ignored rather than
end the successor's accounts.

>>> ledger = Ledger()
>>> ledger.join("w1")
>>> for i in range(3):
...     ledger.finished("w1", "00-ab-cd-01", "inc", start_s=10.0 + i, stop_s=10.5 + i)
>>> ledger.delivered("w1", [["00-ab-cd-01", "inc", 1, 500_000_000]])
>>> ledger.outstanding("w1")
2
>>> [(lost.prefix, lost.count, lost.duration_s) for lost in ledger.lost("w1")]
[('inc', 2, 1.0)]
>>> ledger.lost("w1")  # a worker is settled once
[]
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from otel_graph.naming import OTHER_PREFIXES, fold_prefix
from otel_graph.telemetry.metrics import MAX_METRIC_PREFIXES
from otel_graph.telemetry.policy import MAX_AGGREGATES

logger = logging.getLogger("otel_graph")

#: The event topic workers report deliveries on. No client subscribes to it; the
#: scheduler keeps its last events like any topic's (a short, bounded deque).
TOPIC = "otel-graph-delivered"
#: Computes a worker's ledger keeps open at most (a collector down for good, or a tight loop
#: of computes whose aggregates wait 30 s to settle): past it the oldest is dropped, counted
#: in ``Ledger.untracked`` and said once.
MAX_OPEN_COMPUTES = 1024


class Lost(NamedTuple):
    """Tasks of one prefix of one compute whose telemetry a removed worker took with it."""

    traceparent: str
    prefix: str
    count: int
    duration_s: float
    start_s: float
    stop_s: float


@dataclass
class _Tally:
    count: int = 0
    duration_ns: int = 0
    start_s: float = float("inf")
    stop_s: float = 0.0


class _Compute:
    __slots__ = ("tallies", "failures", "folded")

    def __init__(self) -> None:
        self.tallies: dict[str, _Tally] = {}
        #: Failed runs, by their own prefix (a failure's span is never folded).
        self.failures: dict[str, _Tally] = {}
        self.folded: set[str] = set()

    def __bool__(self) -> bool:
        return bool(self.tallies or self.failures)

    def take(self, prefix: str, count: int, duration_ns: int, *, failed: bool = False) -> None:
        """Take delivered tasks off, from their prefix's tally first, then from the others;
        failures only from their own prefix's."""
        tallies = self.failures if failed else self.tallies
        order = [prefix] if prefix in tallies else []
        if not failed:
            order += [OTHER_PREFIXES] if prefix != OTHER_PREFIXES and OTHER_PREFIXES in tallies else []
            order += [name for name in tallies if name not in order]
        for name in order:
            if count <= 0:
                break
            tally = tallies[name]
            taken = min(count, tally.count)
            share = duration_ns if taken == count else duration_ns * taken // count
            tally.count -= taken
            tally.duration_ns = max(0, tally.duration_ns - share)
            count, duration_ns = count - taken, duration_ns - share
            if tally.count <= 0:
                del tallies[name]


def _rows(entries: Any) -> Iterator[tuple[Any, Any, int, int, bool]]:
    """The well-formed rows of a worker's report: a text and a text or flag, then a count and
    nanoseconds, and whether they failed (a fifth value; absent from an older worker's rows)."""
    if not isinstance(entries, (list, tuple)):  # msgpack makes lists tuples
        return
    for entry in entries:
        try:
            first, second, count, duration_ns, *rest = entry
            row = first, second, int(count), int(duration_ns), bool(rest and rest[0] is True)
        except (TypeError, ValueError, OverflowError):  # too few values; not numbers; inf
            continue
        if isinstance(first, str) and isinstance(second, (str, bool)) and len(rest) <= 1:
            yield row


def _tallies(compute: _Compute) -> Iterator[_Tally]:
    yield from compute.tallies.values()
    yield from compute.failures.values()


class Ledger:
    """On the scheduler: per worker, what ran there and was not yet delivered."""

    def __init__(self) -> None:
        self._workers: dict[str, OrderedDict[str, _Compute]] = {}
        #: Workers that said they are closing: later reports are theirs to settle.
        self._closing: set[str] = set()
        #: Tasks dropped from a ledger that grew past MAX_OPEN_COMPUTES computes.
        self.untracked = 0

    def join(self, worker: str) -> None:
        self._workers.setdefault(worker, OrderedDict())

    def keeps(self, worker: str) -> bool:
        return worker in self._workers

    def finished(self, worker: str, traceparent: str, prefix: str, *, start_s: float, stop_s: float,
                 failed: bool = False) -> None:
        computes = self._workers.get(worker)
        if computes is None:
            return
        compute = computes.get(traceparent)
        if compute is None:
            compute = computes[traceparent] = _Compute()
            while len(computes) > MAX_OPEN_COMPUTES:
                _, dropped = computes.popitem(last=False)
                if not self.untracked:
                    logger.warning("otel_graph: worker %s holds undelivered telemetry of more than %d computes "
                                   "(a collector that does not take it, or aggregates waiting for their "
                                   "computes to settle); the scheduler stops keeping count of the oldest, whose "
                                   "tasks a loss of that worker would take with it uncounted",
                                   worker, MAX_OPEN_COMPUTES)
                self.untracked += sum(t.count for t in _tallies(dropped))
        if failed:
            tallies, label = compute.failures, prefix
        else:  # folded as the worker's SpanPlan folds its aggregates
            tallies, label = compute.tallies, fold_prefix(prefix, compute.folded, limit=MAX_AGGREGATES)
        tally = tallies.get(label)
        if tally is None:
            tally = tallies[label] = _Tally()
        tally.count += 1
        tally.duration_ns += max(0, int((stop_s - start_s) * 1e9))
        tally.start_s = min(tally.start_s, start_s)
        tally.stop_s = max(tally.stop_s, stop_s)

    def delivered(self, worker: str, entries: Any, *, closing: bool = False) -> None:
        """A worker's report: ``[traceparent, prefix, tasks, duration_ns, failed]`` rows. Never raises."""
        computes = self._workers.get(worker)
        if computes is None or worker in self._closing:
            return
        if closing:
            self._closing.add(worker)
            self._workers[worker] = OrderedDict()
            return
        for traceparent, prefix, count, duration_ns, failed in _rows(entries):
            compute = computes.get(traceparent)
            if compute is None or count <= 0:
                continue
            compute.take(str(prefix), count, max(0, duration_ns), failed=failed)
            if not compute:
                del computes[traceparent]

    def outstanding(self, worker: str) -> int:
        """Tasks that ran on ``worker`` whose telemetry it has not reported delivered."""
        return sum(t.count for compute in self._workers.get(worker, {}).values() for t in _tallies(compute))

    def lost(self, worker: str) -> list[Lost]:
        """What the worker took with it; its ledger is closed."""
        computes = self._workers.pop(worker, None) or {}
        self._closing.discard(worker)
        return [Lost(traceparent, prefix, tally.count, tally.duration_ns / 1e9, tally.start_s, tally.stop_s)
                for traceparent, compute in computes.items()
                for prefix, tally in (*compute.tallies.items(), *compute.failures.items()) if tally.count > 0]

    def forget(self, worker: str) -> None:
        self._workers.pop(worker, None)
        self._closing.discard(worker)


class LostRuns(NamedTuple):
    """Runs of one prefix and outcome whose task metrics a removed worker took with it."""

    prefix: str  # OTHER_PREFIXES: those the worker labelled otel.metric.overflow
    failed: bool
    count: int
    duration_s: float


class _WorkerRuns:
    __slots__ = ("finished", "delivered", "labels", "closing")

    def __init__(self) -> None:
        #: (label, failed) -> [runs, summed duration ns]: finished there, and as last delivered.
        self.finished: dict[tuple[str, bool], list[int]] = {}
        self.delivered: dict[tuple[str, bool], list[int]] = {}
        self.labels: set[str] = set()
        self.closing = False


class MetricLedger:
    """On the scheduler: per worker, runs finished against its delivered task metrics.

    >>> runs = MetricLedger()
    >>> runs.join("w1")
    >>> for _ in range(3):
    ...     runs.finished("w1", "inc", failed=False, duration_s=0.5)
    >>> runs.delivered("w1", [["inc", False, 1, 500_000_000]])  # cumulative counts
    >>> runs.lost("w1")
    [LostRuns(prefix='inc', failed=False, count=2, duration_s=1.0)]
    """

    def __init__(self) -> None:
        self._workers: dict[str, _WorkerRuns] = {}

    def join(self, worker: str) -> None:
        self._workers.setdefault(worker, _WorkerRuns())

    def finished(self, worker: str, prefix: str, *, failed: bool, duration_s: float) -> None:
        runs = self._workers.get(worker)
        if runs is None:
            return
        # Labelled as the worker labels its metrics: its first MAX_METRIC_PREFIXES prefixes.
        prefix = fold_prefix(prefix, runs.labels, limit=MAX_METRIC_PREFIXES)
        tally = runs.finished.get((prefix, failed))
        if tally is None:
            tally = runs.finished[(prefix, failed)] = [0, 0]
        tally[0] += 1
        tally[1] += max(0, int(duration_s * 1e9))

    def delivered(self, worker: str, entries: Any, *, closing: bool = False) -> None:
        """A worker's report: ``[label, failed, runs, duration_ns]`` rows, cumulative. Never raises."""
        runs = self._workers.get(worker)
        if runs is None or runs.closing:
            return
        if closing:  # what it has not delivered is its own to deliver or count, from here on
            runs.finished, runs.delivered, runs.closing = {}, {}, True
            return
        for label, failed, count, duration_ns, _ in _rows(entries):
            if count >= 0:
                runs.delivered[(str(label), bool(failed))] = [count, max(0, duration_ns)]

    def lost(self, worker: str) -> list[LostRuns]:
        """What the worker took with it; its ledger is closed.

        Per label, finished less delivered. Deliveries under a label the scheduler did not
        count (the two fold past the limit differently) are taken from the others of the
        same outcome, the overflow label first: the total is exact, the split a best effort.
        Failures are never taken from successes: the scheduler does not count a failed
        attempt that Dask retries, which its worker's metrics do count.
        """
        runs = self._workers.pop(worker, None)
        if runs is None:
            return []
        left: dict[tuple[str, bool], list[int]] = {}
        surplus = {False: 0, True: 0}
        for key in {*runs.finished, *runs.delivered}:
            done, sent = runs.finished.get(key, [0, 0]), runs.delivered.get(key, [0, 0])
            count, duration_ns = done[0] - sent[0], done[1] - sent[1]
            if count > 0:
                left[key] = [count, max(0, duration_ns)]
            elif count < 0:
                surplus[key[1]] -= count
        for key in sorted(left, key=lambda k: k[0] != OTHER_PREFIXES):
            taken = min(surplus[key[1]], left[key][0])
            if taken <= 0:
                continue
            left[key][1] -= left[key][1] * taken // left[key][0]
            left[key][0] -= taken
            surplus[key[1]] -= taken
        return [LostRuns(label, failed, count, duration_ns / 1e9)
                for (label, failed), (count, duration_ns) in left.items() if count > 0]

    def forget(self, worker: str) -> None:
        self._workers.pop(worker, None)


class Deliveries:
    """In a worker process: what its span exporter delivered, per worker, compute and prefix.

    Fed from the exporter's thread (:meth:`count`, with each batch the collector took);
    each worker takes its own rows (:meth:`take`) to report them. A task span counts one
    task (a failed one apart: its status is ERROR), an aggregate its ``dask.task.count``;
    other spans (transfer and spill phases, computes, recovered tasks) none.

    >>> from types import SimpleNamespace as NS
    >>> parent = NS(trace_id=0xAB, span_id=0xCD, trace_flags=1)
    >>> on_w1 = {"dask.task.prefix": "inc", "dask.worker.id": "w1"}
    >>> task = NS(parent=parent, start_time=0, end_time=5, attributes=on_w1)
    >>> folded = NS(parent=parent, start_time=0, end_time=9, attributes={
    ...     **on_w1, "dask.task.count": 4, "dask.task.duration.sum": 2.0})
    >>> deliveries = Deliveries()
    >>> deliveries.count([task, folded])
    >>> deliveries.take("w2"), deliveries.take("w1") == [
    ...     [f"00-{0xAB:032x}-{0xCD:016x}-01", "inc", 5, 2_000_000_005, False]]
    ([], True)
    """

    def __init__(self) -> None:
        import threading

        self._lock = threading.Lock()
        self._counts: dict[str, dict[tuple[str, str, bool], list[int]]] = {}

    def count(self, spans: Any) -> None:
        from opentelemetry.trace import StatusCode

        counted: dict[tuple[str, str, str, bool], list[int]] = {}
        for span in spans:
            attributes = span.attributes or {}
            prefix = attributes.get("dask.task.prefix")
            worker = attributes.get("dask.worker.id")
            parent = span.parent
            if prefix is None or worker is None or parent is None or "dask.task.recovered" in attributes:
                continue
            tasks = attributes.get("dask.task.count", 1)
            if "dask.task.duration.sum" in attributes:
                duration_ns = int(attributes["dask.task.duration.sum"] * 1e9)
            else:
                duration_ns = (span.end_time or 0) - (span.start_time or 0)
            traceparent = f"00-{parent.trace_id:032x}-{parent.span_id:016x}-{int(parent.trace_flags):02x}"
            status = getattr(span, "status", None)
            key = (worker, traceparent, prefix, getattr(status, "status_code", None) is StatusCode.ERROR)
            row = counted.get(key)
            if row is None:
                row = counted[key] = [0, 0]
            row[0] += tasks
            row[1] += duration_ns
        if not counted:
            return
        with self._lock:
            for (worker, traceparent, prefix, failed), (tasks, duration_ns) in counted.items():
                row = self._counts.setdefault(worker, {}).setdefault((traceparent, prefix, failed), [0, 0])
                row[0] += tasks
                row[1] += duration_ns

    def take(self, worker: str) -> list[list[Any]]:
        with self._lock:
            counts = self._counts.pop(worker, {})
        return [[traceparent, prefix, tasks, duration_ns, failed]
                for (traceparent, prefix, failed), (tasks, duration_ns) in counts.items()]


class MetricDeliveries:
    """In a worker process: the cumulative ``dask.task.duration`` counts its metric exporter delivered.

    Fed with each delivered export (:meth:`count`), delta temporality summed up;
    :meth:`take` returns every label's totals when they changed since the last take.

    >>> from types import SimpleNamespace as NS
    >>> point = NS(attributes={"dask.task.prefix": "inc", "dask.task.outcome": "success"}, count=3, sum=0.25)
    >>> metric = NS(name="dask.task.duration", data=NS(aggregation_temporality=2, data_points=[point]))
    >>> data = NS(resource_metrics=[NS(scope_metrics=[NS(metrics=[metric])])])
    >>> deliveries = MetricDeliveries()
    >>> deliveries.count(data)
    >>> deliveries.take(), deliveries.take()
    ([['inc', False, 3, 250000000]], [])
    """

    def __init__(self) -> None:
        import threading

        self._lock = threading.Lock()
        self._totals: dict[tuple[str, bool], list[int]] = {}
        self._changed = False

    def count(self, metrics_data: Any) -> None:
        seen: dict[tuple[str, bool], list[int]] = {}
        delta = False
        for resource in metrics_data.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name != "dask.task.duration":
                        continue
                    delta = int(getattr(metric.data, "aggregation_temporality", 2)) == 1  # DELTA
                    for point in metric.data.data_points:
                        attributes = point.attributes or {}
                        key = (str(attributes.get("dask.task.prefix", OTHER_PREFIXES)),
                               attributes.get("dask.task.outcome") == "error")
                        row = seen.setdefault(key, [0, 0])
                        row[0] += int(point.count)
                        row[1] += int(point.sum * 1e9)
        if not seen:
            return
        with self._lock:
            for key, (count, duration_ns) in seen.items():
                total = self._totals.setdefault(key, [0, 0])
                if delta:
                    total[0] += count
                    total[1] += duration_ns
                elif total != [count, duration_ns]:
                    total[0], total[1] = count, duration_ns
                else:
                    continue
                self._changed = True

    def totals(self) -> dict[tuple[str, bool], tuple[int, int]]:
        with self._lock:
            return {key: (count, duration_ns) for key, (count, duration_ns) in self._totals.items()}

    def take(self, *, since: dict[tuple[str, bool], tuple[int, int]] | None = None) -> list[list[Any]]:
        """Every label's totals if they changed, less ``since``: :meth:`totals` when a worker's
        telemetry began (the process's SDK counts from the process's start; a scheduler's
        ledger, from the telemetry's)."""
        base = since or {}
        with self._lock:
            if not self._changed:
                return []
            self._changed = False
            return [[label, failed, count - base.get((label, failed), (0, 0))[0],
                     duration_ns - base.get((label, failed), (0, 0))[1]]
                    for (label, failed), (count, duration_ns) in self._totals.items()]
