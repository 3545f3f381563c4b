"""The drain of one compute: its task records turned into spans, aggregates, progress spans and metrics.

A :class:`Drainer` is the tracker's span maker (:mod:`otel_graph.telemetry.tracker` owns one,
and decides when and in which thread each compute is drained). :meth:`Drainer.drain` takes
the task records waiting in a compute's ``sink`` and:

* for a compute that ended, every task reported, within the first half of the span budget
  (most computes): makes a span per task, its root's end, and its metrics at once, queued
  together (:meth:`Drainer._drain_whole`), with no span plan;
* for any other: feeds the records, a slice at a time, to the compute's span plan
  (:mod:`otel_graph.telemetry.policy`), which gives tasks spans within the budget and folds
  the rest into aggregates, and to the task metrics; a compute still running then gets a
  ``dask.compute.progress`` span now and then (:meth:`Drainer._progress`); one ended, all its
  tasks accounted for (or :data:`STRAGGLER_WAIT_NS` after it failed), gets its aggregates,
  its root's ``dask.graph.tasks``, error and end, and is forgotten (:meth:`Drainer.finish`).

Spans are encoded as they are made where the emitter can (``encoded_batch``), and queued a
batch at a time. Making spans and queueing them holds :attr:`Drainer.building`, which the
tracker's ``stop()`` takes to count what is left; once it sets :attr:`Drainer.halt`, no span
is made and what is left stays counted as unbuilt.

Progress spans: a root span is only exported when it ends, so without them a 10-hour job's
trace has no span of its own, only task spans, until the end; with them Jaeger finds the
running compute by the ``dask.compute.progress`` operation and shows how far it got (the
idea of Logfire's "pending spans"). The first comes once a compute has run
:data:`FIRST_PROGRESS_NS`, covering its run so far, then one per ``progress_interval_s``,
the interval doubling every :data:`PROGRESS_SPANS_PER_STEP`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, cast

from opentelemetry.trace import Status, StatusCode

from otel_graph.naming import task_prefix
from otel_graph.telemetry.attributes import (
    aggregate_attributes,
    exception_event_attributes,
    task_attributes,
    task_facts,
)
from otel_graph.telemetry.compute_record import ComputeRecord
from otel_graph.telemetry.compute_span import ComputeSpan
from otel_graph.telemetry.events import AT_KEY, TaskEvent, describe_exception
from otel_graph.telemetry.job import graph_fingerprint
from otel_graph.telemetry.metrics import Compute, Run, TaskMetrics, outcome_totals, run_totals
from otel_graph.telemetry.policy import Aggregate, SpanPlan
from otel_graph.telemetry.task_encoding import TaskAttributeEncoder

logger = logging.getLogger("otel_graph")

#: How long an ended compute waits for tasks still running when it failed; those
#: tasks' results are discarded by Dask, and past this we stop waiting for their records.
STRAGGLER_WAIT_NS = 30 * 10**9
#: A compute running this long at a drain gets its first progress span: computes shorter
#: than it, nearly all of them, cost nothing more.
FIRST_PROGRESS_NS = 10**9
#: After this many progress spans a compute's progress interval doubles, and again after
#: as many more: a trace's span count stays bounded (a 24-hour job at 30 s: 500, not 2,880).
PROGRESS_SPANS_PER_STEP = 100
PROGRESS_SPAN = "dask.compute.progress"
#: Task events turned into TaskEvents and consumed at a time (see Drainer.drain).
EVENT_SLICE = 2048
#: ... in slices this small, the GIL handed back between them: a pool thread whose task ends
#: meanwhile waits for one slice (tens of µs), not for the whole drain.
YIELD_SLICE = 32
#: Spans a batch of a large compute's holds before it is queued: the export thread starts on
#: them while the rest are made (a compute's last spans are what its flush waits for).
BATCH_SPANS = 256
#: The keyword arguments of a task span without a span id given out while it ran.
_NO_EXTRA: dict[str, Any] = {}


class Drainer:
    """Makes the telemetry of computes' task records; from the tracker's thread, or the one that computed.

    ``forget`` is the tracker's: called with a compute once its telemetry is made (or abandoned).
    """

    def __init__(self, *, emitter: Any, metrics: TaskMetrics, max_task_spans: int | None, whole_max_tasks: int,
                 progress_interval_s: float, early_drain_tasks: int | None,
                 forget: Callable[[ComputeRecord], None]) -> None:
        self.emitter = emitter
        self.metrics = metrics
        # A successful task's span is encoded straight from its record where the emitter can
        # (otel_graph.telemetry.task_encoding), into a batch queued at once: no attribute dict, no span
        # context, one lock round trip per batch.
        self._encoded_batch = getattr(emitter, "encoded_batch", None)
        self.task_encoder = TaskAttributeEncoder()
        self._budget = max_task_spans
        #: A compute of at most this many tasks is drained whole, a span each (see _drain_whole):
        #: small, as it is drained holding ``building`` and made TaskEvents at once.
        self.whole_budget = whole_max_tasks if max_task_spans is None else \
            min(whole_max_tasks, max_task_spans - max_task_spans // 2)
        self._early_events = early_drain_tasks
        self._progress_ns = int(progress_interval_s * 1e9)
        self._forget = forget
        #: Set when stop() gives up on what is left: no span is made after it, and what is left
        #: stays counted as unbuilt (the tracker's unprocessed()), not built unseen.
        self.halt = False
        #: Held while spans are made and queued (a compute drained whole, a slice of a large
        #: one's task records, a compute's end, computes set aside), and while stop() counts
        #: what is left: a count
        #: taken while spans were being made counted them twice, as unbuilt and then as spans.
        self.building = threading.RLock()
        self.tasks_aggregated = 0
        self.processing_errors = 0
        #: Spans whose making raised (:meth:`span_failed`): task and aggregate spans, and each
        #: span of a batch the processors refused (a compute's, or a slice of a large one's).
        self.span_errors = 0

    def drain_guarded(self, record: ComputeRecord) -> None:
        """:meth:`drain`; a compute that fails it is counted and its root span closed, and
        one bad compute never stops telemetry for the rest."""
        try:
            self.drain(record)
        except Exception:
            self.processing_errors += 1
            logger.debug("otel_graph: failed to process a compute", exc_info=True)
            try:
                self._abandon(record)
            except Exception:
                logger.debug("otel_graph: failed to close a compute's span", exc_info=True)

    def _whole(self, record: ComputeRecord) -> bool:
        """Whether ``record``, ended with all its tasks reported, is drained whole (:meth:`_drain_whole`)."""
        return record.plan is None and not record.task_span_ids and len(record.sink) <= self.whole_budget

    def drain(self, record: ComputeRecord) -> None:
        """The task records waiting in ``record``'s sink made telemetry, and the compute finished
        if it ended and every task reported. Raises what its making raises (:meth:`drain_guarded`)."""
        plan = record.plan
        if record.end_ns is not None and record.all_reported() and self._whole(record):
            self._drain_whole(record)
            return
        if plan is None:
            plan = record.plan = SpanPlan(
                budget=self._budget,
                emit=lambda ev, prefix: self._task_span(record, ev, prefix, record.batch),
                emit_aggregate=lambda agg: self._aggregate_span(record, agg),
                keep=record.task_span_ids,
            )
        with self.building:
            taken = self._take(record)
        count = len(taken)
        # A compute running on a pool: its threads may take the GIL between slices (YIELD_SLICE).
        step = YIELD_SLICE if record.early_at is not None and record.end_ns is None else EVENT_SLICE
        # Plain tuples until now (see task_runner.execute). Made TaskEvents a slice at a time,
        # so that those not kept die young: a large compute's all at once would outlive
        # collections, and their promotion set off a full one on the tracker's drain.
        for start in range(0, count, step):
            if start and step == YIELD_SLICE and record.end_ns is None:  # ended meanwhile: no one to yield to
                time.sleep(0)  # lets go of the GIL: a pool thread asking for it may take it
            events = list(map(TaskEvent._make, taken[start:start + step]))
            with self.building:  # a slice's spans are queued before stop() can count them
                if self.halt:
                    return
                self._open_batch(record)
                try:
                    self._consume(record, plan, events)
                finally:
                    self._close_batch(record)
        if self.halt:
            return
        if record.end_ns is None:
            try:
                self._progress(record)
            except Exception:  # a progress span refused must not end a compute still running
                self.processing_errors += 1
                logger.debug("otel_graph: failed to emit a progress span", exc_info=True)
            return
        settled = record.seen + record.lost >= record.submitted
        if settled or time.time_ns() + record.shift_ns - record.end_ns > STRAGGLER_WAIT_NS:
            self.finish(record, plan)

    def _drain_whole(self, record: ComputeRecord) -> None:
        """A compute that ended, all its tasks reported, within the first half of the span
        budget (which gives tasks spans as they come): what :meth:`drain` would do, with no
        span plan. Most computes are this small; made and ended at once, they pay for no plan,
        and their spans, the root's too, are queued together, as are their metrics."""
        _fingerprint(record)
        with self.building:
            if self.halt:
                return
            taken = self._take(record)
            batch = self._new_batch(record.sampled)
            runs = None
            try:
                runs = self._whole_tasks(record, taken, batch) if taken else None
                if not self.halt:  # halted meanwhile: what is left stays counted as unbuilt
                    ended, runs = runs, None  # _end records them with the compute, once, whatever fails
                    self._end(record, None, batch, ended)
            finally:
                if runs:  # not ended (halted, or a failure): its tasks' runs still count
                    self.metrics.record_runs(runs)
                if batch:
                    self.queue_batch(batch)

    def _take(self, record: ComputeRecord) -> list[tuple[Any, ...]]:
        """Under ``building``: the events in the sink, now counted as seen (seen whenever
        not in the sink, for stop()'s count). Appends may land meanwhile; they stay."""
        sink = record.sink
        count = len(sink)
        taken = sink[:count]
        del sink[:count]
        record.seen += count
        if record.early_at is not None:  # the sink is empty again: capture asks once it fills anew
            record.early_at = self._early_events
        return taken

    def _consume(self, record: ComputeRecord, plan: SpanPlan[TaskEvent] | None, events: list[TaskEvent]) -> None:
        """Task metrics for ``events``, and their spans through ``plan`` (None: a span each)."""
        prefixes = [task_prefix(ev.key) for ev in events]
        self.metrics.record_tasks(events, prefixes, record.scheduler)
        # The compute's own totals (dask.compute.failed_tasks, .output.size).
        failed, nbytes = outcome_totals((ev.error is not None, ev.nbytes) for ev in events)
        record.failed_tasks += failed
        record.output_bytes += nbytes
        if not record.sampled:
            return
        if plan is not None:
            plan.add(events, prefixes)
            return
        for ev, prefix in zip(events, prefixes, strict=False):
            self._task_span(record, ev, prefix)

    def _whole_tasks(self, record: ComputeRecord, taken: list[tuple[Any, ...]], batch: Any) -> list[Run] | None:
        """Under ``building``: the spans of a compute drained whole, and its task runs, to be
        recorded with its end (None: recorded already). Where ``batch`` takes spans encoded,
        its task records become runs and spans in one pass (a pass each was a good part of what
        tracing a one-task compute cost). What raises there (a malformed record) abandons the
        compute, as anywhere in a drain."""
        if batch is None:
            self._consume(record, None, list(map(TaskEvent._make, taken)))
            return None
        known: dict[int, str] = {}
        graph, state = record.graph, record.state
        runs, left = batch.add_tasks(record.span_context, [(raw, task_facts(raw[AT_KEY], graph, state, known=known))
                                                           for raw in taken],
                                     self.metrics.label, record.scheduler, self.task_encoder.encode)
        record.in_spans += len(taken) - len(left)
        for ev, prefix in left:
            self._task_span(record, ev, prefix)
        return runs

    def _new_batch(self, sampled: bool) -> Any:
        """Somewhere to keep the spans about to be made of a compute encoded, to queue them
        together (one lock round trip per compute, or per slice of a large one's task records,
        not per span). None where spans are not encoded as they end, or the compute is unsampled."""
        if self._encoded_batch is not None and sampled:
            try:
                return self._encoded_batch()
            except Exception:  # then each span is handed over on its own
                logger.debug("otel_graph: could not start a batch of encoded spans", exc_info=True)
        return None

    def _open_batch(self, record: ComputeRecord) -> Any:
        """:meth:`_new_batch`, kept as ``record.batch``, where its span plan's emit finds it."""
        batch = record.batch = self._new_batch(record.sampled)
        return batch

    def _close_batch(self, record: ComputeRecord) -> None:
        """Queue the spans :meth:`_open_batch`'s batch took (under ``building``, with them)."""
        batch, record.batch = record.batch, None
        if batch:
            self.queue_batch(batch)

    def queue_batch(self, batch: Any) -> None:
        """Queue ``batch``'s spans, which empties it; refused, each counts in ``span_errors``."""
        count = len(batch)  # a refused batch is emptied all the same
        try:
            batch.queue()
        except Exception as exc:
            self.span_failed(exc, count)

    def _progress(self, record: ComputeRecord) -> None:
        if not record.sampled:
            return
        now = time.time_ns() + record.shift_ns
        since, wait = ((record.start_ns, FIRST_PROGRESS_NS) if record.progress_ns is None else
                       (record.progress_ns, self._progress_ns << (record.progress_spans // PROGRESS_SPANS_PER_STEP)))
        if now - since < wait:
            return
        record.progress_ns = now
        record.progress_spans += 1
        attributes: dict[str, Any] = {"dask.scheduler": record.scheduler}
        if record.graph_tasks is not None:
            attributes["dask.graph.tasks"] = record.graph_tasks
        if record.scheduler != "distributed":  # there the workers see the tasks, not this process
            attributes["dask.compute.tasks_done"] = record.seen
            state = record.state
            if state is not None:
                # len() of Dask's containers is atomic: safe while the scheduler changes them.
                attributes["dask.compute.tasks_running"] = len(state["running"])
                attributes["dask.compute.tasks_waiting"] = len(state["waiting"]) + len(state["ready"])
        self.emitter.emit(parent=record.span, name=PROGRESS_SPAN, start_ns=since, end_ns=now,
                          attributes=attributes)

    def _task_span(self, record: ComputeRecord, ev: TaskEvent, prefix: str, batch: Any = None) -> None:
        ids = record.task_span_ids
        # Only a DirectEmitter gives ids out (sets_span_ids), and only it takes span_id=.
        extra = {"span_id": ids[ev.key]} if ids and ev.key in ids else _NO_EXTRA
        with self.building:
            if self.halt:
                return  # counted as unbuilt
            record.in_spans += 1
            name = self.metrics.span_name(prefix)
            try:
                if extra is _NO_EXTRA and batch is not None \
                        and batch.add_task(record.span, ev, prefix, name, self.task_encoder, record.graph,
                                           record.state):
                    if len(batch) >= BATCH_SPANS:
                        self.queue_batch(batch)
                    return
                self.emitter.emit(parent=record.span, name=name, start_ns=ev.start_ns, end_ns=ev.end_ns,
                                  attributes=task_attributes(ev, prefix, record.graph, record.state), error=ev.error,
                                  **extra)
            except Exception as exc:  # one span must not cost the rest of its compute
                self.span_failed(exc)

    def _aggregate_span(self, record: ComputeRecord, agg: Aggregate) -> None:
        with self.building:
            if self.halt:
                return  # counted as unbuilt
            record.in_spans += agg.count
            self.tasks_aggregated += agg.count
            try:
                self.emitter.emit(parent=record.span, name=self.metrics.span_name(agg.prefix),
                                  start_ns=agg.start_ns, end_ns=agg.end_ns, attributes=aggregate_attributes(agg))
            except Exception as exc:
                self.span_failed(exc)

    def span_failed(self, exc: Exception, spans: int = 1) -> None:
        """Count ``spans`` whose making raised, and warn of the first: an application's span
        processor that raises (in on_end, through span.end()) costs those spans, never the
        rest of the compute, and says so where it is seen."""
        first = self.span_errors == 0
        self.span_errors += spans
        if first:
            logger.warning("otel_graph: making a span raised (%s: %s), from the span processors or our own code; "
                           "the other spans go on, and stats()['span_errors'] counts those that raised",
                           type(exc).__name__, exc)

    def finish(self, record: ComputeRecord, plan: SpanPlan[TaskEvent] | None) -> None:
        """End the compute now: its aggregates, its root span, its metrics; then it is forgotten."""
        _fingerprint(record)
        with self.building:  # its spans, the root's end and its leaving the count, as one
            if not self.halt:
                batch = self._open_batch(record)
                try:
                    self._end(record, plan, batch)
                finally:
                    self._close_batch(record)

    def _end(self, record: ComputeRecord, plan: SpanPlan[TaskEvent] | None, batch: Any = None,
             runs: list[Run] | None = None) -> None:
        """The compute's aggregates, its root's attributes and end, its metrics with ``runs``
        (recorded once, whatever raises before), and its record forgotten."""
        error = record.error
        failed = error is not None
        end_ns = cast(int, record.end_ns)  # set: a compute ends (tracker.end, _close_incomplete) before this
        try:
            if plan is not None:
                plan.finish()
            span = record.span
            if record.scheduler != "distributed":
                span.set_attribute("dask.graph.tasks", record.seen)
            elif record.graph_tasks is not None:
                span.set_attribute("dask.graph.tasks", record.graph_tasks)
            if record.fingerprint is not None:
                span.set_attribute("dask.graph.fingerprint", record.fingerprint)
            if record.submitted > record.seen:
                span.set_attribute("dask.graph.tasks_lost", record.submitted - record.seen)
            if error is not None:
                info = describe_exception(error)
                span.add_event("exception", exception_event_attributes(info), timestamp=end_ns)
                span.set_attribute("error.type", info.type_name)
                span.set_status(Status(StatusCode.ERROR, f"{info.type_name}: {info.message}"[:1024]))
            if batch is not None and type(span) is ComputeSpan:
                span.end(end_time=end_ns, into=batch)
            else:
                span.end(end_time=end_ns)
            if record.outer:
                _end_outer(record, end_ns)
        finally:
            try:
                self.metrics.record_compute(compute_of(record, end_ns, failed, runs), runs=runs)
            except Exception:  # an application's instrument: counted, and the compute still leaves
                self.processing_errors += 1
                logger.debug("otel_graph: failed to record a compute's metrics", exc_info=True)
        self._forget(record)

    def _abandon(self, record: ComputeRecord) -> None:
        # Still close the root span, so the trace is not left with a span that never ends.
        self._forget(record)
        record.span.set_attribute("dask.graph.tasks", record.seen)
        record.span.set_attribute("otel_graph.processing_error", True)
        record.span.end(end_time=record.end_ns or time.time_ns() + record.shift_ns)
        _end_outer(record, record.end_ns)


def compute_of(record: ComputeRecord, end_ns: int, failed: bool, runs: list[Run] | None) -> Compute:
    """The compute's point in the compute histograms; ``runs``: its task runs not yet counted in
    its totals (a compute drained whole)."""
    seconds = (end_ns - record.start_ns) / 1e9
    if record.scheduler == "distributed":  # its tasks ran on the workers: the scheduler counted them
        return (record.scheduler, failed, seconds, record.job,
                -1 if record.graph_tasks is None else record.graph_tasks, record.failed_tasks, record.output_bytes)
    failed_tasks, nbytes = run_totals(runs) if runs else (0, 0)
    return (record.scheduler, failed, seconds, record.job, record.seen, record.failed_tasks + failed_tasks,
            record.output_bytes + nbytes)


def _fingerprint(record: ComputeRecord) -> None:
    """A local compute's ``dask.graph.fingerprint``, from Dask's scheduler state, for its end
    to set. O(tasks): worked out before a drain takes ``building``, which inline drains of
    small computes wait on. A dask.distributed compute's comes from the scheduler."""
    state = record.state
    if record.fingerprint is not None or record.scheduler == "distributed" or state is None:
        return
    try:
        record.fingerprint = graph_fingerprint(state["dependencies"])
    except Exception:  # Dask's state changed shape: the compute goes without
        logger.debug("otel_graph: could not fingerprint a graph", exc_info=True)


def _end_outer(record: ComputeRecord, end_ns: int | None) -> None:
    for span in record.outer:
        try:  # an application's span processor that raises must not cost the compute's record
            span.end(end_time=end_ns or time.time_ns())
        except Exception:
            logger.debug("otel_graph: could not end a span around a compute", exc_info=True)
