"""Computes in flight: when their task records become telemetry, and in which thread.

Capture records a :class:`~otel_graph.telemetry.events.TaskEvent` per task into its compute's
list, and on a pool asks for a drain once ``OTEL_GRAPH_EARLY_DRAIN`` of them wait; nothing
more. The :class:`Tracker` owns everything after that:

* :meth:`Tracker.begin` opens the ``dask.compute`` root span, a child of the caller's
  current span (with none, of the launcher's ``TRACEPARENT``, if any:
  :mod:`otel_graph.telemetry.env_context`), and returns the
  :class:`~otel_graph.telemetry.compute_record.ComputeRecord` capture writes into;
* :meth:`Tracker.end` stamps the end and asks the tracker's thread for a pass, or, for a
  small compute whose every task has reported, handles it in the thread that computed it
  (:data:`INLINE_MAX_TASKS`): one that succeeded is set aside, its telemetry made later with
  others' (:mod:`otel_graph.telemetry.aside`); any other is drained there and then;
* the tracker's thread (:mod:`otel_graph.telemetry.passes`) drains every compute when asked
  (a compute ended, a flush) and every ``drain_interval_s``, so that a long job's spans reach
  the collector while it runs; a compute whose tasks run on a pool, also whenever
  ``OTEL_GRAPH_EARLY_DRAIN`` of its task records wait (that compute alone): its threads are
  idle often enough for its spans to be made and exported before it returns;
* a drain (:mod:`otel_graph.telemetry.drain`) feeds the records to the span budget and the
  task metrics, gives a long compute progress spans, and ends a compute once every task it
  submitted has reported;
* :meth:`Tracker.flush` asks for a pass and waits for it, and for the inline drains begun
  before it, and again while a compute that failed before it waits for its tasks still
  running; :meth:`Tracker.stop` drains (or not), stops the thread, and says how many task
  records never became telemetry.

Building spans and metric points in bulk, off the scheduler's thread (for a large compute),
is what keeps the per-task cost near two clock readings.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

from opentelemetry import trace

from otel_graph.config import DEFAULT_EARLY_DRAIN_TASKS
from otel_graph.export.forks import forked_child_drops, stands_down
from otel_graph.telemetry.aside import Aside
from otel_graph.telemetry.attributes import recovered_attributes
from otel_graph.telemetry.compute_record import ComputeRecord
from otel_graph.telemetry.compute_span import start_compute_span
from otel_graph.telemetry.drain import STRAGGLER_WAIT_NS, Drainer
from otel_graph.telemetry.env_context import under_launcher
from otel_graph.telemetry.job import current_name
from otel_graph.telemetry.metrics import TaskMetrics
from otel_graph.telemetry.passes import Passes
from otel_graph.telemetry.spans import ApiEmitter
from otel_graph.telemetry.task_context import current_context, span_in

if TYPE_CHECKING:
    from otel_graph.telemetry.nvtx_ranges import Ranges

logger = logging.getLogger("otel_graph")

#: Ended computes not yet turned into telemetry, past which a local compute() waits for
#: the tracker (:meth:`Tracker.keep_up`). In a tight loop of tiny computes the tracker
#: thread only gets the GIL in the main thread's switch-interval slices: thousands of
#: computes would wait, each holding its graph and Dask state, while the loop ran on.
MAX_BACKLOG = 256
#: A local compute of at most this many tasks, all accounted for when it returns, is
#: handled by the thread that computed it, before compute() returns (:meth:`Tracker.end`:
#: set aside, or turned into telemetry), where spans go to otel_graph's own processors,
#: which only queue.
#: Handing it to the tracker's thread costs more than the work: a wake-up, the GIL passed
#: back and forth, and the compute's objects kept alive until then, long enough for the
#: garbage collector to promote them.
#: It also bounds the computes drained whole, a span each (the drain's ``whole_budget``).
INLINE_MAX_TASKS = 128
#: How long stop() waits, once it gave up, for the thread to put down its slice.
_HALT_WAIT_S = 0.2
#: How often a flush looks again for the records of a failed compute's tasks still running.
STRAGGLER_POLL_S = 0.05


def _span_name(span: Any) -> str | None:
    """The name of the caller's current span, which names its computes' job; None for none (or
    one that is not a span of the SDK's: a task's parent, a remote parent)."""
    name = getattr(span, "name", None)
    return name if type(name) is str else None


class Tracker:
    """The computes of one instrumentation: begun and ended by capture, drained by one thread."""

    def __init__(self, *, tracer: trace.Tracer, emitter: Any, metrics: TaskMetrics,
                 max_task_spans: int | None, drain_interval_s: float,
                 progress_interval_s: float = 30.0, early_drain_tasks: int | None = DEFAULT_EARLY_DRAIN_TASKS,
                 ranges: Ranges | None = None, launcher: trace.Span | None = None) -> None:
        """``early_drain_tasks``: the task records awaiting the tracker at which a compute on a pool
        (threads, processes) is drained while it runs, not only every ``drain_interval_s``
        (``OTEL_GRAPH_EARLY_DRAIN``); None: only every ``drain_interval_s``. ``ranges``: each
        compute is also an NVTX range (``OTEL_GRAPH_NVTX``). ``launcher``: the parent of computes
        begun with no valid span current (``TRACEPARENT``: :mod:`otel_graph.telemetry.env_context`)."""
        self._ranges = ranges
        self._launcher = launcher
        self._tracer = tracer
        self._emitter = emitter
        self._metrics = metrics
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
        self._early_events = early_drain_tasks
        # Insertion-ordered and O(1) to find and forget: a tight loop of tiny computes can
        # leave thousands pending, and a scan per forget would make draining them quadratic.
        self._records: dict[ComputeRecord, None] = {}
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._waiting_inline = 0  # flush() and stop() calls waiting for inline drains to end
        self._backlog = 0  # ended computes not yet forgotten
        self._waiters = 0
        self._forgotten = 0  # computes finished with, ever: progress, for keep_up
        self._stalled_at: int | None = None
        self._stopping = False
        #: Tasks whose spans a lost worker took with it, made up from the scheduler's count.
        self.tasks_recovered = 0
        self.begin_errors = 0
        self._forked = False
        self._drainer = Drainer(emitter=emitter, metrics=metrics, max_task_spans=max_task_spans,
                                whole_max_tasks=INLINE_MAX_TASKS, progress_interval_s=progress_interval_s,
                                early_drain_tasks=early_drain_tasks, forget=self._forget)
        self._aside = Aside(self._drainer, lock=self._lock, records=self._records,
                            encoding=getattr(emitter, "encoding", None))
        self._passes = Passes(self._pass, wake=self._wake, interval_s=drain_interval_s, name="otel-graph-tracker")
        self._thread = self._passes.thread
        self._passes.start()
        stands_down(self)

    @property
    def tracer(self) -> trace.Tracer:
        return self._tracer

    @property
    def launcher(self) -> trace.Span | None:
        """The launcher's span (``TRACEPARENT``), parent of the spans begun with no valid span current."""
        return self._launcher

    @property
    def forked(self) -> bool:
        """True in a process forked from this one's: it traces nothing (see :mod:`otel_graph.export.forks`)."""
        return self._forked

    @property
    def tasks_aggregated(self) -> int:
        return self._drainer.tasks_aggregated

    @property
    def span_errors(self) -> int:
        """Spans whose making raised (task and aggregate spans, and each span of a refused batch)."""
        return self._drainer.span_errors

    @property
    def processing_errors(self) -> int:
        return self._drainer.processing_errors

    def _after_fork_in_child(self) -> None:
        # The parent's computes are the parent's to finish, and its thread did not come along.
        self._forked = True
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._passes.after_fork(self._wake)
        self._waiting_inline = 0
        self._records = {}
        self._backlog = 0
        self._inline = set()
        self._early = {}
        self._drainer.building = threading.RLock()  # held by a thread of the parent's at the fork, maybe
        self._aside = Aside(self._drainer, lock=self._lock, records=self._records,
                            encoding=getattr(self._emitter, "encoding", None))

    # -- called from capture, on the user's threads ------------------------------------
    def begin(self, scheduler: str, *, shift_ns: int = 0) -> ComputeRecord | None:
        """A compute begins, now; ``shift_ns`` is added to this process's clock for its own
        spans (:attr:`ComputeRecord.shift_ns`)."""
        if self._forked:  # a process forked from this one's (otel_graph.export.forks): untraced
            forked_child_drops("computes")
            return None
        start = time.time_ns() + shift_ns
        light = scheduler != "distributed" and self._queues_only is not None and self._queues_only() \
            and self._tracer_enabled()
        if light:
            context = current_context()  # read once: the root's parent, then the tasks' context
            job = current_name(_span_name(span_in(context)))
            context = under_launcher(self._launcher, context)
            span = start_compute_span(self._emitter, "dask.compute", start_ns=start, context=context,
                                      attributes={"dask.scheduler": scheduler, "dask.compute.name": job})
        else:
            context = None
            job = current_name(_span_name(trace.get_current_span()))
            span = self._tracer.start_span("dask.compute", context=under_launcher(self._launcher), start_time=start,
                                           attributes={"dask.scheduler": scheduler, "dask.compute.name": job})
        record = ComputeRecord(scheduler, span, start, assign_ids=self._assign_ids, context=context)
        record.shift_ns = shift_ns
        record.job = job
        record.inline = light
        if self._ranges is not None:
            record.nvtx_range = self._ranges.compute_started(record.span_context.trace_id)
        if (scheduler == "threads" or scheduler == "processes") and self._early_events is not None:
            record.early_at, record.drain_soon = self._early_events, self._drain_soon
        with self._lock:
            self._records[record] = None
        return record

    def failed_to_begin(self) -> None:
        """A compute ran untraced because opening its span raised (counted, never re-raised)."""
        self.begin_errors += 1

    def end(self, record: ComputeRecord, error: BaseException | None) -> None:
        if record.nvtx_range is not None:
            cast("Ranges", self._ranges).range_ended(record.nvtx_range)
        record.error = error  # before end_ns: a drain in between must not see a failure as success
        record.end_ns = end_ns = time.time_ns() + record.shift_ns
        # all_reported(), inline: a call fewer per compute
        if record.inline and record.submitted <= INLINE_MAX_TASKS \
                and record.seen + len(record.sink) + record.lost >= record.submitted \
                and (self._aside.add(record, end_ns) or self._drain_here(record)):
            return
        with self._wake:
            # An abandoned record is forgotten already: counted, it would never leave the backlog.
            if not record.in_backlog and record in self._records:
                record.in_backlog = True
                self._backlog += 1
            # No caller waits for it: one wake-up, the thread's.
            self._passes.request(wake_all=False)

    def _drain_soon(self, record: ComputeRecord) -> None:
        """Capture's ask, from a pool's thread, to drain a running compute now (``OTEL_GRAPH_EARLY_DRAIN``).
        Never raises into the task's thread."""
        try:
            # Set: only computes begun with it ask (begin). Not asked again at every batch meanwhile.
            record.early_at = len(record.sink) + cast(int, self._early_events)
            with self._wake:
                self._early[record] = None
                self._passes.kick()
        except Exception:  # the interval's drain still comes
            self._drainer.processing_errors += 1
            logger.debug("otel_graph: could not ask for a drain", exc_info=True)

    def _drain_here(self, record: ComputeRecord) -> bool:
        """Drain an ended compute in this thread (see :data:`INLINE_MAX_TASKS`); False if
        it is left to the tracker's thread: being drained there, or not finished here."""
        with self._lock:
            if self._stopping or not self._claim(record):
                return False
            self._inline.add(record)
        try:
            self._drainer.drain_guarded(record)  # never raises into the user's compute
        finally:
            with self._wake:
                record.claimed = False
                self._inline.discard(record)
                # Only a flush or stop waits for it: waking the tracker's thread each time would
                # pass it the GIL and back for nothing (~30 µs a compute).
                if self._waiting_inline:
                    self._wake.notify_all()
        return record not in self._records

    def make_aside(self, timeout_s: float | None = None) -> None:
        """Make the telemetry of the computes set aside so far (:meth:`Aside.make
        <otel_graph.telemetry.aside.Aside.make>`); from any thread, never raises."""
        self._aside.make(timeout_s)

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

    # -- flush and stop -------------------------------------------------------------------
    def flush(self, timeout_s: float | None, *, stragglers_s: float | None = None) -> bool:
        """Drain everything recorded so far; True when no ended compute is left pending.

        A compute that failed with tasks still running in a pool waits for their records
        (:data:`~otel_graph.telemetry.drain.STRAGGLER_WAIT_NS`); so does the flush, for those
        ended before it, passing again as they come: at most ``stragglers_s`` (None: all of
        ``timeout_s``; 0: not at all), so that their telemetry is part of what it delivers.
        """
        began = time.monotonic()
        deadline = None if timeout_s is None else began + timeout_s
        give_up = began + min([STRAGGLER_WAIT_NS / 1e9, *(s for s in (stragglers_s, timeout_s) if s is not None)])
        with self._lock:  # not those ended after: a loop of failing computes never ends them all
            awaited = [r for r in self._records if r.end_ns is not None and not r.all_reported()]
        while True:
            if not self._pass_covering_now(deadline):
                return False
            # And what other threads set aside since the tracker made what there was (a halt may
            # leave some unmade: those count as pending).
            self.make_aside(None if deadline is None else deadline - time.monotonic())
            with self._lock:
                if not self._aside.spans and not any(r.end_ns is not None for r in self._records):
                    return True
                awaited = [r for r in awaited if r in self._records]
                reporting = any(not r.all_reported() for r in awaited)
            if not awaited or time.monotonic() >= give_up:
                return False
            if reporting:  # their records land in the compute's sink, which wakes no one
                with self._wake:
                    self._wake.wait(max(0.0, min(STRAGGLER_POLL_S, give_up - time.monotonic())))
            # (All in since the pass: the next one settles them.)

    def _pass_covering_now(self, deadline: float | None) -> bool:
        """Ask for a pass and wait for it, and for the inline drains running now; False past ``deadline``."""
        with self._wake:
            target = self._passes.request()
            inline = set(self._inline)  # not those begun after: a busy loop of computes never ends them all
            self._waiting_inline += 1
            try:
                return bool(self._passes.wait(target, deadline=deadline, busy=lambda: bool(inline & self._inline)))
            finally:
                self._waiting_inline -= 1

    def stop(self, timeout_s: float | None, *, drain: bool = True) -> int:
        """Drain (unless told not to), stop the thread, close computes still open.

        Returns how many task records were never turned into telemetry: those left when
        the time ran out, or all of them when ``drain`` is False (a collector that is
        down would only make building them wasted work at exit).
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        if drain:  # not waiting for a failed compute's stragglers: what is left is closed below
            self.flush(timeout_s, stragglers_s=0)
        drainer = self._drainer
        with self._wake:
            self._stopping = True  # no inline drain begins after this
            self._aside.closed = True  # nor is a compute set aside
            drainer.halt = drainer.halt or not drain  # what an earlier stop counted stays unbuilt
            self._passes.stop()
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
            drainer.halt = True
        if drainer.halt:
            # Halted, no span is made once the one being made is: the count is exact. Spans
            # stuck in the making (an application's span processor that blocks) are not waited
            # for past this; those of the batch being made are then counted twice.
            between = drainer.building.acquire(timeout=_HALT_WAIT_S)
            try:
                left = self.unprocessed()
            finally:
                if between:
                    drainer.building.release()
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
                drainer.processing_errors += 1
                logger.debug("otel_graph: failed to close an open compute", exc_info=True)
        return 0

    def _release(self) -> None:
        # Free records (their task records, graphs and results) now, inside the exit hook and
        # its time budget: left to the interpreter's teardown, freeing a large compute's task
        # records would take seconds past it.
        for record in list(self._records):
            record.sink = []
            self._forget(record)
        self._aside.release()

    def unprocessed(self) -> int:
        """Task records not yet turned into spans, plus the root spans of computes still open.

        Records held for a span to come count too: a slow task kept for the compute's end, a
        task folded into an aggregate not yet made; and the spans of computes set aside
        (:mod:`otel_graph.telemetry.aside`). A compute the sampler left out has no spans to make.
        """
        with self._lock:
            return self._aside.spans + sum(len(r.sink) + r.seen - r.in_spans + 1 for r in self._records if r.sampled)

    def _close_incomplete(self, record: ComputeRecord) -> None:
        if record.end_ns is None:
            record.end_ns = time.time_ns() + record.shift_ns
            record.span.set_attribute("otel_graph.incomplete", True)
        self._drainer.drain(record)
        if record in self._records:  # not settled: finish it anyway
            self._drainer.finish(record, record.plan)

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

    # -- the tracker's thread -----------------------------------------------------------
    def _pass(self, *, full: bool, asked: bool) -> None:
        """One pass of the thread (:class:`~otel_graph.telemetry.passes.Passes`): every compute,
        and the computes set aside; or, when only kicked, the pool computes that asked."""
        with self._lock:
            early, self._early = self._early, {}
            # Asked for only by pool computes whose records pile up (_drain_soon): those alone.
            # The others, and the computes set aside, keep to the interval and their own asks.
            records = list(self._records) if full else [r for r in early if r in self._records]
        if full:
            self.make_aside()
        drain = self._drainer.drain_guarded
        for record in records:
            with self._lock:
                if not self._claim(record):  # drained inline by the thread that computed it
                    continue
            try:
                drain(record)
            finally:
                record.claimed = False
