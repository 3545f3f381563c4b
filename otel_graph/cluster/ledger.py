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
with its ``task-finished`` messages; an earlier otel_graph sent an event on :data:`TOPIC`)
what its exporter delivered, counted per compute and prefix by :class:`.deliveries.Deliveries`.
Per worker the ledger holds the difference, per compute (its traceparent) and prefix:
O(computes x prefixes) however many tasks run, and nothing once the worker's exports
catch up. When a worker is removed, what is left is what it took with it
(:meth:`Ledger.lost`): the client that submitted the compute makes a span of each
prefix's share, marked ``dask.task.recovered``, so that the compute's spans again account
for every task.

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
metric export (:class:`.deliveries.MetricDeliveries`). What a lost worker took with it, one
instrumented client records into its own task metrics, marked ``dask.task.recovered``.

One life cycle, two books: both ledgers are an :class:`_Accounts`, which keeps each
worker's book from :meth:`~_Accounts.join` through its reports and its goodbye to
:meth:`~_Accounts.lost` (a worker removed) or :meth:`~_Accounts.forget` (retired, or its
telemetry replaced). What a book holds is each ledger's own: a :class:`Ledger` book the
tallies of each open compute, taken down by the deltas a worker reports; a
:class:`MetricLedger` book the runs finished and the totals last delivered, compared
only when the worker is lost.

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
it would hide a success the worker still owes. Task metrics keep failures apart the same way.
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
from typing import Any, Generic, NamedTuple, TypeVar

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
    # Shadows tuple.count (mypy: incompatible with the base's method); kept, read as .count by
    # the scheduler plugin and the tests, and the method is never called on a Lost.
    count: int  # type: ignore[assignment]
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


def _tallies(compute: _Compute) -> Iterator[_Tally]:
    yield from compute.tallies.values()
    yield from compute.failures.values()


#: A row of a worker's report, as :func:`_rows` reads it.
_Row = tuple[Any, Any, int, int, bool]


def _rows(entries: Any) -> Iterator[_Row]:
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


_Book = TypeVar("_Book")
_Loss = TypeVar("_Loss")


class _Accounts(Generic[_Book, _Loss]):
    """Per worker, a book of what ran there against what it delivered, through one life cycle.

    A worker's book opens when it says it keeps accounts (:meth:`join`); from then on each
    run it finishes is entered, and each report (:meth:`delivered`) takes off what its
    exporter delivered, until its goodbye (``closing``) or its removal: settled as lost
    (:meth:`lost`), or dropped (:meth:`forget`). A subclass says what a book holds
    through four hooks: :meth:`_open` a new one, :meth:`_take` a report's rows off it,
    :meth:`_clear` it at the worker's goodbye, :meth:`_settle` what is left of it.
    """

    def __init__(self) -> None:
        self._books: dict[str, _Book] = {}
        #: Workers that said they are closing: later reports are theirs to settle.
        self._closing: set[str] = set()

    def join(self, worker: str) -> None:
        if worker not in self._books:
            self._books[worker] = self._open()

    def keeps(self, worker: str) -> bool:
        return worker in self._books

    def delivered(self, worker: str, entries: Any, *, closing: bool = False) -> None:
        """A worker's report (rows as :func:`_rows` reads them). Never raises."""
        book = self._books.get(worker)
        if book is None or worker in self._closing:
            return
        if closing:  # what it has not delivered is its own to deliver or count, from here on
            self._closing.add(worker)
            self._clear(book)
            return
        self._take(book, _rows(entries))

    def lost(self, worker: str) -> list[_Loss]:
        """What the worker took with it; its book is closed."""
        book = self._books.pop(worker, None)
        self._closing.discard(worker)
        return [] if book is None else self._settle(book)

    def forget(self, worker: str) -> None:
        self._books.pop(worker, None)
        self._closing.discard(worker)

    def _open(self) -> _Book:
        raise NotImplementedError

    def _take(self, book: _Book, rows: Iterator[_Row]) -> None:
        raise NotImplementedError

    def _clear(self, book: _Book) -> None:
        raise NotImplementedError

    def _settle(self, book: _Book) -> list[_Loss]:
        raise NotImplementedError


