"""Computes in flight, and the one background thread that turns their task records into telemetry.

Capture records a :class:`~otel_graph.telemetry.events.TaskEvent` per task into its compute's
list, and on a pool asks for a drain once ``OTEL_GRAPH_EARLY_DRAIN`` of them wait; nothing
more. This module owns everything after that:

* :meth:`Tracker.begin` opens the ``dask.compute`` root span, a child of the caller's
  current span, and returns the :class:`ComputeRecord` capture writes into;
* :meth:`Tracker.end` stamps the end and wakes the worker thread, or, for a small
  compute whose every task has reported, handles it in the thread that computed it
  (:data:`INLINE_MAX_TASKS`): one that succeeded is set aside in plain values, and the
  telemetry of :data:`ASIDE_COMPUTES` of them (or of :data:`ASIDE_SPANS` spans) is made
  together, by the thread that sets aside the last, or by the worker thread at its next
  drain, in a flush, at stop, in the span processors' ``force_flush``, or when the span
  processors change; any other is made at once;
* the worker thread drains every record's events in bulk, feeds the span budget
  (:mod:`otel_graph.telemetry.policy`) and the task metrics, and, once every submitted task of an
  ended compute has reported, emits its aggregates and ends its root span with
  ``dask.graph.tasks``. Running computes are drained every ``drain_interval_s`` so that a
  long job's spans reach the collector while it runs, and one whose tasks run on a pool
  also whenever ``OTEL_GRAPH_EARLY_DRAIN`` of its task records wait: its threads are idle
  often enough for its spans to be made and exported before it returns;
* a compute still running gets ``dask.compute.progress`` spans, children of its root:
  the first once it has run :data:`FIRST_PROGRESS_NS`, covering its run so far, then one
  per ``progress_interval_s``, doubling every :data:`PROGRESS_SPANS_PER_STEP`. A root
  span is only exported when it ends, so without them a 10-hour job's trace has no span
  of its own, only task spans, until the end; with them Jaeger finds the running compute
  by the ``dask.compute.progress`` operation and shows how far it got. (The idea of Logfire's "pending spans".)
* :meth:`Tracker.flush` asks for a drain now and waits for it.

Building spans and metric points here, in bulk and off the scheduler's thread (for a
large compute), is what keeps the per-task cost near two clock readings.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import NonRecordingSpan, Status, StatusCode, TraceFlags

from otel_graph.telemetry.compute_span import ComputeSpan, start_compute_span
from otel_graph.config import DEFAULT_EARLY_DRAIN_TASKS
from otel_graph.naming import task_prefix
from otel_graph.telemetry.events import AT_ERROR, AT_KEY, TaskEvent, describe_exception
from otel_graph.export.forks import forked_child_drops, stands_down
from otel_graph.telemetry.metrics import Run, TaskMetrics
from otel_graph.telemetry.policy import Aggregate, SpanPlan
from otel_graph.telemetry.spans import (
    UNSET_STATUS,
    ApiEmitter,
    TaskFacts,
    aggregate_attributes,
    attributes_of,
    exception_event_attributes,
    span_context_of,
    recovered_attributes,
    task_attributes,
    task_facts,
)
from otel_graph.telemetry.task_context import TaskParent, current_context, with_span
from otel_graph.telemetry.task_encoding import TaskAttributeEncoder

logger = logging.getLogger("otel_graph")
_get_ident = threading.get_ident
_SAMPLED = TraceFlags.SAMPLED

#: How long an ended compute waits for tasks still running when it failed; those
#: tasks' results are discarded by Dask, and past this we stop waiting for their records.
STRAGGLER_WAIT_NS = 30 * 10**9
#: Results whose size is measured per memory reading; beyond it the total is scaled up.
HELD_SAMPLE = 1024
#: Ended computes not yet turned into telemetry, past which a local compute() waits for
#: the tracker (:meth:`Tracker.keep_up`). In a tight loop of tiny computes the tracker
#: thread only gets the GIL in the main thread's switch-interval slices: 8,000 computes
#: once waited, each holding its graph and Dask state (14 kB), while the loop ran on.
MAX_BACKLOG = 256
#: A local compute of at most this many tasks, all accounted for when it returns, is
#: handled by the thread that computed it, before compute() returns (:meth:`Tracker.end`:
#: set aside, or turned into telemetry), where spans go to otel_graph's own processors,
#: which only queue.
#: Handing it to the tracker's thread cost more than the work: a wake-up, the GIL passed
#: back and forth, and the compute's objects kept alive until then, long enough for the
#: garbage collector to promote them (25-task array computes: +751 µs each, +173 inline).
INLINE_MAX_TASKS = 128
#: Small computes that succeeded, set aside (:meth:`Tracker._set_aside`), whose telemetry is then
#: made together: by the thread that sets aside the last of them, or at the tracker's next
#: drain, a flush, stop, a span processor's force_flush, or a change of span processors.
#: Made one by one, each compute's spans were made in code and data that Dask had just
#: evicted from the CPU's caches: a one-task compute's cost about three times what they cost
#: made in a run (a loop of one-task computes: about 25 against 7 µs each).
ASIDE_COMPUTES = 64
#: ... or as soon as they are to make this many spans: a compute's return pays for making them.
ASIDE_SPANS = 512
#: A compute running this long at a drain gets its first progress span: computes shorter
#: than it, nearly all of them, cost nothing more.
FIRST_PROGRESS_NS = 10**9
#: After this many progress spans a compute's progress interval doubles, and again after
#: as many more: a trace's span count stays bounded (a 24-hour job at 30 s: 500, not 2,880).
PROGRESS_SPANS_PER_STEP = 100
PROGRESS_SPAN = "dask.compute.progress"
#: Task events turned into TaskEvents and consumed at a time (see _drain).
EVENT_SLICE = 2048
#: ... in slices this small, the GIL handed back between them: a pool thread whose task ends
#: meanwhile waits for one slice (tens of µs), not for the whole drain.
YIELD_SLICE = 32
#: Spans a batch of a large compute's holds before it is queued: the export thread starts on
#: them while the rest are made (a compute's last spans are what its flush waits for).
BATCH_SPANS = 256
#: The keyword arguments of a task span without a span id given out while it ran.
_NO_EXTRA: dict[str, Any] = {}
#: How long stop() waits, once it gave up, for the thread to put down its slice.
_HALT_WAIT_S = 0.2


class ComputeRecord:
    """One compute: what capture writes (``sink``, ``submitted``, ``lost``) and what we derive."""

    __slots__ = ("scheduler", "span", "context", "start_ns", "end_ns", "error", "sink", "submitted",
                 "lost", "seen", "in_spans", "graph", "state", "plan", "sampled", "graph_tasks", "cluster",
                 "cluster_events", "task_span_ids", "caller", "parents", "assign_ids", "in_backlog",
                 "progress_ns", "progress_spans", "outer", "claimed", "inline", "batch", "span_context",
                 "early_at", "drain_soon")

    def __init__(self, scheduler: str, span: trace.Span, start_ns: int, *, assign_ids: bool = False,
                 context: Context | None = None) -> None:
        """``context`` is the caller's (None: the current one), which its tasks run in, the task parent current."""
        self.scheduler = scheduler
        self.span = span
        #: Span ids given to tasks that had spans started inside them (otel_graph.telemetry.task_context).
        self.task_span_ids: dict[Any, int] = {}
        #: The thread that called compute, and the task parent of each thread running tasks.
        self.caller = _get_ident()
        #: The root's span context: the parent of the task spans.
        self.span_context = span_context = span.get_span_context()
        self.sampled = bool(span_context[3] & _SAMPLED)  # trace_flags, by position: a call fewer
        # An unsampled compute emits no task spans: its tasks' children follow it, unsampled.
        self.assign_ids = assign_ids = assign_ids and self.sampled
        parent = TaskParent(span_context, self.task_span_ids, assign_ids=assign_ids)
        # The caller's own context (its baggage, say) with the task parent current; other
        # threads get this one with their own parent (parent_for).
        self.context = with_span(parent, context)
        self.parents: dict[int, tuple[TaskParent, Context]] = {self.caller: (parent, self.context)}
        self.start_ns = start_ns
        self.end_ns: int | None = None
        self.error: BaseException | None = None
        self.sink: list[tuple[Any, ...]] = []  # TaskEvent's fields: see task_runner.execute
        self.submitted = 0
        self.lost = 0
        self.seen = 0
        #: Tasks that the compute's spans made so far stand for (task spans, aggregates' counts):
        #: of those seen, the rest are yet to be made spans of.
        self.in_spans = 0
        self.graph: Any = None
        self.state: Any = None
        self.plan: SpanPlan | None = None
        #: Tasks counted elsewhere (the distributed scheduler); None where we count them ourselves.
        self.graph_tasks: int | None = None
        #: distributed: the scheduler's address, and the cluster events already noted on the span
        #: (a set, made at the first).
        self.cluster: str | None = None
        self.cluster_events: set[tuple[str, str]] | None = None
        #: Counted in the tracker's backlog of ended computes not yet processed.
        self.in_backlog = False
        #: The end of the last progress span; None before the first.
        self.progress_ns: int | None = None
        self.progress_spans = 0
        #: Spans opened around this compute alone, innermost first: they end with it.
        self.outer: tuple[trace.Span, ...] = ()
        #: Being drained, by the tracker's thread or inline by the thread that computed it.
        self.claimed = False
        #: Drained inline when it ends, if small (its root is then a light one: compute_span).
        self.inline = False
        #: While spans of it are made (a compute drained whole, a slice of its task records, its
        #: end): where they are encoded, to be queued together (or None).
        self.batch: Any = None
        #: Task records awaiting the tracker at which capture asks it to drain this compute while
        #: it runs (``drain_soon()``; ``OTEL_GRAPH_EARLY_DRAIN``); None: only every interval.
        self.early_at: int | None = None
        self.drain_soon: Callable[[ComputeRecord], None] | None = None

    def all_reported(self) -> bool:
        """Every submitted task has its event (seen, or waiting in the sink) or was lost."""
        return self.seen + len(self.sink) + self.lost >= self.submitted

    def parent_for(self, thread: int) -> tuple[TaskParent, Context]:
        """The parent of spans started by tasks of this compute on ``thread``, and the compute's
        context with it current there (made once per thread)."""
        found = self.parents.get(thread)
        if found is None:
            parent = TaskParent(self.span_context, self.task_span_ids, assign_ids=self.assign_ids)
            found = self.parents[thread] = (parent, with_span(parent, self.context))
        return found

    def held(self) -> tuple[int, int]:
        """Results in Dask's cache right now: (count, bytes). Read from another thread.

        Bytes are measured on at most :data:`HELD_SAMPLE` results and scaled up, so a
        cache of 10^6 results costs a collection a millisecond, not a second.
        """
        state = self.state
        if state is None:
            return 0, 0
        from dask.sizeof import sizeof

        values = list(state["cache"].values())  # one C-level copy: safe while Dask mutates
        count = len(values)
        sample = values if count <= HELD_SAMPLE else values[:: count // HELD_SAMPLE]
        total = 0
        for value in sample:
            try:
                total += int(sizeof(value))
            except Exception:
                continue
        return count, total if len(sample) == count else int(total * count / len(sample))


class Tracker:
    def __init__(self, *, tracer: trace.Tracer, emitter: Any, metrics: TaskMetrics,
                 max_task_spans: int | None, drain_interval_s: float,
                 progress_interval_s: float = 30.0, early_drain_tasks: int | None = DEFAULT_EARLY_DRAIN_TASKS) -> None:
        """``early_drain_tasks``: the task records awaiting the tracker at which a compute on a pool
        (threads, processes) is drained while it runs, not only every ``drain_interval_s``
        (``OTEL_GRAPH_EARLY_DRAIN``); None: only every ``drain_interval_s``."""
        self._tracer = tracer
        self._emitter = emitter
        # Only spans we hand to the SDK ourselves can take the ids given out while tasks ran.
        self._assign_ids = bool(getattr(emitter, "sets_span_ids", False))
        # Small computes are drained inline (and get a light root span) only while making
        # spans cannot block: every span processor is otel_graph's own.
        self._queues_only = getattr(emitter, "queues_only", None)
        if self._queues_only is not None:  # a DirectEmitter, which loaded sdk_internals already
            from otel_graph.export.sdk_internals import tracer_enabled

            self._tracer_enabled = tracer_enabled(tracer)
        #: The computes being drained inline: a flush waits for those begun before it.
        self._inline: set[ComputeRecord] = set()
        #: Running pool computes whose task records pile up, to drain before the interval (_drain_soon).
        self._early: dict[ComputeRecord, None] = {}
        #: Small computes set aside (_set_aside), in plain values, after the encoding (processors)
        #: their spans go to; and the spans they are to make: forgotten as computes, they are
        #: counted here until made (unprocessed()).
        self._aside: list[Any] = []
        self._aside_spans = 0
        self._aside_listed = 0  # of those spans, the ones in _aside (not being made elsewhere)
        # A successful task's span is encoded straight from its record where the emitter can
        # (otel_graph.telemetry.task_encoding), into a batch queued at once: no attribute dict, no span
        # context, one lock round trip per batch.
        self._encoded_batch = getattr(emitter, "encoded_batch", None)
        self._encoding = getattr(emitter, "encoding", None)
        self._task_encoder = TaskAttributeEncoder()
        self._metrics = metrics
        self._budget = max_task_spans
        #: A compute of at most this many tasks is drained whole, a span each (see _drain_whole):
        #: small, as it is drained holding _building and made TaskEvents at once.
        self._whole_budget = INLINE_MAX_TASKS if max_task_spans is None else \
            min(INLINE_MAX_TASKS, max_task_spans - max_task_spans // 2)
        self._interval = drain_interval_s
        self._early_events = early_drain_tasks
        self._progress_ns = int(progress_interval_s * 1e9)
        # Insertion-ordered and O(1) to find and forget: a tight loop of tiny computes can
        # leave thousands pending, and a list's scan per forget made draining them quadratic.
        self._records: dict[ComputeRecord, None] = {}
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._waiting_inline = 0  # flush() and stop() calls waiting for inline drains to end
        self._requested = 0
        self._completed = 0
        self._backlog = 0  # ended computes not yet forgotten
        self._waiters = 0
        self._forgotten = 0  # computes finished with, ever: progress, for keep_up
        self._stalled_at: int | None = None
        self._stopping = False
        #: Set when stop() gives up on what is left: no span is made after it, and what is left
        #: stays counted as unbuilt (unprocessed()), not built unseen.
        self._halt = False
        #: Held while spans are made and queued (a compute drained whole, a slice of a large
        #: one's task records, a compute's end, computes set aside), and while stop() counts
        #: what is left: a count
        #: taken while spans were being made counted them twice, as unbuilt and then as spans.
        self._building = threading.RLock()
        self.tasks_aggregated = 0
        #: Tasks whose spans a lost worker took with it, made up from the scheduler's count.
        self.tasks_recovered = 0
        self.processing_errors = 0
        self.begin_errors = 0
        #: Spans whose making raised (:meth:`_span_failed`): task and aggregate spans, and each
        #: span of a batch the processors refused (a compute's, or a slice of a large one's).
        self.span_errors = 0
        self._forked = False
        self._thread = threading.Thread(target=self._run, name="otel-graph-tracker", daemon=True)
        self._thread.start()
        stands_down(self)

    @property
    def tracer(self) -> trace.Tracer:
        return self._tracer

    @property
    def forked(self) -> bool:
        """True in a process forked from this one's: it traces nothing (see :mod:`otel_graph.export.forks`)."""
        return self._forked

    def _after_fork_in_child(self) -> None:
        # The parent's computes are the parent's to finish, and this thread did not come along.
        self._forked = True
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._waiting_inline = 0
        self._records = {}
        self._backlog = 0
        self._inline = set()
        self._early = {}
        self._aside, self._aside_spans, self._aside_listed = [], 0, 0
        self._building = threading.RLock()  # held by a thread of the parent's at the fork, maybe

    # -- called from capture, on the user's threads ------------------------------------
    def begin(self, scheduler: str) -> ComputeRecord | None:
        if self._forked:  # a process forked from this one's (otel_graph.export.forks): untraced
            forked_child_drops("computes")
            return None
        start = time.time_ns()
        light = scheduler != "distributed" and self._queues_only is not None and self._queues_only() \
            and self._tracer_enabled()
        if light:
            context = current_context()  # read once: the root's parent, then the tasks' context
            span = start_compute_span(self._emitter, "dask.compute", start_ns=start,
                                      attributes={"dask.scheduler": scheduler}, context=context)
        else:
            context = None
            span = self._tracer.start_span("dask.compute", start_time=start,
                                           attributes={"dask.scheduler": scheduler})
        record = ComputeRecord(scheduler, span, start, assign_ids=self._assign_ids, context=context)
        record.inline = light
        if (scheduler == "threads" or scheduler == "processes") and self._early_events is not None:
            record.early_at, record.drain_soon = self._early_events, self._drain_soon
        with self._lock:
            self._records[record] = None
        return record

    def failed_to_begin(self) -> None:
        """A compute ran untraced because opening its span raised (counted, never re-raised)."""
        self.begin_errors += 1

    def end(self, record: ComputeRecord, error: BaseException | None) -> None:
        record.error = error  # before end_ns: a drain in between must not see a failure as success
        record.end_ns = time.time_ns()
        # all_reported(), inline: a call fewer per compute
        if record.inline and record.submitted <= INLINE_MAX_TASKS \
                and record.seen + len(record.sink) + record.lost >= record.submitted \
                and (self._set_aside(record) or self._drain_here(record)):
            return
        with self._wake:
            self._requested += 1
            # An abandoned record is forgotten already: counted, it would never leave the backlog.
            if not record.in_backlog and record in self._records:
                record.in_backlog = True
                self._backlog += 1
            self._wake.notify()

    def _drain_soon(self, record: ComputeRecord) -> None:
        """Capture's ask, from a pool's thread, to drain a running compute now (``OTEL_GRAPH_EARLY_DRAIN``).
        Never raises into the task's thread."""
        try:
            record.early_at = len(record.sink) + self._early_events  # not asked again at every batch meanwhile
            with self._wake:
                self._early[record] = None
                self._wake.notify_all()  # notify() might wake a flush() waiting, not the tracker's thread
        except Exception:  # the interval's drain still comes
            self.processing_errors += 1
            logger.debug("otel_graph: could not ask for a drain", exc_info=True)

    def _drain_here(self, record: ComputeRecord) -> bool:
        """Drain an ended compute in this thread (see :data:`INLINE_MAX_TASKS`); False if
        it is left to the tracker's thread: being drained there, or not finished here."""
        with self._lock:
            if self._stopping or not self._claim(record):
                return False
            self._inline.add(record)
        try:
            self._drain_guarded(record)  # never raises into the user's compute
        finally:
            with self._wake:
                record.claimed = False
                self._inline.discard(record)
                # Only a flush or stop waits for it: waking the tracker's thread each time would
                # pass it the GIL and back for nothing (~30 µs a compute).
                if self._waiting_inline:
                    self._wake.notify_all()
        return record not in self._records

    def _set_aside(self, record: ComputeRecord) -> bool:
        """Set a small compute that succeeded aside, for its telemetry to be made with others'
        (:data:`ASIDE_COMPUTES`, :meth:`make_aside`): what the graph and Dask's state say of its
        tasks is read now, into plain values, and the compute is forgotten. False, having done
        nothing, for any other: it is drained here (:meth:`_drain_here`). Never raises."""
        span = record.span
        # A span each, so within the half of the span budget given to tasks as they come: _whole(),
        # inline (a call fewer a compute).
        if record.error is not None or record.seen or record.lost or record.outer or not record.sampled \
                or self._encoding is None or type(span) is not ComputeSpan or record.plan is not None \
                or record.task_span_ids or len(record.sink) > self._whole_budget:
            return False
        try:
            # Its spans go to the processors there now, even if made after an application adds one.
            encoding = self._encoding()
            if encoding is None:
                return False
            sink, graph, state = record.sink, record.graph, record.state
            # A failed task's span carries its exception: such a compute is drained here.
            facts = []
            known: dict[int, str] = {}  # the graph's callables, named once (it keeps them alive meanwhile)
            for raw in sink:  # a loop, not a comprehension: no call of its own
                if raw[AT_ERROR] is not None:
                    return False
                facts.append((raw, task_facts(raw[AT_KEY], graph, state, keep=True, known=known)))
            tasks = tuple(facts)
            for _ in range(2):
                with self._lock:
                    # The tracker's thread may have drained some of it while it ran (and given it
                    # a plan) since the checks above: then it is drained here.
                    if self._stopping or record.claimed or record not in self._records or record.seen \
                            or record.plan is not None or len(record.sink) != len(tasks):
                        return False
                    aside = self._aside
                    if not aside or (aside[0][0] is encoding[0] and aside[0][1] is encoding[1]):
                        root = span.end_aside(record.end_ns)
                        if root is None:
                            return False
                        del self._records[record]
                        if not aside:
                            aside.append(encoding)
                        aside.append((root, record.scheduler, tasks))
                        self._aside_spans += len(tasks) + 1
                        self._aside_listed += len(tasks) + 1
                        full = len(aside) > ASIDE_COMPUTES or self._aside_listed >= ASIDE_SPANS
                        break
                # The processors changed: those set aside go to the ones there when they ended.
                self.make_aside()
            else:
                return False
        except Exception:
            self.processing_errors += 1
            logger.debug("otel_graph: failed to set a compute aside", exc_info=True)
            return False
        record.graph = record.state = None
        if full:
            self.make_aside()
        return True

    def make_aside(self, timeout_s: float | None = None) -> None:
        """The spans and metrics of the computes set aside so far (:meth:`_set_aside`), made and
        queued together; a compute that fails is counted and its root ended marked so. From any
        thread: never raises. Waits at most ``timeout_s`` for spans being made elsewhere (an
        application's processor may block in them): then makes nothing."""
        try:
            if not self._building.acquire(timeout=-1 if timeout_s is None else max(0.0, timeout_s)):
                return
            try:
                self._make_aside_now()
            finally:
                self._building.release()
        except Exception:
            self.processing_errors += 1
            logger.debug("otel_graph: failed to process computes set aside", exc_info=True)

    def _make_aside_now(self) -> None:
        """Under ``_building``."""
        if self._halt:
            return  # counted as unbuilt
        with self._lock:
            aside, self._aside = self._aside, []  # still counted in _aside_spans, until made
            self._aside_listed = 0
        if not aside:
            return
        items = aside[1:]
        try:
            batch = self._emitter.encoded_batch(aside[0])
        except Exception:  # none of them can be made: lost, and counted
            self.processing_errors += len(items) - 1  # and one by make_aside
            with self._lock:
                self._aside_spans -= sum(len(tasks) + 1 for _, _, tasks in items)
            raise
        made = 0
        runs: list[Run] = []
        computes: list[tuple[str, bool, float]] = []
        encode, label = self._task_encoder.encode, self._metrics.label
        try:
            for root, scheduler, tasks in items:
                if self._halt:
                    break  # stop(drain=False): the rest stay counted as unbuilt
                made += len(tasks) + 1
                failed = False
                try:
                    done = self._aside_spans_of(batch, root, scheduler, tasks, label, encode)
                except Exception:
                    self.processing_errors += 1
                    logger.debug("otel_graph: failed to process a compute", exc_info=True)
                    done, failed = None, True
                    root[5]["otel_graph.processing_error"] = True  # its root still ends, marked
                    try:
                        batch.add(*root, (), UNSET_STATUS)
                    except Exception as exc:
                        self._span_failed(exc)
                if done:
                    runs += done
                computes.append((scheduler, failed, (root[4] - root[3]) / 1e9))
            self._metrics.record_computes(computes, runs)
        finally:
            with self._lock:
                self._aside_spans -= made
            if batch:
                self._queue_batch(batch)

    def _aside_spans_of(self, batch: Any, root: tuple[Any, ...], scheduler: str,
                        tasks: tuple[tuple[tuple[Any, ...], TaskFacts], ...], label: Any, encode: Any) -> list[Run]:
        """One set-aside compute's spans, into ``batch``; its tasks' runs."""
        # The encoders read a span context's fields by position: the plain tuple serves as one.
        name, context, parent, start_ns, end_ns, attributes = root
        attributes["dask.graph.tasks"] = len(tasks)
        runs, left = batch.add_tasks(context, tasks, label, scheduler, encode)
        if left:  # attributes that could not be encoded: made the generic way, which says what it left out
            facts = dict(tasks)
            parent_span = NonRecordingSpan(span_context_of(context))
            for ev, prefix in left:
                try:
                    self._emitter.emit(parent=parent_span, name=self._metrics.span_name(prefix), start_ns=ev.start_ns,
                                       end_ns=ev.end_ns, attributes=attributes_of(ev, prefix, facts[tuple(ev)]))
                except Exception as exc:
                    self._span_failed(exc)
        batch.add(name, context, parent, start_ns, end_ns, attributes, (), UNSET_STATUS)
        return runs

    def _claim(self, record: ComputeRecord) -> bool:
        """Under the lock: take ``record`` to drain, unless another thread is draining it or
        it is forgotten already (drained again, it would be counted twice)."""
        if record.claimed or record not in self._records:
            return False
        record.claimed = True
        return True

    def keep_up(self, *, timeout_s: float = 1.0) -> None:
        """Wait, at most ``timeout_s``, while too many ended computes await processing.

        Called by capture of the local schedulers after a compute returns, in the user's
        thread: the wait hands the tracker the CPU it needs, about 80 µs per small
        compute, and keeps memory bounded. Never called on an event loop.
        """
        if self._backlog <= MAX_BACKLOG or threading.get_ident() == self._thread.ident:
            return
        if self._stalled_at == self._forgotten:
            return  # a wait already timed out and the tracker has finished nothing since
        with self._wake:
            self._waiters += 1
            self._wake.notify_all()
            try:
                caught_up = self._wake.wait_for(lambda: self._backlog <= MAX_BACKLOG // 2 or self._stopping
                                                or not self._thread.is_alive(), timeout=timeout_s)
            finally:
                self._waiters -= 1
            # A tracker stuck (an application's span processor blocking, say) must cost one
            # wait, not one per compute: stop waiting until it finishes a compute again.
            self._stalled_at = None if caught_up else self._forgotten

    def find_traceparent(self, traceparent: Any) -> ComputeRecord | None:
        """The compute (running, or ended but not yet settled) whose span has this W3C traceparent."""
        parts = str(traceparent or "").split("-")
        if len(parts) != 4:
            return None
        with self._lock:
            records = list(self._records)
        for record in records:
            context = record.span.get_span_context()
            if f"{context.span_id:016x}" == parts[2] and f"{context.trace_id:032x}" == parts[1]:
                return record
        return None

    def running(self) -> Iterator[ComputeRecord]:
        with self._lock:
            records = list(self._records)
        return (r for r in records if r.end_ns is None)

    # -- flush and stop -------------------------------------------------------------------
    def flush(self, timeout_s: float | None) -> bool:
        """Drain everything recorded so far; True when no ended compute is left pending."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._wake:
            self._requested += 1
            target = self._requested
            inline = set(self._inline)  # not those begun after: a busy loop of computes never ends them all
            self._wake.notify_all()
            self._waiting_inline += 1
            try:
                while self._completed < target or inline & self._inline:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        return False
                    if not self._thread.is_alive():  # never wait on a thread that is gone
                        return False
                    self._wake.wait(0.5 if remaining is None else min(remaining, 0.5))
            finally:
                self._waiting_inline -= 1
        # And what other threads set aside since the tracker made what there was (a halt may
        # leave some unmade: those count as pending).
        self.make_aside(None if deadline is None else deadline - time.monotonic())
        with self._lock:
            return not self._aside_spans and not any(r.end_ns is not None for r in self._records)

    def stop(self, timeout_s: float | None, *, drain: bool = True) -> int:
        """Drain (unless told not to), stop the thread, close computes still open.

        Returns how many task records were never turned into telemetry: those left when
        the time ran out, or all of them when ``drain`` is False (a collector that is
        down would only make building them wasted work at exit).
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        if drain:
            self.flush(timeout_s)
        with self._wake:
            self._stopping = True  # no inline drain begins after this
            self._halt = self._halt or not drain  # what an earlier stop counted stays unbuilt
            self._wake.notify_all()
            # Those running end (halted, they build nothing more) before what is left is counted.
            self._waiting_inline += 1
            try:
                self._wake.wait_for(lambda: not self._inline, None if deadline is None
                                    else max(0.0, deadline - time.monotonic()))
            finally:
                self._waiting_inline -= 1
        self._thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        if self._thread.is_alive():
            # Out of time mid-drain: the rest is counted, so the thread must not go on building
            # it after the count (and after exit's warning). It stops within a slice.
            self._halt = True
        if self._halt:
            # Halted, no span is made once the one being made is: the count is exact. Spans
            # stuck in the making (an application's span processor that blocks) are not waited
            # for past this; those of the batch being made are then counted twice.
            between = self._building.acquire(timeout=_HALT_WAIT_S)
            try:
                left = self.unprocessed()
            finally:
                if between:
                    self._building.release()
            self._thread.join(_HALT_WAIT_S)  # it puts down its slice
            if not self._thread.is_alive():
                self._release()
            return left
        self.make_aside()  # set aside after the flush had made those before it
        # A compute still running in another thread (uninstrument mid-compute): close it
        # with what it has, marked incomplete, rather than leave it open and referenced.
        for record in list(self._records):
            if record.claimed:  # an inline drain that outlived the wait: it finishes its record
                continue
            try:
                self._close_incomplete(record)
            except Exception:
                self.processing_errors += 1
                logger.debug("otel_graph: failed to close an open compute", exc_info=True)
        return 0

    def _release(self) -> None:
        # Free records (their task records, graphs and results) now, inside the exit hook and
        # its time budget: left to the interpreter's teardown, freeing a compute's 10^5 task
        # records stretched an exit past 2 s with the collector down (bench_faults.py).
        for record in list(self._records):
            record.sink = []
            self._forget(record)
        self._aside = []

    def unprocessed(self) -> int:
        """Task records not yet turned into spans, plus the root spans of computes still open.

        Records held for a span to come count too: a slow task kept for the compute's end, a
        task folded into an aggregate not yet made; and the spans of computes set aside
        (:meth:`_set_aside`). A compute the sampler left out has no spans to make.
        """
        with self._lock:
            return self._aside_spans + sum(len(r.sink) + r.seen - r.in_spans + 1 for r in self._records if r.sampled)

    def _close_incomplete(self, record: ComputeRecord) -> None:
        if record.end_ns is None:
            record.end_ns = time.time_ns()
            record.span.set_attribute("otel_graph.incomplete", True)
        self._drain(record)
        if record in self._records:  # not settled: finish it anyway
            self._finish(record, record.plan)

    # -- the worker thread --------------------------------------------------------------
    def _run(self) -> None:
        last_pass = time.monotonic()
        while True:
            with self._wake:
                if self._requested == self._completed and not self._early and not self._stopping:
                    self._wake.wait(max(0.0, last_pass + self._interval - time.monotonic()))
                if self._stopping:
                    return
                target = self._requested
                early, self._early = self._early, {}
                # Asked for only by pool computes whose records pile up (_drain_soon): those alone.
                # The others, and the computes set aside, keep to the interval and their own asks.
                whole = target != self._completed or not early or time.monotonic() - last_pass >= self._interval
                records = list(self._records) if whole else [r for r in early if r in self._records]
            if whole:
                last_pass = time.monotonic()
                self.make_aside()
            for record in records:
                with self._lock:
                    if not self._claim(record):  # drained inline by the thread that computed it
                        continue
                try:
                    self._drain_guarded(record)
                finally:
                    record.claimed = False
            # Not held while waiting for more work: a drain can cover hundreds of finished
            # computes, their root spans and plans (found by tests/test_scale.py's object count).
            records.clear()
            with self._wake:
                self._completed = target
                self._wake.notify_all()

    def _drain_guarded(self, record: ComputeRecord) -> None:
        """:meth:`_drain`; a compute that fails it is counted and its root span closed, and
        one bad compute never stops telemetry for the rest."""
        try:
            self._drain(record)
        except Exception:
            self.processing_errors += 1
            logger.debug("otel_graph: failed to process a compute", exc_info=True)
            try:
                self._abandon(record)
            except Exception:
                logger.debug("otel_graph: failed to close a compute's span", exc_info=True)

    def _whole(self, record: ComputeRecord) -> bool:
        """Whether ``record``, ended with all its tasks reported, is drained whole (:meth:`_drain_whole`)."""
        return record.plan is None and not record.task_span_ids and len(record.sink) <= self._whole_budget

    def _drain(self, record: ComputeRecord) -> None:
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
        with self._building:
            taken = self._take(record)
        count = len(taken)
        # A compute running on a pool: its threads may take the GIL between slices (YIELD_SLICE).
        step = YIELD_SLICE if record.early_at is not None and record.end_ns is None else EVENT_SLICE
        # Plain tuples until now (see task_runner.execute). Made TaskEvents a slice at a time,
        # so that those not kept die young: 10^5 at once outlived two collections, and
        # their promotion set off a full one (~0.1 s) on the tracker's drain.
        for start in range(0, count, step):
            if start and step == YIELD_SLICE and record.end_ns is None:  # ended meanwhile: no one to yield to
                time.sleep(0)  # lets go of the GIL: a pool thread asking for it may take it
            events = list(map(TaskEvent._make, taken[start:start + step]))
            with self._building:  # a slice's spans are queued before stop() can count them
                if self._halt:
                    return
                self._open_batch(record)
                try:
                    self._consume(record, plan, events)
                finally:
                    self._close_batch(record)
        if self._halt:
            return
        if record.end_ns is None:
            try:
                self._progress(record)
            except Exception:  # a progress span refused must not end a compute still running
                self.processing_errors += 1
                logger.debug("otel_graph: failed to emit a progress span", exc_info=True)
            return
        settled = record.seen + record.lost >= record.submitted
        if settled or time.time_ns() - record.end_ns > STRAGGLER_WAIT_NS:
            self._finish(record, plan)

    def _drain_whole(self, record: ComputeRecord) -> None:
        """A compute that ended, all its tasks reported, within the first half of the span
        budget (which gives tasks spans as they come): what :meth:`_drain` would do, with no
        span plan. Most computes are this small; made and ended at once, they pay for no plan,
        and their spans, the root's too, are queued together, as are their metrics."""
        with self._building:
            if self._halt:
                return
            taken = self._take(record)
            batch = self._new_batch(record.sampled)
            runs = None
            try:
                runs = self._whole_tasks(record, taken, batch) if taken else None
                if not self._halt:  # halted meanwhile: what is left stays counted as unbuilt
                    ended, runs = runs, None  # _end records them with the compute, once, whatever fails
                    self._end(record, None, batch, ended)
            finally:
                if runs:  # not ended (halted, or a failure): its tasks' runs still count
                    self._metrics.record_runs(runs)
                if batch:
                    self._queue_batch(batch)

    def _take(self, record: ComputeRecord) -> list[tuple[Any, ...]]:
        """Under ``_building``: the events in the sink, now counted as seen (seen whenever
        not in the sink, for stop()'s count). Appends may land meanwhile; they stay."""
        sink = record.sink
        count = len(sink)
        taken = sink[:count]
        del sink[:count]
        record.seen += count
        if record.early_at is not None:  # the sink is empty again: capture asks once it fills anew
            record.early_at = self._early_events
        return taken

    def _consume(self, record: ComputeRecord, plan: SpanPlan | None, events: list[TaskEvent]) -> None:
        """Task metrics for ``events``, and their spans through ``plan`` (None: a span each)."""
        prefixes = [task_prefix(ev.key) for ev in events]
        self._metrics.record_tasks(events, prefixes, record.scheduler)
        if not record.sampled:
            return
        if plan is not None:
            plan.add(events, prefixes)
            return
        for ev, prefix in zip(events, prefixes):
            self._task_span(record, ev, prefix)

    def _whole_tasks(self, record: ComputeRecord, taken: list[tuple[Any, ...]], batch: Any) -> list[Run] | None:
        """Under ``_building``: the spans of a compute drained whole, and its task runs, to be
        recorded with its end (None: recorded already). Where ``batch`` takes spans encoded,
        its task records become runs and spans in one pass (a pass each was a good part of what
        tracing a one-task compute cost). What raises there (a malformed record) abandons the
        compute, as anywhere in a drain."""
        if batch is None:
            self._consume(record, None, list(map(TaskEvent._make, taken)))
            return None
        graph, state, known = record.graph, record.state, {}
        runs, left = batch.add_tasks(record.span_context, [(raw, task_facts(raw[AT_KEY], graph, state, known=known))
                                                           for raw in taken],
                                     self._metrics.label, record.scheduler, self._task_encoder.encode)
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
        """Queue the spans :meth:`_open_batch`'s batch took (under ``_building``, with them)."""
        batch, record.batch = record.batch, None
        if batch:
            self._queue_batch(batch)

    def _queue_batch(self, batch: Any) -> None:
        """Queue ``batch``'s spans, which empties it; refused, each counts in ``span_errors``."""
        count = len(batch)  # a refused batch is emptied all the same
        try:
            batch.queue()
        except Exception as exc:
            self._span_failed(exc, count)

    def _progress(self, record: ComputeRecord) -> None:
        if not record.sampled:
            return
        now = time.time_ns()
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
        self._emitter.emit(parent=record.span, name=PROGRESS_SPAN, start_ns=since, end_ns=now,
                           attributes=attributes)

    def _task_span(self, record: ComputeRecord, ev: TaskEvent, prefix: str, batch: Any = None) -> None:
        ids = record.task_span_ids
        # Only a DirectEmitter gives ids out (sets_span_ids), and only it takes span_id=.
        extra = {"span_id": ids[ev.key]} if ids and ev.key in ids else _NO_EXTRA
        with self._building:
            if self._halt:
                return  # counted as unbuilt
            record.in_spans += 1
            name = self._metrics.span_name(prefix)
            try:
                if extra is _NO_EXTRA and batch is not None \
                        and batch.add_task(record.span, ev, prefix, name, self._task_encoder, record.graph,
                                           record.state):
                    if len(batch) >= BATCH_SPANS:
                        self._queue_batch(batch)
                    return
                self._emitter.emit(parent=record.span, name=name, start_ns=ev.start_ns, end_ns=ev.end_ns,
                                   attributes=task_attributes(ev, prefix, record.graph, record.state), error=ev.error,
                                   **extra)
            except Exception as exc:  # one span must not cost the rest of its compute
                self._span_failed(exc)

    def _aggregate_span(self, record: ComputeRecord, agg: Aggregate) -> None:
        with self._building:
            if self._halt:
                return  # counted as unbuilt
            record.in_spans += agg.count
            self.tasks_aggregated += agg.count
            try:
                self._emitter.emit(parent=record.span, name=self._metrics.span_name(agg.prefix),
                                   start_ns=agg.start_ns, end_ns=agg.end_ns, attributes=aggregate_attributes(agg))
            except Exception as exc:
                self._span_failed(exc)

    def _span_failed(self, exc: Exception, spans: int = 1) -> None:
        # An application's span processor that raises (in on_end, through span.end()) made
        # the drain give up the rest of the compute, said only at DEBUG.
        first = self.span_errors == 0
        self.span_errors += spans
        if first:
            logger.warning("otel_graph: making a span raised (%s: %s), from the span processors or our own code; "
                           "the other spans go on, and stats()['span_errors'] counts those that raised",
                           type(exc).__name__, exc)

    def recovered(self, parent: trace.Span, *, prefix: str, count: int, duration_s: float,
                  start_ns: int, end_ns: int, worker: str) -> None:
        """A span standing for tasks whose telemetry was lost with their worker.

        From any thread (a cluster event's), through the tracer API: rare, and its parent
        is a distributed compute's SDK span.
        """
        self.tasks_recovered += count
        attributes = recovered_attributes(prefix=prefix, count=count, duration_s=duration_s, worker=worker)
        ApiEmitter(self._tracer).emit(parent=parent, name=self._metrics.admitted_name(prefix), start_ns=start_ns,
                                      end_ns=max(start_ns, end_ns), attributes=attributes)

    def recovered_runs(self, prefix: str, *, failed: bool, count: int, duration_s: float) -> None:
        """Task metrics for runs a lost worker finished but never exported (from any thread)."""
        self._metrics.record_recovered(prefix, failed=failed, count=count, duration_s=duration_s)

    def _finish(self, record: ComputeRecord, plan: SpanPlan | None) -> None:
        with self._building:  # its spans, the root's end and its leaving the count, as one
            if not self._halt:
                batch = self._open_batch(record)
                try:
                    self._end(record, plan, batch)
                finally:
                    self._close_batch(record)

    def _end(self, record: ComputeRecord, plan: SpanPlan | None, batch: Any = None, runs: list[Run] | None = None
             ) -> None:
        """The compute's aggregates, its root's attributes and end, its metrics with ``runs``
        (recorded once, whatever raises before), and its record forgotten."""
        failed = record.error is not None
        try:
            if plan is not None:
                plan.finish()
            span = record.span
            if record.scheduler != "distributed":
                span.set_attribute("dask.graph.tasks", record.seen)
            elif record.graph_tasks is not None:
                span.set_attribute("dask.graph.tasks", record.graph_tasks)
            if record.submitted > record.seen:
                span.set_attribute("dask.graph.tasks_lost", record.submitted - record.seen)
            if failed:
                info = describe_exception(record.error)
                span.add_event("exception", exception_event_attributes(info), timestamp=record.end_ns)
                span.set_attribute("error.type", info.type_name)
                span.set_status(Status(StatusCode.ERROR, f"{info.type_name}: {info.message}"[:1024]))
            if batch is not None and type(span) is ComputeSpan:
                span.end(end_time=record.end_ns, into=batch)
            else:
                span.end(end_time=record.end_ns)
            if record.outer:
                _end_outer(record, record.end_ns)
        finally:
            try:
                self._metrics.record_compute((record.end_ns - record.start_ns) / 1e9, record.scheduler, failed,
                                             runs=runs)
            except Exception:  # an application's instrument: counted, and the compute still leaves
                self.processing_errors += 1
                logger.debug("otel_graph: failed to record a compute's metrics", exc_info=True)
        self._forget(record)

    def _abandon(self, record: ComputeRecord) -> None:
        # Still close the root span, so the trace is not left with a span that never ends.
        self._forget(record)
        record.span.set_attribute("dask.graph.tasks", record.seen)
        record.span.set_attribute("otel_graph.processing_error", True)
        record.span.end(end_time=record.end_ns or time.time_ns())
        _end_outer(record, record.end_ns)

    def _forget(self, record: ComputeRecord) -> None:
        with self._lock:
            self._records.pop(record, None)
            if record.in_backlog:
                record.in_backlog = False
                self._backlog -= 1
                self._forgotten += 1
                if self._waiters and self._backlog <= MAX_BACKLOG // 2:
                    self._wake.notify_all()
        # Drop references to the user's graph and results as soon as we are done.
        record.graph = record.state = record.error = record.plan = None


def _end_outer(record: ComputeRecord, end_ns: int | None) -> None:
    for span in record.outer:
        try:  # an application's span processor that raises must not cost the compute's record
            span.end(end_time=end_ns or time.time_ns())
        except Exception:
            logger.debug("otel_graph: could not end a span around a compute", exc_info=True)
