"""On a dask.distributed worker: finished runs turned into task spans and metrics, off the event loop.

The worker plugin (:mod:`.worker`) hands :class:`WorkerTelemetry` a record of each
finished run (:func:`.adapter.task_run`: plain values). A background thread turns
those records into spans and metric points every ``OTEL_GRAPH_DRAIN_INTERVAL`` (at most
1 s here), or sooner once :data:`_DRAIN_AT` runs wait (what a busy worker holds between
drains stays small), and exports them with the worker's SDK. As the collector takes
each batch, the worker reports what it delivered to the scheduler's ledger
(:mod:`.ledger`), so that what a worker killed outright takes with it is still counted.

Spans
-----
A task span is the ``compute`` phase, on the worker's clock, under the ``dask.compute``
span whose context the scheduler handed the worker with the task (:mod:`.propagation`).
It carries the core task attributes, with ``dask.worker.id`` the worker's address, plus
``dask.worker.name``. ``transfer`` (inputs gathered from other workers, with
``dask.transfer.source`` and ``dask.transfer.bytes``), ``disk-read`` and ``disk-write``
(spilling, where distributed timed it above 5 ms) become child spans. A task that
allows retries carries ``dask.task.retries``; a run of a key that failed on this worker
earlier in the same compute (a retry landing here) carries ``dask.task.attempt``.

A task whose code asked for the current span while it ran (:mod:`.inside_tasks`) gets
its own span, with the id its code was given, whatever the budget. Each worker applies
its share of the compute's span budget, and since it cannot know
when a compute ends, it settles a compute (kept slow tasks, one aggregate per prefix)
once it has run no task of it for :data:`SETTLE_AFTER_S`, and on every flush. Tasks that
carry no trace context (a client that is not instrumented) still count in the metrics.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import OrderedDict
from typing import Any

from opentelemetry import trace

from otel_graph.cluster import adapter
from otel_graph.cluster.clock import Reading, known_worker_clock, placement
from otel_graph.cluster.inside_tasks import take_span_id
from otel_graph.cluster.note import budget_of, clock_of, parent_span, traceparent_of
from otel_graph.cluster.process import _count_deliveries, _next_session, _ProcessTelemetry
from otel_graph.cluster.propagation import awaiting_notes, take_note
from otel_graph.naming import task_prefix
from otel_graph.telemetry.attributes import aggregate_attributes, key_text, run_attributes
from otel_graph.telemetry.function_names import function_names
from otel_graph.telemetry.passes import Passes
from otel_graph.telemetry.policy import Aggregate, SpanPlan

logger = logging.getLogger("otel_graph")

_MAX_TRACES = 4096
#: A compute with no task on this worker for this long is settled (flush and exit settle at once).
SETTLE_AFTER_S = 30.0
#: How long a run recorded before the scheduler heard this worker waits for its note.
LATE_NOTE_S = 5.0
_MAX_FAILED_TRACKED = 10_000  # per compute; a retry of a failure past it reads as a first run
#: Failed keys remembered over all computes (~100 B each): past it the oldest computes'
#: are let go, so a retry of theirs reads as a first run. Without it only _MAX_TRACES x
#: _MAX_FAILED_TRACKED bounded them.
_MAX_FAILED_HELD = 100_000
_WORKER_DRAIN_S = 1.0
_NO_EXTRA: dict[str, Any] = {}
#: Runs recorded before the drain thread is woken early: bounds what waits between drains
#: (a worker can finish 20,000 small tasks a second; each record holds ~300 B and a run_spec).
_DRAIN_AT = 4096


class _Trace:
    """One compute as seen from this worker: its parent context and its share of the budget.

    Kept after it settles (a settled plan holds no events), so that tasks of the same
    compute arriving later spend what is left of its budget rather than a fresh one.
    """

    __slots__ = ("parent", "plan", "last_seen", "dirty", "failed", "caller", "shift_ns", "clock", "kept")

    def __init__(self, parent: trace.Span, *, caller: Reading | None) -> None:
        self.parent, self.last_seen, self.dirty = parent, time.monotonic(), False
        self.plan: SpanPlan[adapter.TaskRun]
        #: The caller's clock against the scheduler's, from the note; None: the runs keep
        #: this worker's clock.
        self.caller = caller
        #: Added to the runs' times to put them on the caller's timeline, and the
        #: ``dask.clock.*`` attributes that say so (:meth:`place`).
        self.shift_ns = 0
        self.clock: dict[str, float] = {}
        #: hash(key): failed runs here, for the keys of this compute that failed on this worker.
        self.failed: dict[int, int] = {}
        #: Keys of the runs being planned whose code was given their span's id (.inside_tasks):
        #: their spans are emitted whatever the budget (the plan's ``keep``).
        self.kept: set[Any] = set()

    def number_attempts(self, runs: list[adapter.TaskRun]) -> bool:
        """Mark a run of a key that failed here before in this compute (a retry) with its attempt.

        Only failures are remembered, so memory grows with failed tasks, not with the
        graph (remembering every key cost 80 B a task, 8 MB a worker at a 100,000 cap).
        By hash: the key objects stay Dask's to free; a 64-bit collision would only
        mark one run as a retry. True if it remembers more failed keys than before.
        """
        failed = self.failed
        before = len(failed)
        for i, run in enumerate(runs):
            if run.error is None and not failed:
                continue
            slot = hash(run.key)
            earlier = failed.get(slot, 0)
            if earlier:
                runs[i] = run._replace(attempt=earlier + 1)
            if run.error is not None and (earlier or len(failed) < _MAX_FAILED_TRACKED):
                failed[slot] = earlier + 1
        return len(failed) > before

    def place(self, here: tuple[int, int] | None) -> None:
        """Put this compute's spans from here on the caller's timeline (:func:`.clock.placement`),
        with ``here`` this worker's clock against the scheduler's as it is now."""
        shift_ns, clock = placement(self.caller, here)
        if clock:  # else as placed before (nothing measured here yet)
            self.shift_ns, self.clock = shift_ns, clock

    def settle(self) -> None:
        if self.dirty:
            self.dirty = False
            self.plan.finish()


class WorkerTelemetry:
    """Per worker: records runs from the event loop, builds telemetry on a thread."""

    def __init__(self, worker: Any, *, providers: Any, settings: Any, in_process: bool = False) -> None:
        self.address, self.name = adapter.worker_identity(worker)
        self._worker_ref = weakref.ref(worker)
        self._providers = providers
        #: A worker in an instrumented process follows that process's live instrumentation.
        self._in_process = in_process
        self._settings = settings
        self._emitter = providers.emitter
        self._metrics = providers.instruments.task_metrics
        #: Spans on this worker's clock; else on each compute's caller's (:mod:`.clock`).
        self._local = settings.clock == "local"
        self._pending: list[adapter.TaskRun] = []
        self._unnoted: list[adapter.TaskRun] = []  # runs waiting for a late note (_with_late_notes)
        self._traces: OrderedDict[str, _Trace] = OrderedDict()
        self._wake = threading.Condition(threading.Lock())
        self.record_errors = 0
        self.tasks_aggregated = 0
        self._closing = False
        self._closed = threading.Event()  # close() has turned every record into telemetry
        self.claimed = True  # False between a plugin's removal and its replacement's setup
        # Kicked once _DRAIN_AT runs wait; asked by a flush, which settles every compute.
        self._passes = Passes(self._pass, wake=self._wake, interval_s=min(settings.drain_interval_s, _WORKER_DRAIN_S),
                              name="otel-graph-worker", rest=True)
        self._passes.start()
        #: Reports what its exporter delivered to the scheduler's ledger (:mod:`.ledger`). A
        #: report is an event on a topic of its own: a scheduler without otel_graph's plugin
        #: keeps its last few like any event, and reads none. A worker in an instrumented
        #: process exports through that process's pipeline, which is not its to count.
        self.keeps_accounts = not in_process and _count_deliveries(providers)
        self._joined = self._said_closing = False
        #: Names this telemetry in its reports: a scheduler reading an earlier one's late
        #: goodbye (uninstrumented, then instrumented again) must not end this one's accounts.
        self._session = _next_session()
        self._metric_base = _ProcessTelemetry.metric_deliveries.totals()
        if self.keeps_accounts:
            _ProcessTelemetry.accounts[self.address] = self
            self.report_deliveries()  # joins the ledger, ahead of any task-finished of ours

    @property
    def assigns_span_ids(self) -> bool:
        """Whether a task's span can be given the id its code was handed (:mod:`.inside_tasks`)."""
        return bool(getattr(self._emitter, "sets_span_ids", False))

    @property
    def local(self) -> bool:
        """Whether spans keep this worker's clock (``OTEL_GRAPH_CLOCK=local``)."""
        return self._local

    # -- on the worker's event loop ------------------------------------------------------
    def record(self, worker: Any, key: Any) -> None:
        span_id = take_span_id(key)
        if self._closing:  # closed while a plugin still points here: nothing will drain it
            return
        try:
            run = adapter.task_run(worker, key, note=take_note(worker, key), address=self.address)
        except Exception:  # a changed internal must cost telemetry, never the worker
            self.record_errors += 1
            return
        if run is None:
            return
        if span_id:
            run = run._replace(span_id=span_id)
        if not self._joined and self.keeps_accounts:
            # Joins the ledger ahead of this run's task-finished message, which the worker
            # sends after this hook: a worker set up before it was connected (--preload)
            # could not join then.
            self.report_deliveries()
        pending = self._pending
        pending.append(run)
        if len(pending) == _DRAIN_AT:
            with self._wake:  # held only briefly by the drain thread, never across a drain
                self._passes.kick()

    def report_deliveries(self, *, closing: bool = False) -> bool:
        """Tell the scheduler what this worker's exporter delivered since the last report.

        From any thread: the message goes to the event loop, which puts it on the worker's
        stream after the ``task-finished`` messages of those tasks
        (:func:`.adapter.say_to_scheduler`: nothing the scheduler keeps or shows).
        The last one says the worker is ``closing``: what is left, it delivers on its way
        out or counts as undelivered itself.
        """
        worker = self._worker_ref()
        if not self.keeps_accounts or worker is None or self._said_closing:
            return False
        rows = _ProcessTelemetry.deliveries.take(self.address)
        # A process's task counts are its one worker's (several share a process only in an
        # instrumented one, where none keeps accounts). None: not counted here, so the
        # scheduler must not count this worker's runs against them.
        points = None
        if _ProcessTelemetry.counts_points and len(_ProcessTelemetry.accounts) == 1:
            points = _ProcessTelemetry.metric_deliveries.take(since=self._metric_base)
        if not rows and not points and self._joined and not closing:
            return False
        self._said_closing = closing
        connected = adapter.stream_open(worker)  # else distributed drops the message
        try:
            # Where the scheduler has otel_graph's plugin; any other ignores it.
            adapter.say_to_scheduler(worker, {"report": {"delivered": rows, "metrics": points, "closing": closing,
                                                         "session": self._session}})
        except Exception:  # the worker's loop is gone: so is the scheduler's ledger of it
            return False
        self._joined = self._joined or connected
        return True

    # -- flush and close ------------------------------------------------------------------
    def flush(self, timeout_s: float, *, export: bool = True) -> bool:
        """Turn everything recorded into telemetry, settle every compute, export; True if all went."""
        deadline = time.monotonic() + timeout_s
        with self._wake:
            # A thread that is gone (closed) has nothing left to drain: the export still goes.
            if self._passes.wait(self._passes.request(), deadline=deadline) is False:
                return False
        owned = self._providers.owned
        if owned is None or not export:
            return True
        return owned.flush(max(0.1, deadline - time.monotonic()))

    def close(self, timeout_s: float, *, export: bool = True) -> None:
        # What was recorded while instrumented goes out through the providers it was
        # recorded for, even if the process's instrumentation ended meanwhile.
        self._closing = True
        deadline = time.monotonic() + timeout_s
        self.flush(timeout_s, export=False)  # every record becomes spans, queued for export
        owned = self._providers.owned
        # A collector that is down or hung gets no more of this teardown: the spans stay
        # queued for the process's exit, which follows and asks again (waiting here too
        # made the waits add up). Without a verdict (slow, or hung for under a second),
        # the flush waits: that also tells the exit a hung one from a slow one. A worker
        # in an instrumented process leaves its spans to that process's pipeline, which
        # lives on: asking would put its exporters in exit's haste (no retry backoff) for good.
        if export and owned is not None and not self._in_process and \
                owned.collector_answers(min(0.2, timeout_s / 4)) is not False:
            owned.flush(max(0.1, deadline - time.monotonic()))
        self.report_deliveries(closing=True)
        with self._wake:
            self._passes.stop()
        self._closed.set()

    # -- the thread -----------------------------------------------------------------------
    def _pass(self, *, full: bool, asked: bool) -> None:
        """A pass of the thread (:class:`~otel_graph.telemetry.passes.Passes`): every pass drains
        all that waits; one a flush asked for settles every compute too."""
        try:
            self._drain(settle_all=asked)
        except Exception:
            logger.debug("otel_graph: worker telemetry drain failed", exc_info=True)

    def _follow_live(self) -> None:
        """In-process: use the live instrumentation's providers.

        With none live, ``uninstrument()`` is under way: it closes this telemetry next
        (``close_in_process``), and what was recorded goes out through the providers it
        was recorded under, which it flushes last: dropped here, a compute's task spans
        would be lost whenever a drain fell between the two.
        """
        from otel_graph.telemetry.process_state import live_providers

        live = live_providers()
        if live is not None and live is not self._providers:
            self._settle_all()  # what was planned under the old providers goes out through them
            self._providers, self._emitter = live, live.emitter
            self._metrics = live.instruments.task_metrics

    def _settle_all(self) -> None:
        for state in self._traces.values():
            state.settle()
        self._traces.clear()

    def _drain(self, *, settle_all: bool) -> None:
        count = len(self._pending)
        events = self._pending[:count]
        del self._pending[:count]  # appends from the event loop land after `count`
        events = self._with_late_notes(events, hold=not settle_all)
        if self._in_process:
            self._follow_live()
        now = time.monotonic()
        worker = self._worker_ref()
        clock = known_worker_clock(worker) if worker is not None else None
        here = clock.estimate_ns() if clock is not None else None  # this worker's clock minus the scheduler's
        if events:
            prefixes = [task_prefix(ev.key) for ev in events]
            self._metrics.record_tasks(events, prefixes, "distributed")
            by_trace: dict[str, tuple[list[adapter.TaskRun], list[str]]] = {}
            for ev, prefix in zip(events, prefixes, strict=False):
                traceparent = traceparent_of(ev.note)
                if traceparent is None:
                    continue
                group = by_trace.setdefault(traceparent, ([], []))
                group[0].append(ev)
                group[1].append(prefix)
            for traceparent, (runs, run_prefixes) in by_trace.items():
                state = self._trace(traceparent, runs[0].note)
                if state is not None and state.parent.get_span_context().trace_flags.sampled:
                    state.dirty, state.last_seen = True, now
                    state.place(here)
                    if state.number_attempts(runs):
                        self._bound_failed()
                    kept = state.kept
                    kept.update(run.key for run in runs if run.span_id)
                    state.plan.add(runs, run_prefixes)
                    kept.clear()
        # A compute quiet here for a while has (probably) ended on this worker: settle it.
        # Not at the first quiet drain: tasks slower than a drain would each become a
        # one-task aggregate span.
        for held in self._traces.values():
            if held.dirty and (settle_all or now - held.last_seen >= SETTLE_AFTER_S):
                held.place(here)
                held.settle()

    def _with_late_notes(self, events: list[adapter.TaskRun], *, hold: bool) -> list[adapter.TaskRun]:
        """Runs with their notes, where a note came after the run was recorded.

        The first tasks a scheduler sends a new worker go before it has heard that the
        worker reads notes; it hands those over when it does (:mod:`.propagation`). Until
        then, a run without a note is held, :data:`LATE_NOTE_S` at most, for its note.
        """
        held, self._unnoted = self._unnoted, []
        if held:
            events = held + events
        worker = self._worker_ref()
        if not events or worker is None:
            return events
        # Held while the scheduler may still hand notes over; after, one last look each.
        hold = hold and awaiting_notes(worker, within_s=LATE_NOTE_S)
        now_ns = time.time_ns()
        ready = []
        for ev in events:
            if ev.note is None:
                note = take_note(worker, ev.key)
                if note is not None:
                    ev = ev._replace(note=note)
                elif hold and now_ns - ev.end_ns < LATE_NOTE_S * 1e9:
                    self._unnoted.append(ev)
                    continue
            ready.append(ev)
        return ready

    def _trace(self, traceparent: str, note: Any) -> _Trace | None:
        state = self._traces.get(traceparent)
        if state is not None:
            self._traces.move_to_end(traceparent)
            return state
        parent = parent_span(note)
        if parent is None:
            return None
        state = _Trace(parent, caller=None if self._local else clock_of(note))
        state.plan = SpanPlan(budget=budget_of(note), emit=lambda ev, prefix: self._task_span(state, ev, prefix),
                              emit_aggregate=lambda agg: self._aggregate_span(state, agg), keep=state.kept,
                              hold=_without_run_spec)
        self._traces[traceparent] = state
        while len(self._traces) > _MAX_TRACES:
            self._traces.popitem(last=False)[1].settle()
        return state

    def _bound_failed(self) -> None:
        total = sum(len(state.failed) for state in self._traces.values())
        for state in self._traces.values():  # the least recently seen first
            if total <= _MAX_FAILED_HELD:
                break
            total -= len(state.failed)
            state.failed = {}

    def _task_span(self, state: _Trace, run: adapter.TaskRun, prefix: str) -> None:
        attributes = self._attributes(run, prefix)
        attributes.update(state.clock)
        shift = state.shift_ns
        # Only a DirectEmitter gives ids out (sets_span_ids), and only it takes span_id=.
        extra = {"span_id": run.span_id} if run.span_id and self.assigns_span_ids else _NO_EXTRA
        context = self._emitter.emit(parent=state.parent, name=self._metrics.span_name(prefix),
                                     start_ns=run.start_ns + shift, end_ns=run.end_ns + shift, attributes=attributes,
                                     error=run.error, **extra)
        if run.phases and context is not None:
            task = trace.NonRecordingSpan(context)
            for phase in run.phases:
                attributes = {"dask.task.key": key_text(run.key), "dask.worker.id": self.address}
                if phase.source:
                    attributes["dask.transfer.source"] = phase.source
                if phase.nbytes is not None:
                    attributes["dask.transfer.bytes"] = phase.nbytes
                self._emitter.emit(parent=task, name=phase.action, start_ns=phase.start_ns + shift,
                                   end_ns=phase.end_ns + shift, attributes=attributes)

    def _aggregate_span(self, state: _Trace, agg: Aggregate) -> None:
        self.tasks_aggregated += agg.count
        attributes = aggregate_attributes(agg)
        attributes["dask.worker.id"] = self.address
        attributes.update(state.clock)
        self._emitter.emit(parent=state.parent, name=self._metrics.span_name(agg.prefix),
                           start_ns=agg.start_ns + state.shift_ns, end_ns=agg.end_ns + state.shift_ns,
                           attributes=attributes)

    def _attributes(self, run: adapter.TaskRun, prefix: str) -> dict[str, Any]:
        attributes = run_attributes(run, prefix)  # run.worker is this worker's address
        attributes["dask.worker.name"] = self.name
        attributes["dask.task.dependency_count"] = run.dependency_count
        attributes["dask.task.dependent_count"] = run.dependent_count
        if run.dependencies:
            attributes["dask.task.dependencies"] = tuple(sorted(map(key_text, run.dependencies)))
        functions = run.functions if run.run_spec is None else function_names(run.run_spec)
        if functions:
            attributes["code.function.name"] = functions
        if run.retries:
            attributes["dask.task.retries"] = run.retries
        if run.attempt > 1:
            attributes["dask.task.attempt"] = run.attempt
        return attributes


def _without_run_spec(run: adapter.TaskRun) -> adapter.TaskRun:
    """A run kept for a span emitted later, holding its function names, not its run_spec.

    A run_spec can embed data of the graph's (an array literal, a model): held by a kept
    run, it would stay alive until the compute settles here, 30 s after its last task.
    """
    return run._replace(run_spec=None, functions=function_names(run.run_spec))