class Ledger(_Accounts[OrderedDict[str, _Compute], Lost]):
    """On the scheduler: per worker, what ran there and was not yet delivered, per compute and prefix."""

    def __init__(self) -> None:
        super().__init__()
        #: Tasks dropped from a ledger that grew past MAX_OPEN_COMPUTES computes.
        self.untracked = 0

    def finished(self, worker: str, traceparent: str, prefix: str, *, start_s: float, stop_s: float,
                 failed: bool = False) -> None:
        computes = self._books.get(worker)
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

    def outstanding(self, worker: str) -> int:
        """Tasks that ran on ``worker`` whose telemetry it has not reported delivered."""
        return sum(t.count for compute in self._books.get(worker, {}).values() for t in _tallies(compute))

    def _open(self) -> OrderedDict[str, _Compute]:
        return OrderedDict()

    def _take(self, computes: OrderedDict[str, _Compute], rows: Iterator[_Row]) -> None:
        """``[traceparent, prefix, tasks, duration_ns, failed]`` rows, delivered since the last report."""
        for traceparent, prefix, count, duration_ns, failed in rows:
            compute = computes.get(traceparent)
            if compute is None or count <= 0:
                continue
            compute.take(str(prefix), count, max(0, duration_ns), failed=failed)
            if not compute:
                del computes[traceparent]

    def _clear(self, computes: OrderedDict[str, _Compute]) -> None:
        computes.clear()

    def _settle(self, computes: OrderedDict[str, _Compute]) -> list[Lost]:
        return [Lost(traceparent, prefix, tally.count, tally.duration_ns / 1e9, tally.start_s, tally.stop_s)
                for traceparent, compute in computes.items()
                for prefix, tally in (*compute.tallies.items(), *compute.failures.items()) if tally.count > 0]


class LostRuns(NamedTuple):
    """Runs of one prefix and outcome whose task metrics a removed worker took with it."""

    prefix: str  # OTHER_PREFIXES: those the worker labelled otel.metric.overflow
    failed: bool
    # As Lost.count: shadows tuple.count, kept for its readers (the doctest's repr, the tests).
    count: int  # type: ignore[assignment]
    duration_s: float


class _Runs:
    """One worker's runs, as the scheduler saw them finish and as its metrics last delivered them."""

    __slots__ = ("finished", "delivered", "labels")

    def __init__(self) -> None:
        #: (label, failed) -> [runs, summed duration ns]: finished there, and as last delivered.
        self.finished: dict[tuple[str, bool], list[int]] = {}
        self.delivered: dict[tuple[str, bool], list[int]] = {}
        self.labels: set[str] = set()


class MetricLedger(_Accounts[_Runs, LostRuns]):
    """On the scheduler: per worker, runs finished against its delivered task metrics.

    >>> runs = MetricLedger()
    >>> runs.join("w1")
    >>> for _ in range(3):
    ...     runs.finished("w1", "inc", failed=False, duration_s=0.5)
    >>> runs.delivered("w1", [["inc", False, 1, 500_000_000]])  # cumulative counts
    >>> runs.lost("w1")
    [LostRuns(prefix='inc', failed=False, count=2, duration_s=1.0)]
    """

    def finished(self, worker: str, prefix: str, *, failed: bool, duration_s: float) -> None:
        runs = self._books.get(worker)
        if runs is None:
            return
        # Labelled as the worker labels its metrics: its first MAX_METRIC_PREFIXES prefixes.
        prefix = fold_prefix(prefix, runs.labels, limit=MAX_METRIC_PREFIXES)
        tally = runs.finished.get((prefix, failed))
        if tally is None:
            tally = runs.finished[(prefix, failed)] = [0, 0]
        tally[0] += 1
        tally[1] += max(0, int(duration_s * 1e9))

    def _open(self) -> _Runs:
        return _Runs()

    def _take(self, runs: _Runs, rows: Iterator[_Row]) -> None:
        """``[label, failed, runs, duration_ns]`` rows, cumulative: each replaces the last."""
        for label, failed, count, duration_ns, _ in rows:
            if count >= 0:
                runs.delivered[(str(label), bool(failed))] = [count, max(0, duration_ns)]

    def _clear(self, runs: _Runs) -> None:
        # The labels stay: the worker goes on labelling its metrics by the prefixes it saw first.
        runs.finished, runs.delivered = {}, {}

    def _settle(self, runs: _Runs) -> list[LostRuns]:
        """Per label, finished less delivered.

        Deliveries under a label the scheduler did not count (the two fold past the limit
        differently) are taken from the others of the same outcome, the overflow label
        first: the total is exact, the split a best effort. Failures are never taken from
        successes: the scheduler does not count a failed attempt that Dask retries, which
        its worker's metrics do count.
        """
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
