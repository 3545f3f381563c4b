"""On each dask.distributed worker: a span per task run there, task metrics, and readings.

:class:`WorkerTelemetryPlugin` is registered on every worker by an instrumented client
(or by ``dask worker --preload otel_graph``). Its ``transition`` hook runs on the
worker's event loop, so it only copies what the worker recorded about a finished run
(:func:`otel_graph.cluster.adapter.task_run`: plain values, a few microseconds). A
background thread, :class:`WorkerTelemetry`, turns those records into spans and metric
points every ``OTEL_GRAPH_DRAIN_INTERVAL`` (at most 1 s here), or sooner once
:data:`_DRAIN_AT` runs wait (what a busy worker holds between drains stays small), and
exports them with the worker's own SDK. As the collector takes each batch, the worker
reports what it delivered to the scheduler's ledger (:mod:`.ledger`), so that what a
worker killed outright takes with it is still counted.

Spans
-----
A task span is the ``compute`` phase, on the worker's clock, under the ``dask.compute``
span whose context the scheduler handed the worker with the task (:mod:`.propagation`). It carries
the core task attributes, with ``dask.worker.id`` the worker's address, plus
``dask.worker.name``. ``transfer`` (inputs gathered from other workers, with
``dask.transfer.source`` and ``dask.transfer.bytes``), ``disk-read`` and ``disk-write``
(spilling, where distributed timed it above 5 ms) become child spans. A task that allows retries carries
``dask.task.retries``; a run of a key that failed on this worker earlier in the same
compute (a retry landing here) carries ``dask.task.attempt``.

Spilling is also counted in full, from the worker's own totals, as
``dask.worker.spill.io`` (By), ``.operations`` and ``.time`` (s), by
``dask.spill.direction`` (write, read).

Each worker applies its share of the compute's span budget, and since it cannot know
when a compute ends, it settles a compute (kept slow tasks, one aggregate per prefix)
once it has run no task of it for :data:`SETTLE_AFTER_S`, and on every flush. Tasks that
carry no trace context (a client that is not instrumented) still count in the metrics.

Where the telemetry goes: the worker's own ``OTEL_*`` variables; when the worker has
none at all, those of the client that registered the plugin (they may hold exporter
credentials, so the plugin never shows them in its repr or in logs).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections import OrderedDict
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin
from opentelemetry import trace
from opentelemetry.metrics import Observation

from otel_graph.cluster import adapter, ledger
from otel_graph.cluster.propagation import (
    awaiting_notes,
    budget_of,
    listen_on_worker,
    say_listening,
    parent_span,
    seal_env,
    take_note,
    traceparent_of,
    unseal_env,
)
from otel_graph.config import exit_timeout
from otel_graph.events import task_prefix
from otel_graph.policy import Aggregate, SpanPlan
from otel_graph.spans import aggregate_attributes, function_names, key_text, run_attributes

logger = logging.getLogger("otel_graph")

PLUGIN_NAME = "otel-graph"
_RAN = frozenset({"executing", "long-running"})
_DONE = frozenset({"memory", "error"})
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
#: Runs recorded before the drain thread is woken early: bounds what waits between drains
#: (a worker can finish 20,000 small tasks a second; each record holds ~300 B and a run_spec).
_DRAIN_AT = 4096


class _Trace:
    """One compute as seen from this worker: its parent context and its share of the budget.

    Kept after it settles (a settled plan holds no events), so that tasks of the same
    compute arriving later spend what is left of its budget rather than a fresh one.
    """

    __slots__ = ("parent", "plan", "last_seen", "dirty", "failed")

    def __init__(self, parent: trace.Span, plan: SpanPlan) -> None:
        self.parent, self.plan, self.last_seen, self.dirty = parent, plan, time.monotonic(), False
        #: hash(key): failed runs here, for the keys of this compute that failed on this worker.
        self.failed: dict[int, int] = {}

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
        self._pending: list[adapter.TaskRun] = []
        self._unnoted: list[adapter.TaskRun] = []  # runs waiting for a late note (_with_late_notes)
        self._traces: OrderedDict[str, _Trace] = OrderedDict()
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._requested = self._completed = 0
        self._kicked = False  # woken before its interval: many runs are waiting
        self._stopping = False
        self.record_errors = 0
        self.tasks_aggregated = 0
        self._closing = False
        self._closed = threading.Event()  # close() has turned every record into telemetry
        self.claimed = True  # False between a plugin's removal and its replacement's setup
        interval = min(settings.drain_interval_s, _WORKER_DRAIN_S)
        self._interval = interval
        self._thread = threading.Thread(target=self._run, name="otel-graph-worker", daemon=True)
        self._thread.start()
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

    # -- on the worker's event loop ------------------------------------------------------
    def record(self, worker: Any, key: Any) -> None:
        if self._closing:  # closed while a plugin still points here: nothing will drain it
            return
        try:
            run = adapter.task_run(worker, key, note=take_note(worker, key), address=self.address)
        except Exception:  # a changed internal must cost telemetry, never the worker
            self.record_errors += 1
            return
        if run is None:
            return
        if not self._joined and self.keeps_accounts:
            # Joins the ledger ahead of this run's task-finished message, which the worker
            # sends after this hook: a worker set up before it was connected (--preload)
            # could not join then.
            self.report_deliveries()
        pending = self._pending
        pending.append(run)
        if len(pending) == _DRAIN_AT:
            with self._wake:  # held only briefly by the drain thread, never across a drain
                self._kicked = True
                self._wake.notify_all()

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
            self._requested += 1
            target = self._requested
            self._wake.notify_all()
            while self._completed < target and self._thread.is_alive():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._wake.wait(min(left, 0.5))
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
            self._stopping = True
            self._wake.notify_all()
        self._closed.set()

    # -- the thread -----------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._wake:
                if self._requested == self._completed and not self._stopping and not self._kicked:
                    self._wake.wait(self._interval)
                if self._stopping:
                    return
                target, self._kicked = self._requested, False
            settle_all = target != self._completed
            try:
                self._drain(settle_all=settle_all)
            except Exception:
                logger.debug("otel_graph: worker telemetry drain failed", exc_info=True)
            with self._wake:
                self._completed = target
                self._wake.notify_all()

    def _follow_live(self) -> None:
        """In-process: use the live instrumentation's providers.

        With none live, ``uninstrument()`` is under way: it closes this telemetry next
        (``close_in_process``), and what was recorded goes out through the providers it
        was recorded under, which it flushes last. (Dropping it here, as once, lost a
        compute's task spans when a drain fell between the two.)
        """
        from otel_graph.instrumentation import live_providers

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
        if events:
            prefixes = [task_prefix(ev.key) for ev in events]
            self._metrics.record_tasks(events, prefixes, "distributed")
            by_trace: dict[str, tuple[list[adapter.TaskRun], list[str]]] = {}
            for ev, prefix in zip(events, prefixes):
                traceparent = traceparent_of(ev.note)
                if traceparent is None:
                    continue
                group = by_trace.setdefault(traceparent, ([], []))
                group[0].append(ev)
                group[1].append(prefix)
            for traceparent, (group, group_prefixes) in by_trace.items():
                state = self._trace(traceparent, group[0].note)
                if state is not None and state.parent.get_span_context().trace_flags.sampled:
                    state.dirty, state.last_seen = True, now
                    if state.number_attempts(group):
                        self._bound_failed()
                    state.plan.add(group, group_prefixes)
        # A compute quiet here for a while has (probably) ended on this worker: settle it.
        # Not at the first quiet drain: tasks slower than a drain would each become a
        # one-task aggregate span.
        for state in self._traces.values():
            if settle_all or now - state.last_seen >= SETTLE_AFTER_S:
                state.settle()

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
        plan = SpanPlan(budget=budget_of(note),
                        emit=lambda ev, prefix: self._task_span(parent, ev, prefix),
                        emit_aggregate=lambda agg: self._aggregate_span(parent, agg),
                        hold=_without_run_spec)
        state = self._traces[traceparent] = _Trace(parent, plan)
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

    def _task_span(self, parent: trace.Span, run: adapter.TaskRun, prefix: str) -> None:
        context = self._emitter.emit(parent=parent, name=self._metrics.span_name(prefix), start_ns=run.start_ns,
                                     end_ns=run.end_ns, attributes=self._attributes(run, prefix), error=run.error)
        if run.phases and context is not None:
            task = trace.NonRecordingSpan(context)
            for phase in run.phases:
                attributes: dict[str, Any] = {"dask.task.key": key_text(run.key), "dask.worker.id": self.address}
                if phase.source:
                    attributes["dask.transfer.source"] = phase.source
                if phase.nbytes is not None:
                    attributes["dask.transfer.bytes"] = phase.nbytes
                self._emitter.emit(parent=task, name=phase.action, start_ns=phase.start_ns,
                                   end_ns=phase.end_ns, attributes=attributes)

    def _aggregate_span(self, parent: trace.Span, agg: Aggregate) -> None:
        self.tasks_aggregated += agg.count
        attributes = aggregate_attributes(agg)
        attributes["dask.worker.id"] = self.address
        self._emitter.emit(parent=parent, name=self._metrics.span_name(agg.prefix), start_ns=agg.start_ns,
                           end_ns=agg.end_ns, attributes=attributes)

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


class _ProcessTelemetry:
    """The WorkerTelemetry of each worker in this process (several, for an in-process cluster)."""

    lock = threading.Lock()
    by_worker: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
    nested: Any = None  # (tracker, capture) tracing computes that tasks here start
    #: What the process's span exporter delivered, per worker, until reported.
    deliveries = ledger.Deliveries()
    #: The task counts the process's metric exporter delivered (one worker's, with accounts);
    #: counted only where otel_graph's exporter pushes them (not to a Prometheus scrape).
    metric_deliveries = ledger.MetricDeliveries()
    counts_points = False
    #: Telemetry that reports deliveries, by worker address: kept while it closes too,
    #: since its last spans are delivered then.
    accounts: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
    #: Telemetry of removed plugins, closing on an executor (see close_in_process).
    closing: weakref.WeakSet = weakref.WeakSet()


_SESSION_LOCK = threading.Lock()  # not _ProcessTelemetry.lock: held while telemetry is made
_LAST_SESSION = [0]


def _next_session() -> int:
    # Grows within the process, and past a restarted process's at the same address.
    with _SESSION_LOCK:
        _LAST_SESSION[0] = max(time.time_ns(), _LAST_SESSION[0] + 1)
        return _LAST_SESSION[0]


def _count_deliveries(providers: Any) -> bool:
    """Have the process's span processor (and metric exporter) count what they deliver;
    False if spans cannot be counted."""
    owned = providers.owned
    processor = getattr(owned, "span_processor", None) if owned is not None else None
    if processor is None:  # traces off, or another exporter's pipeline
        return False
    if processor.on_delivered is None:
        processor.on_delivered = _on_delivered
    metrics = getattr(owned, "metric_exporter", None)
    if metrics is not None and metrics.on_delivered is None:
        metrics.on_delivered = _on_delivered_points
    _ProcessTelemetry.counts_points = metrics is not None and metrics.on_delivered is _on_delivered_points
    return processor.on_delivered is _on_delivered


def _on_delivered(spans: list[Any]) -> None:
    # On the export thread, as soon as the collector took a batch: the shorter the time
    # between delivery and report, the fewer tasks a kill in between counts twice.
    _ProcessTelemetry.deliveries.count(spans)
    _report_deliveries()


def _on_delivered_points(metrics_data: Any) -> None:
    _ProcessTelemetry.metric_deliveries.count(metrics_data)
    _report_deliveries()


def _report_deliveries() -> None:
    for telemetry in list(_ProcessTelemetry.accounts.values()):
        telemetry.report_deliveries()


def _trace_nested_computes(providers: Any, settings: Any) -> None:
    """In a worker process, trace computes that tasks start (``get_client().compute(...)``).

    They nest under the running task's compute (its note says which): without
    this, a nested compute would carry no trace context and its tasks no spans. Where
    the process is already instrumented (an in-process cluster), that covers it.
    """
    if _ProcessTelemetry.nested is not None:
        return
    from otel_graph.cluster.client import ClusterCapture
    from otel_graph.tracker import Tracker

    tracker = Tracker(tracer=providers.tracer, emitter=providers.emitter,
                      metrics=providers.instruments.task_metrics, max_task_spans=settings.max_task_spans,
                      drain_interval_s=min(settings.drain_interval_s, _WORKER_DRAIN_S),
                      progress_interval_s=settings.progress_interval_s)
    capture = ClusterCapture(tracker, settings, register=False)
    capture.install()
    _ProcessTelemetry.nested = (tracker, capture)


def _start(worker: Any, client_env: dict[str, str]) -> WorkerTelemetry | None:
    from otel_graph.config import load_settings
    from otel_graph.instrumentation import add_aggregated_source, ensure_exit_hook, live_providers

    with _ProcessTelemetry.lock:
        current = _ProcessTelemetry.by_worker.get(worker)
        if current is not None:
            current.claimed = True
            return current
        adopt_client_env(client_env)
        settings = load_settings()
        if settings.sdk_disabled:
            return None
        address, name = adapter.worker_identity(worker)
        providers = live_providers()
        in_process = providers is not None
        if providers is None:
            providers = process_providers(settings, {"dask.worker.id": address, "dask.worker.name": name})
            _trace_nested_computes(providers, settings)
            _deliver_on_sigterm()
        ensure_exit_hook()
        add_aggregated_source(_tasks_aggregated)
        telemetry = _ProcessTelemetry.by_worker[worker] = WorkerTelemetry(worker, providers=providers,
                                                                          settings=settings, in_process=in_process)
        _observe_spill(providers.meter_provider)
        return telemetry


#: The pid that installed :func:`_on_sigterm`: a child forked from a worker (a task's own
#: multiprocessing pool, say) inherits the handler but none of the threads it would need.
_SIGTERM_PID: int | None = None


def _deliver_on_sigterm() -> None:
    """In a worker process of its own, SIGTERM delivers what was recorded, then terminates as before.

    Python's default action for SIGTERM ends the process at once, without atexit: a
    worker process told to stop (``kill PID``; a batch system's SIGTERM to every
    process of a job, nanny and worker alike) would lose everything recorded since its
    last drain, including task spans whose results live on elsewhere and are never
    rerun. Only the default action is replaced: a handler of the application's (or of
    ``dask worker --no-nanny``, which closes the worker gracefully) is left alone. The
    process still ends by SIGTERM, so a nanny watching it sees what it saw before, at
    most :func:`sigterm_delivery_s` later once the handler runs. The cost: Python runs a
    handler only when the main thread can take the GIL, so a worker whose task holds it
    in one long C call ends at SIGTERM when that call returns, not at once (a nanny's
    SIGKILL still ends it at once).
    """
    global _SIGTERM_PID
    import signal

    # Python runs signal handlers on the main thread only, and only it may set them; an
    # in-process cluster's workers live on another thread (and the process has its own exit).
    if _SIGTERM_PID is not None or threading.current_thread() is not threading.main_thread():
        return
    try:
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return
        signal.signal(signal.SIGTERM, _on_sigterm)
    except (ValueError, OSError):  # no signals here (an embedded interpreter): only the signal is lost
        return
    _SIGTERM_PID = os.getpid()
    # A child forked from here (a task's own multiprocessing pool) has none of the threads
    # delivery needs, and a Python handler waits for the GIL: give it the default back.
    os.register_at_fork(after_in_child=_default_sigterm_in_child)


def _default_sigterm_in_child() -> None:
    import signal

    try:
        if signal.getsignal(signal.SIGTERM) is _on_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
    except (ValueError, OSError):  # forked from a thread other than the main one: not ours to set
        pass


def sigterm_delivery_s() -> float:
    """The most a SIGTERM waits for delivery: what a normal exit may take (drain, then deliver)."""
    return 2 * exit_timeout()


def _on_sigterm(signum: int, frame: Any) -> None:
    import signal

    # A second SIGTERM while this delivers ends the process at once, as the first would have.
    signal.signal(signum, signal.SIG_DFL)
    if os.getpid() == _SIGTERM_PID:
        try:
            # What a normal exit runs (the atexit hook), on a thread of its own: this thread
            # was interrupted anywhere, maybe holding a lock delivery needs, and the wait
            # must have a hard bound however the collector behaves.
            from otel_graph.instrumentation import _exit as deliver_as_at_exit

            delivery = threading.Thread(target=deliver_as_at_exit, name="otel-graph-sigterm", daemon=True)
            delivery.start()
            delivery.join(sigterm_delivery_s())
            if _end_once_reported(signum):
                return
        except BaseException:
            logger.debug("otel_graph: delivery on SIGTERM failed", exc_info=True)
    os.kill(os.getpid(), signum)


#: After a SIGTERM delivery, the longest the worker's stream gets to carry its last
#: report of deliveries to the scheduler before the process ends.
_REPORT_ON_SIGTERM_S = 0.5


def _end_once_reported(signum: int) -> bool:
    """End the process once the worker's stream has carried its last delivery report.

    The report was handed to the event loop, which this handler holds (it runs on the
    loop's thread): ending here would lose it, and the scheduler's ledger would count
    what was just delivered as taken away (:mod:`.ledger`). So the loop gets to flush
    the stream, within :data:`_REPORT_ON_SIGTERM_S`; a timer ends the process regardless.
    False when there is nothing to wait for.
    """
    import asyncio

    workers = [t._worker_ref() for t in list(_ProcessTelemetry.accounts.values()) if t._joined]
    workers = [w for w in workers if w is not None and adapter.stream_open(w)]
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return False
    if not workers:
        return False
    pid = os.getpid()

    def end() -> None:
        os.kill(pid, signum)  # the default action is back: this ends the process

    async def flush_then_end() -> None:
        try:
            await asyncio.sleep(0)  # the report's own callback runs first
            closings = [adapter.close_stream(w, timeout_s=_REPORT_ON_SIGTERM_S) for w in workers]
            await asyncio.wait_for(asyncio.gather(*(c for c in closings if c is not None), return_exceptions=True),
                                   _REPORT_ON_SIGTERM_S)
        except BaseException:
            pass
        end()

    timer = threading.Timer(_REPORT_ON_SIGTERM_S + 0.5, end)
    timer.daemon = True
    timer.start()
    loop.create_task(flush_then_end())
    return True


#: Ports tried after OTEL_EXPORTER_PROMETHEUS_PORT when several cluster processes share a host.
PROMETHEUS_PORT_SPAN = 64


def process_providers(settings: Any, resource_attributes: dict[str, Any]) -> Any:
    """Providers for a worker or scheduler process that otel_graph did not instrument itself.

    With ``OTEL_METRICS_EXPORTER=prometheus``, every process on a host cannot listen on
    one port: a process that finds it taken takes the next free one (up to
    :data:`PROMETHEUS_PORT_SPAN` further) and says so, so a scrape of that port range
    finds every process. Only when none is free do this process's metrics go off; its
    traces still flow.
    """
    from otel_graph.config import with_overrides
    from otel_graph.instrumentation import providers_for
    from otel_graph.sdk import PortInUse

    try:
        return providers_for(settings, resource_attributes=resource_attributes)
    except PortInUse:
        pass
    for offset in range(1, PROMETHEUS_PORT_SPAN + 1):
        moved = with_overrides(settings, prometheus_port=settings.prometheus_port + offset)
        try:
            providers = providers_for(moved, resource_attributes=resource_attributes)
        except PortInUse:
            continue
        logger.warning("otel_graph: port %d was taken; this process serves Prometheus metrics on %s:%d",
                       settings.prometheus_port, moved.prometheus_host, moved.prometheus_port)
        return providers
    logger.warning("otel_graph: no free Prometheus port in %d..%d; this process exports traces only",
                   settings.prometheus_port, settings.prometheus_port + PROMETHEUS_PORT_SPAN)
    return providers_for(with_overrides(settings, metrics_exporter="none"), resource_attributes=resource_attributes)


def _tasks_aggregated() -> int:
    return sum(t.tasks_aggregated for t in list(_ProcessTelemetry.by_worker.values()))


def _close_if_unclaimed(worker: Any, telemetry: WorkerTelemetry) -> None:
    import asyncio

    with _ProcessTelemetry.lock:
        if telemetry.claimed or _ProcessTelemetry.by_worker.get(worker) is not telemetry:
            return
        del _ProcessTelemetry.by_worker[worker]
        _ProcessTelemetry.closing.add(telemetry)
    asyncio.get_running_loop().run_in_executor(None, telemetry.close, telemetry._settings.exit_timeout_s)


def _stop(worker: Any, *, export: bool = True) -> None:
    with _ProcessTelemetry.lock:
        telemetry = _ProcessTelemetry.by_worker.pop(worker, None)
    if telemetry is not None:
        telemetry.close(telemetry._settings.exit_timeout_s, export=export)


def _observe_spill(meter_provider: Any) -> None:
    """Spill counters from the worker's own totals, read at collection: complete, with bytes.

    Per-task ``disk-read``/``disk-write`` spans only exist where distributed timed one
    above 5 ms; these counters count every spill.
    """
    from otel_graph.instrumentation import SCOPE

    if meter_provider in _SPILL_OBSERVED:
        return
    _SPILL_OBSERVED.add(meter_provider)
    meter = meter_provider.get_meter(SCOPE.name, SCOPE.version)

    def reading(unit: str) -> Any:
        def callback(options: Any) -> list[Observation]:
            points = []
            for worker in list(_ProcessTelemetry.by_worker.keys()):
                try:
                    totals = adapter.spill_totals(worker)
                except Exception:
                    continue
                address, name = adapter.worker_identity(worker)
                points += [Observation(totals.get((activity, unit), 0.0),
                                       {"dask.worker.id": address, "dask.worker.name": name,
                                        "dask.spill.direction": "write" if activity == "disk-write" else "read"})
                           for activity in ("disk-write", "disk-read")]
            return points

        return callback

    meter.create_observable_counter("dask.worker.spill.io", [reading("bytes")], unit="By",
                                    description="Bytes this worker wrote to or read from its spill disk.")
    meter.create_observable_counter("dask.worker.spill.operations", [reading("count")], unit="{operation}",
                                    description="Keys this worker spilled to or read back from disk.")
    meter.create_observable_counter("dask.worker.spill.time", [reading("seconds")], unit="s",
                                    description="Time this worker spent spilling and unspilling.")


_SPILL_OBSERVED: weakref.WeakSet = weakref.WeakSet()


def adopt_client_env(client_env: dict[str, str]) -> None:
    """Take the client's ``OTEL_*`` variables when this process has none of its own."""
    if client_env and not any(name.startswith("OTEL_") for name in os.environ):
        os.environ.update(client_env)


class WorkerTelemetryPlugin(WorkerPlugin):
    """Registered on every worker; see the module docs. Never raises into the worker."""

    name = PLUGIN_NAME
    idempotent = True  # registering again (another client) keeps the one in place

    def __init__(self, client_env: dict[str, str] | None = None) -> None:
        self._sealed_env = seal_env(dict(client_env or {}))
        self._telemetry: WorkerTelemetry | None = None
        self._worker: Any = None

    def __repr__(self) -> str:  # the client's environment may hold exporter credentials
        return "WorkerTelemetryPlugin()"

    def setup(self, worker: Any) -> None:
        self._worker = worker
        try:  # first: the scheduler sends task contexts once this worker says it reads them
            listen_on_worker(worker)
            say_listening(worker)
        except Exception:
            logger.debug("otel_graph: cannot read task contexts on this worker", exc_info=True)
        try:
            self._telemetry = _start(worker, unseal_env(self._sealed_env))
        except Exception as exc:
            # A bad configuration here must not take the worker down; say so once, without values.
            logger.warning("otel_graph: telemetry is off on worker %s: %s", getattr(worker, "address", "?"),
                           type(exc).__name__ if not isinstance(exc, ValueError) else exc)

    async def teardown(self, worker: Any) -> None:
        import asyncio

        self._telemetry = None
        if not adapter.is_closing(worker):
            # Replaced or removed on a running worker. A replacing plugin's setup runs next,
            # on this same loop turn (returning without awaiting keeps it so, and no task
            # finishes unseen in between): it takes the telemetry over. If none does by the
            # next turn, the plugin was removed, and the telemetry is closed.
            telemetry = _ProcessTelemetry.by_worker.get(worker)
            if telemetry is not None:
                telemetry.claimed = False
                asyncio.get_running_loop().call_soon(_close_if_unclaimed, worker, telemetry)
            return
        # Off the event loop: the final flush may wait on the collector.
        await asyncio.get_running_loop().run_in_executor(None, _stop, worker)

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        if start not in _RAN or finish not in _DONE:
            return
        telemetry = self._telemetry
        if telemetry is None or telemetry._closing:
            telemetry = self._revive()
            if telemetry is None:
                return
        telemetry.record(self._worker, key)

    def _revive(self) -> WorkerTelemetry | None:
        """An in-process worker whose telemetry ended with an ``uninstrument()`` and whose
        process is instrumented again: start anew with the new instrumentation."""
        from otel_graph.instrumentation import live_providers

        if self._worker is None or live_providers() is None:
            return None
        try:
            self._telemetry = _start(self._worker, unseal_env(self._sealed_env))
        except Exception:
            self._telemetry = None
        return self._telemetry


async def flush_worker(dask_worker: Any = None, timeout_s: float = 30.0) -> bool:
    """Run on each worker by ``handle.flush()`` (through ``Client.run``)."""
    import asyncio

    telemetry = _ProcessTelemetry.by_worker.get(dask_worker)
    if telemetry is None:
        return True
    nested = _ProcessTelemetry.nested

    def flush() -> bool:
        # Computes that tasks here started end before their task does: build their spans first.
        built = nested[0].flush(timeout_s) if nested is not None else True
        return telemetry.flush(timeout_s) and built

    return await asyncio.get_running_loop().run_in_executor(None, flush)


def worker_delivery(dask_worker: Any = None) -> tuple[int, dict[str, int]] | None:
    """Run on each worker by ``handle.stats(workers=True)``: its process's delivery counters.

    None for a worker living in the caller's process (its counters are the caller's own)
    or exporting through providers of someone else's. The pid lets the caller count a
    process hosting several workers once.
    """
    telemetry = _ProcessTelemetry.by_worker.get(dask_worker)
    if telemetry is None or telemetry._in_process or telemetry._providers.owned is None:
        return None
    current = telemetry._providers.owned.stats()
    current["tasks_aggregated"] = telemetry.tasks_aggregated
    return os.getpid(), current


def close_in_process() -> None:
    """On ``uninstrument()``: close the telemetry of workers living in this process, now.

    Their plugin may stay on the cluster (other instrumented clients), but what they
    recorded belongs to the instrumentation ending here, and must go out before it does.
    """
    for worker, telemetry in list(_ProcessTelemetry.by_worker.items()):
        if telemetry._in_process:
            _stop(worker)
    # And those a removed plugin is closing on an executor (the last client's leaving took
    # the plugins off): returning before they are done lost their spans, under load.
    for telemetry in list(_ProcessTelemetry.closing):
        if telemetry._in_process:
            telemetry._closed.wait(telemetry._settings.exit_timeout_s)


def close_at_exit() -> None:
    """At interpreter exit: what the workers recorded becomes spans; the exit hook then delivers once."""
    for worker in list(_ProcessTelemetry.by_worker.keys()):
        _stop(worker, export=False)
    if _ProcessTelemetry.nested is not None:
        tracker, capture = _ProcessTelemetry.nested
        capture.uninstall(detach=False)
        tracker.stop(exit_timeout())
