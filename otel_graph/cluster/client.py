"""On the client: one trace per client call that runs tasks, and the plugins on the cluster.

:class:`ClusterCapture` wraps ``Client.get`` (what ``dask.compute`` and
``collection.compute()`` use with a distributed client), ``Client.compute``,
``Client.persist``, ``Client.submit`` and ``Client.map`` on the class, so clients
created before and after instrumenting are covered alike. Each call is one trace (a
``map`` of 1,000 calls is one trace of 1,000 tasks); ``gather`` runs no tasks and
opens none. A wrapped call:

1. opens the ``dask.compute`` span (``dask.scheduler=distributed``), a child of the
   caller's current span, or, when called from inside a task, of that task's compute;
2. lets the call send its graph; just before the graph's ``update-graph`` message, on
   the same stream, the scheduler gets the compute's context and each worker's share of
   the span budget, which it hands to the workers with the tasks (:mod:`.propagation`).
   Nothing is added to the graph: no annotation, nothing a plugin or the dashboard sees;
3. ends the span when the results are in: when ``get`` returns, or when the last
   future of the other calls finishes, errs, is cancelled or is dropped (watched
   without holding the futures, so dropping them still releases their work).

A client is *attached* once (at ``Client.start``, on its first traced call, or by
``instrument_scheduler(client=...)``): the scheduler and worker plugins are registered
if the cluster does not have them yet, the client joins the scheduler's set of
instrumented clients, and it listens to the ``otel-graph`` topic, whose events set
``dask.graph.tasks`` and add ``dask.worker.lost`` events to its open computes. A client
that distributed reconnected to a scheduler started anew on the same address is
attached again at its next traced call (:meth:`ClusterCapture._follow_scheduler`). Waiting
on the cluster is bounded (:data:`CLUSTER_TIMEOUT_S`); past it the work goes on in the
background and the caller's call proceeds. ``uninstrument()`` leaves the cluster, and
the last instrumented client to leave takes the plugins off.

Asynchronous clients are traced alike: ``await client.compute(...)`` futures end their
span when they settle, and ``await Client(asynchronous=True)`` returns once attached.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
import os
import threading
import time
import types
import weakref
from collections import Counter
from collections.abc import Callable
from concurrent.futures import CancelledError
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace

from otel_graph.cluster import adapter
from otel_graph.cluster.propagation import COMPUTE_OP, compute_message, current_task_note, make_note, parent_span
from otel_graph.cluster.spans import SpanCapture, drop_own_frame, span_attributes, stand_ins
from otel_graph.cluster.scheduler import TOPIC, SchedulerTelemetryPlugin, contexts_read, join_cluster, leave_cluster
from otel_graph.cluster.worker import PLUGIN_NAME, WorkerTelemetryPlugin, flush_worker

logger = logging.getLogger("otel_graph")

#: Longest otel_graph waits on a cluster to register, leave or flush before going on.
CLUSTER_TIMEOUT_S = 10.0

#: Set while a traced call runs, so the calls it makes (``get`` -> ``gather``) are not traced again.
_INSIDE: contextvars.ContextVar[bool] = contextvars.ContextVar("otel_graph_inside", default=False)
#: The note (:mod:`.propagation`) of the traced call running in this context: it goes
#: ahead of the graph that call sends, and of no other.
_NOTE: contextvars.ContextVar[str | None] = contextvars.ContextVar("otel_graph_note", default=None)
_WRAPPED = ("get", "compute", "persist", "submit", "map")
#: Every message from the client to the scheduler goes through it; a graph as "update-graph".
_SENDS = "_send_to_scheduler"


def _client_env() -> dict[str, str]:
    return {name: value for name, value in os.environ.items() if name.startswith("OTEL_")}


def _futures(result: Any) -> list[Any]:
    from distributed import Future, futures_of

    if isinstance(result, Future):
        return [result]
    return list(futures_of(result))


#: How long joining a scheduler waits for a reconnecting client's new stream.
_RECONNECT_WAIT_S = 5.0


def _reconnecting(client: Any) -> bool:
    """Whether the client is between streams: a scheduler's answer read then would be about
    no stream (the graph the client sends next goes on the one it gets), so joining waits."""
    return adapter.scheduler_stream(client) is None and getattr(client, "status", "") == "connecting"


def _bounded(work: Callable[[], Any], timeout_s: float, what: str) -> tuple[bool, Any]:
    """Run ``work`` on a daemon thread; (True, result) if it finished in time, else (False, None).

    distributed's blocking client calls take no deadline and wait on every worker; a
    paused or dying worker must not hang ``flush()``, ``uninstrument()`` or ``Client()``.
    """
    return _bounded_all([work], timeout_s, what)[0]


def _bounded_all(works: list[Callable[[], Any]], timeout_s: float, what: str) -> list[tuple[bool, Any]]:
    """:func:`_bounded` for several calls (one per client) side by side, within one ``timeout_s``
    in all: one after another, each with its own, made a stuck cluster cost it once per client."""
    outcomes: list[list[Any]] = [[] for _ in works]

    def run(work: Callable[[], Any], outcome: list[Any]) -> None:
        try:
            outcome.append((True, work()))
        except Exception as exc:  # reported below, by type only
            outcome.append((False, exc))

    threads = [threading.Thread(target=run, args=(work, outcome), name=f"otel-graph-{what}", daemon=True)
               for work, outcome in zip(works, outcomes)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout_s
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    results = [outcome[0] if outcome else (False, None) for outcome in outcomes]
    silent = sum(not outcome for outcome in outcomes)
    if silent:  # once per call, not once per client of the same stuck cluster
        clients = f" ({silent} of {len(works)} clients)" if len(works) > 1 else ""
        logger.warning("otel_graph: the cluster did not answer %s within %.0f s%s; going on without waiting",
                       what, timeout_s, clients)
    for ok, value in results:
        if not ok and value is not None:
            logger.warning("otel_graph: %s failed: %s", what, type(value).__name__)
    return [(ok, value if ok else None) for ok, value in results]


def _as_if_in(original: Any, wrapper: Any) -> Any:
    """``wrapper``, run with the globals of the module ``original`` was defined in.

    distributed records the code that submitted a computation (``Computation.code``, shown
    on the dashboard) by walking up the stack past frames of modules it ignores
    (``distributed.diagnostics.computations.ignore-modules``: dask, distributed, ...), by
    their globals' ``__name__``. A wrapper's frame is on that stack; run in distributed's
    module it is skipped like the method it stands for, and the user's code is recorded,
    as without otel_graph. ``wrapper`` must read nothing from this module's globals (only
    its closure and builtins).
    """
    clone = types.FunctionType(wrapper.__code__, original.__globals__, wrapper.__name__, wrapper.__defaults__,
                               wrapper.__closure__)
    clone.__kwdefaults__ = wrapper.__kwdefaults__
    return functools.update_wrapper(clone, original)


class ClusterCapture:
    """Wraps the Client class; ``register=False`` (inside a worker) only listens, never registers."""

    def __init__(self, tracker: Any, settings: Any, *, register: bool = True) -> None:
        self._tracker = tracker
        self._settings = settings
        self._register = register
        self._originals: dict[str, Any] = {}
        self._attached: weakref.WeakSet = weakref.WeakSet()
        #: The scheduler each attached client was attached to (its ``Scheduler-<uuid>`` id).
        self._scheduler_ids: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        self._closed = False
        self._pending: set[Any] = set()  # asyncio tasks in flight: an unreferenced task may vanish
        #: client -> its stream to a scheduler known to read compute contexts (COMPUTE_OP).
        self._streams: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        #: Traced calls whose graph went without its context: the scheduler could not read it.
        self.unannounced = 0
        #: Streams whose scheduler was asked again whether it reads contexts (:meth:`_reprobe`).
        self._probed: weakref.WeakSet = weakref.WeakSet()
        #: ``distributed.span`` blocks as spans (:mod:`.spans`).
        self._spans = SpanCapture(tracker.tracer)

    # -- install ---------------------------------------------------------------------------
    def install(self) -> None:
        from distributed import Client

        # A distributed without it (renamed one day) gets no contexts sent: computes are
        # traced, their tasks counted, without spans (stats() says how many).
        for name in (*_WRAPPED, "start", *([_SENDS] if _SENDS in Client.__dict__ else [])):
            original = Client.__dict__[name]
            self._originals[name] = original
            wrap = {"start": self._wrap_start, _SENDS: self._wrap_send}.get(name)
            setattr(Client, name, wrap(original) if wrap is not None else self._wrap(original, name))
        self._spans.install()

    def uninstall(self, *, detach: bool = True) -> None:
        """Restore the Client class; with ``detach``, also leave the clusters (see the module docs)."""
        from distributed import Client

        self._closed = True
        self._spans.uninstall()
        for name, original in self._originals.items():
            setattr(Client, name, original)
        self._originals.clear()
        leaving = []
        for client in list(self._attached):
            self._attached.discard(client)
            if detach and getattr(client, "status", "") == "running":
                leave = self._leave(client)
                if leave is not None:
                    leaving.append(leave)
        if leaving:  # side by side: a cluster that does not answer costs the wait once
            _bounded_all(leaving, CLUSTER_TIMEOUT_S, "leaving the cluster")

    # -- attaching to a cluster --------------------------------------------------------------
    def attach(self, client: Any, *, reconnecting: bool = False) -> None:
        """Attach ``client`` once; see the module docs. Never raises.

        ``reconnecting``: the client is still reconnecting to a new scheduler; registering
        goes by RPC and the subscription is sent once it is connected, so it can attach.
        """
        status = getattr(client, "status", "")
        if not (status == "running" or reconnecting and status == "connecting") or not self._claim(client):
            return
        if getattr(client, "asynchronous", False):
            try:
                self._keep(asyncio.ensure_future(self.attach_async(client, claimed=True, again=reconnecting)))
            except RuntimeError:  # no running loop in this thread: the next traced call retries
                self._attached.discard(client)
            return
        if self._register:
            _bounded(lambda: self._join(client), CLUSTER_TIMEOUT_S, "registering otel_graph's plugins")
        else:
            self._probe(client)
        self._subscribe(client, again=reconnecting)

    async def attach_async(self, client: Any, *, claimed: bool = False, again: bool = False) -> None:
        if not claimed and not self._claim(client):
            return
        try:
            if self._register:
                await asyncio.wait_for(self._join_async(client), CLUSTER_TIMEOUT_S)
            else:
                await asyncio.wait_for(self._probe_async(client), CLUSTER_TIMEOUT_S)
        except Exception as exc:
            logger.warning("otel_graph: registering otel_graph's plugins failed: %s", type(exc).__name__)
        self._subscribe(client, again=again)

    def _keep(self, task: Any) -> None:
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    def _claim(self, client: Any) -> bool:
        with self._lock:
            if client in self._attached:
                return False
            self._attached.add(client)
            self._scheduler_ids[client] = adapter.scheduler_id(client)
            return True

    def _follow_scheduler(self, client: Any) -> None:
        """Attach again if the client's scheduler was replaced since it was attached.

        distributed reconnects a client to a scheduler started anew on the same address
        (after a crash, by a supervisor) on its own, but the new scheduler has none of our
        plugins, so its workers would make no task spans, and the client's subscription
        to our topic ended with the old one. The client learns the new scheduler's id when
        it reconnects (or from any call that asks the scheduler, such as
        ``wait_for_workers``): a dict lookup per traced call, no round trip.
        """
        if client not in self._attached:
            return
        current = adapter.scheduler_id(client)
        with self._lock:
            attached_to = self._scheduler_ids.get(client)
            if current is None or current == attached_to:
                return
            if attached_to is None:  # attached before the client knew its scheduler
                self._scheduler_ids[client] = current
                return
            self._attached.discard(client)
        self.attach(client, reconnecting=True)

    def _plugins(self) -> tuple[Any, Any]:
        env = _client_env()
        return SchedulerTelemetryPlugin(env), WorkerTelemetryPlugin(env)

    def _join(self, client: Any) -> None:
        # The plugins are idempotent: a cluster that has them (another client) keeps them as
        # they are, instead of every new client tearing them down and setting them up.
        # A second round covers the last other client taking them off in between.
        deadline = time.monotonic() + _RECONNECT_WAIT_S
        while _reconnecting(client) and time.monotonic() < deadline:
            time.sleep(0.01)  # distributed signals no reconnect; a traced call waits on it anyway
        stream = adapter.scheduler_stream(client)
        for _ in range(2):
            if self._closed:  # uninstrumented while this waited on the cluster
                return
            for plugin in self._plugins():
                client.register_plugin(plugin, name=PLUGIN_NAME)
            if self._joined(client, stream, client.run_on_scheduler(join_cluster, client_id=client.id)):
                return

    async def _join_async(self, client: Any) -> None:
        deadline = time.monotonic() + _RECONNECT_WAIT_S
        while _reconnecting(client) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        stream = adapter.scheduler_stream(client)
        for _ in range(2):
            if self._closed:
                return
            for plugin in self._plugins():
                await client.register_plugin(plugin, name=PLUGIN_NAME)
            if self._joined(client, stream, await client.run_on_scheduler(join_cluster, client_id=client.id)):
                return

    def _joined(self, client: Any, stream: Any, answer: Any) -> bool:
        """Read :func:`join_cluster`'s answer: True if the client is in. Where the scheduler
        reads compute contexts, graphs sent on ``stream`` (the connection the client had
        before asking, and still has) carry theirs."""
        if not isinstance(answer, dict) or not answer.get("clients"):
            return False
        if answer.get("contexts") == COMPUTE_OP and stream is not None and adapter.scheduler_stream(client) is stream:
            self._streams[client] = stream
        return True

    def _probe(self, client: Any) -> None:
        """A client that registers nothing (inside a worker) asks whether the scheduler reads contexts."""
        stream = adapter.scheduler_stream(client)
        done, answer = _bounded(lambda: client.run_on_scheduler(contexts_read), CLUSTER_TIMEOUT_S,
                                "asking the scheduler about trace contexts")
        if done and answer == COMPUTE_OP and stream is not None and adapter.scheduler_stream(client) is stream:
            self._streams[client] = stream

    async def _probe_async(self, client: Any) -> None:
        stream = adapter.scheduler_stream(client)
        answer = await client.run_on_scheduler(contexts_read)
        if answer == COMPUTE_OP and stream is not None and adapter.scheduler_stream(client) is stream:
            self._streams[client] = stream

    def _reprobe(self, client: Any) -> None:
        """The client's stream is not the one its scheduler said it reads contexts on (it
        reconnected, to the same scheduler or another): ask again, once per stream, in the
        background. Calls until the answer go without their context (counted)."""
        stream = adapter.scheduler_stream(client)
        if stream is None or stream in self._probed or getattr(client, "status", "") != "running":
            return
        self._probed.add(stream)

        async def probe() -> None:
            try:
                # Joins again where it registers: the scheduler let the client go when its
                # connection broke (remove_client), so it no longer counts as instrumented.
                ask = self._join_async(client) if self._register else self._probe_async(client)
                await asyncio.wait_for(ask, CLUSTER_TIMEOUT_S)
            except Exception:
                self._probed.discard(stream)  # the next traced call asks again
                logger.debug("otel_graph: could not ask the scheduler about trace contexts", exc_info=True)

        client.loop.add_callback(probe)

    def _leave(self, client: Any) -> Callable[[], Any] | None:
        """Stop listening to ``client``'s cluster; the blocking call that takes the plugins off, if any."""
        try:
            client.unsubscribe_topic(TOPIC)
        except Exception:
            logger.debug("otel_graph: unsubscribe failed", exc_info=True)
        if not self._register:
            return None
        if getattr(client, "asynchronous", False):
            try:
                self._keep(asyncio.ensure_future(self._leave_async(client)))
            except RuntimeError:
                logger.debug("otel_graph: no loop to leave an asynchronous client's cluster on")
            return None
        return lambda: client.run_on_scheduler(leave_cluster, client_id=client.id)

    async def _leave_async(self, client: Any) -> None:
        await client.run_on_scheduler(leave_cluster, client_id=client.id)

    def _subscribe(self, client: Any, *, again: bool = False) -> None:
        handler = functools.partial(self._on_event, str(client.id), adapter.scheduler_address(client))
        if again:
            # By whoever claimed the re-attach, just before subscribing: done by the thread
            # that noticed the new scheduler, it could land after another's new subscription.
            try:
                client.unsubscribe_topic(TOPIC)  # so that subscribing again replaces it quietly
            except Exception:
                logger.debug("otel_graph: unsubscribe failed", exc_info=True)
        try:
            client.subscribe_topic(TOPIC, handler)
        except Exception:
            logger.debug("otel_graph: could not subscribe to the scheduler's events", exc_info=True)

    def flush(self, timeout_s: float) -> bool:
        """Ask every attached cluster's workers to export what they have; True if all did in time."""
        # An asynchronous client's workers cannot be waited on from here; they export
        # every second and at teardown regardless.
        asked = [lambda client=client: client.run(flush_worker, timeout_s=timeout_s) for client in self._waitable()]
        return all(done and all(results.values()) for done, results in
                   _bounded_all(asked, timeout_s, "flushing the workers"))

    def _waitable(self) -> list[Any]:
        return [client for client in list(self._attached)
                if getattr(client, "status", "") == "running" and not getattr(client, "asynchronous", False)]

    def worker_stats(self, timeout_s: float) -> tuple[dict[str, int], int]:
        """The delivery counters of the attached clusters' worker processes, summed; and how many answered."""
        from otel_graph.cluster.worker import worker_delivery

        by_pid: dict[tuple[str, int], dict[str, int]] = {}
        aggregated = 0
        asked = [lambda client=client: client.run(worker_delivery) for client in self._waitable()]
        for done, results in _bounded_all(asked, timeout_s, "reading the workers' delivery counters"):
            for address, answer in (results or {}).items() if done else ():
                if answer is None:
                    continue
                pid, counters = answer
                aggregated += counters.pop("tasks_aggregated", 0)
                # Workers sharing a process share its exporter: count that process once.
                by_pid[(address.rsplit(":", 1)[0], pid)] = counters
        totals: Counter[str] = Counter()
        for counters in by_pid.values():
            totals.update(counters)  # adds
        totals["tasks_aggregated"] = aggregated
        return dict(totals), len(by_pid)

    def _on_event(self, client_id: str, cluster: str, event: Any) -> None:
        try:
            _, message = event
            if message.get("op") == "graph" and message.get("client") == client_id:
                record = self._tracker.find_traceparent(message.get("traceparent"))
                if record is not None:
                    record.graph_tasks = (record.graph_tasks or 0) + int(message.get("tasks", 0))
            elif message.get("op") == "worker-lost":
                self._worker_lost(cluster, message, self._recover(client_id, message))
                if message.get("runs_recorder") == client_id:
                    self._recover_runs(message)
        except Exception:
            logger.debug("otel_graph: bad scheduler event", exc_info=True)

    def _worker_lost(self, cluster: str, message: dict, recovered: dict[tuple[int, int], int]) -> None:
        """An event on each open compute of the cluster; with ``dask.task.recovered``, how many
        of its tasks the worker took with it (``recovered``, by (trace id, span id))."""
        worker, why = str(message.get("worker", "")), str(message.get("stimulus_id", ""))
        # Graceful retirement (scaling down) is not a loss; say which it was.
        name = "dask.worker.retired" if why.startswith("retire-workers") else "dask.worker.lost"
        for record in self._tracker.running():
            if record.scheduler != "distributed" or record.cluster != cluster:
                continue
            seen = record.cluster_events
            if (worker, why) in seen:  # several clients of one cluster hear the same event
                continue
            seen.add((worker, why))
            attributes: dict[str, Any] = {"dask.worker.id": worker, "dask.worker.removal": why}
            context = record.span.get_span_context()
            count = recovered.get((context.trace_id, context.span_id))
            if count:
                attributes["dask.task.recovered"] = count
            record.span.add_event(name, attributes)

    def _recover(self, client_id: str, message: dict) -> dict[tuple[int, int], int]:
        """Spans for the tasks of this client's computes whose telemetry a lost worker took with it.

        One per compute and prefix, from the scheduler's ledger (:mod:`.ledger`), marked
        ``dask.task.recovered``; only the client that submitted the compute makes them.
        Returns the tasks recovered per compute, by its span's (trace id, span id).
        """
        worker = str(message.get("worker", ""))
        per_compute: dict[tuple[int, int], int] = {}
        for row in message.get("lost") or ():
            try:
                traceparent, owner, prefix, count, duration_s, start_s, stop_s = row
                parent = parent_span(traceparent)
                if owner != client_id or parent is None or int(count) <= 0:
                    continue
                self._tracker.recovered(parent, prefix=str(prefix), count=int(count), duration_s=float(duration_s),
                                        start_ns=int(float(start_s) * 1e9), end_ns=int(float(stop_s) * 1e9),
                                        worker=worker)
                context = parent.get_span_context()
                compute = (context.trace_id, context.span_id)
                per_compute[compute] = per_compute.get(compute, 0) + int(count)
            except Exception:
                logger.debug("otel_graph: bad row of lost telemetry", exc_info=True)
        return per_compute

    def _recover_runs(self, message: dict) -> None:
        """Task metrics for a lost worker's runs whose own never left it (:mod:`.ledger`)."""
        for row in message.get("lost_runs") or ():
            try:
                prefix, failed, count, duration_s = row
                if int(count) > 0:
                    self._tracker.recovered_runs(str(prefix), failed=bool(failed), count=int(count),
                                                 duration_s=float(duration_s))
            except Exception:
                logger.debug("otel_graph: bad row of lost task metrics", exc_info=True)

    # -- wrappers --------------------------------------------------------------------------
    def _wrap_start(self, original: Any) -> Any:
        capture = self

        @functools.wraps(original)
        def start(client: Any, **kwargs: Any) -> Any:
            result = original(client, **kwargs)
            try:
                if getattr(client, "asynchronous", False):
                    adapter.chain_async_start(client, lambda: capture.attach_async(client))
                else:
                    capture.attach(client)
            except Exception:
                logger.debug("otel_graph: attach at start failed", exc_info=True)
            return result

        return start

    def _wrap_send(self, original: Any) -> Any:
        capture = self

        @functools.wraps(original)
        def send(client: Any, msg: Any) -> Any:
            note = _NOTE.get()
            if note is not None and type(msg) is dict and msg.get("op") == "update-graph":
                capture._announce(client, note, msg)
            return original(client, msg)

        return send

    def _announce(self, client: Any, note: str, graph: dict) -> None:
        """Queue the compute's context on the client's loop just ahead of the graph's message
        (``_send_to_scheduler`` queues that next, and the loop runs them in order)."""
        try:
            stream = self._streams.get(client)
            if stream is None or adapter.scheduler_stream(client) is not stream:
                self.unannounced += 1
                if stream is not None:
                    self._reprobe(client)
                return
            message = compute_message(note, graph.get("keys") or ())

            def send() -> None:
                # Only on the connection the scheduler said it reads them on: a new
                # scheduler without our plugin would close the stream on an unknown op.
                if adapter.scheduler_stream(client) is stream:
                    try:
                        stream.send(message)
                    except Exception:  # the stream broke: so does the graph's, which distributed says
                        self.unannounced += 1

            client.loop.add_callback(send)
        except Exception:
            self.unannounced += 1
            logger.debug("otel_graph: could not send a compute's context", exc_info=True)

    def _wrap(self, original: Any, kind: str) -> Any:
        # Run in distributed's module (_as_if_in), so it reads no global of ours: all it
        # needs comes through the closure.
        inside, enter, failed, returned = _INSIDE, self._enter, self._failed, self._returned
        drop_frame = drop_own_frame

        def traced(client: Any, *args: Any, **kwargs: Any) -> Any:
            if inside.get():
                return original(client, *args, **kwargs)
            call = enter(client)
            if call is None:
                return original(client, *args, **kwargs)
            try:
                result = original(client, *args, **kwargs)
            except BaseException as exc:
                failed(call, exc)
                drop_frame(exc)
                raise
            return returned(call, kind, client, kwargs, result)

        return _as_if_in(original, traced)

    def _enter(self, client: Any) -> tuple[Any, Any, Any] | None:
        """Open the call's compute span; (record, tokens...) or None when it cannot be traced."""
        record = None
        outer: list[Any] = []
        try:
            self._follow_scheduler(client)
            self.attach(client)
            record = self._begin(outer)
            record.cluster = adapter.scheduler_address(client)
            named = span_attributes()  # the distributed span it is submitted in
            if named:
                record.span.set_attributes(named)
            budget = self._settings.max_task_spans
            if budget is not None:
                budget = -(-budget // adapter.client_worker_count(client))
            note = make_note(record.span.get_span_context(), budget=budget)
        except Exception:
            if record is not None:
                self._tracker.end(record, None)
            else:
                for span in reversed(outer):
                    span.end()
            self._tracker.failed_to_begin()
            logger.debug("otel_graph: could not open a distributed compute span", exc_info=True)
            return None
        return record, _INSIDE.set(True), _NOTE.set(note)

    def _exit(self, call: tuple[Any, Any, Any]) -> Any:
        record, inside, noted = call
        _NOTE.reset(noted)
        _INSIDE.reset(inside)
        return record

    def _failed(self, call: tuple[Any, Any, Any], exc: BaseException) -> None:
        try:
            self._tracker.end(self._exit(call), exc)
        except Exception:
            logger.debug("otel_graph: could not end a failed compute's span", exc_info=True)

    def _returned(self, call: tuple[Any, Any, Any], kind: str, client: Any, kwargs: dict, result: Any) -> Any:
        record = self._exit(call)
        try:
            returns_results = (kind == "get" and kwargs.get("sync", True)) or (kind == "compute" and kwargs.get("sync"))
            if returns_results and inspect.isawaitable(result):
                return self._end_when_awaited(record, result)  # an asynchronous client's
            if returns_results:
                self._tracker.end(record, None)
            else:
                self._end_when_settled(client, record, result)
        except Exception:
            self._tracker.end(record, None)
            logger.debug("otel_graph: could not watch a compute's futures", exc_info=True)
        return result

    def _begin(self, outer: list[Any]) -> Any:
        """Open the compute span; ``outer`` gets the spans opened around it (:func:`.spans.stand_ins`)."""
        current = trace.get_current_span()
        inside = parent_span(current_task_note())
        # Inside a task, nest under the task's compute, unless the task's own code opened a
        # span of that trace. A thread of an in-process worker may carry an unrelated
        # context (wherever the cluster was started), which must not win.
        if inside is not None and current.get_span_context().trace_id != inside.get_span_context().trace_id:
            token = otel_context.attach(trace.set_span_in_context(inside))
            try:
                return self._tracker.begin("distributed")
            finally:
                otel_context.detach(token)
        if inside is None:  # a task's own distributed span is its compute's, already traced
            outer.extend(stand_ins(self._tracker.tracer))
        if not outer:
            return self._tracker.begin("distributed")
        token = otel_context.attach(trace.set_span_in_context(outer[-1]))
        try:
            record = self._tracker.begin("distributed")
        finally:
            otel_context.detach(token)
        if record is not None:
            record.outer = tuple(reversed(outer))
        return record

    async def _end_when_awaited(self, record: Any, pending: Any) -> Any:
        try:
            result = await pending
        except BaseException as exc:
            self._tracker.end(record, exc)
            raise
        self._tracker.end(record, None)
        return result

    def _end_when_settled(self, client: Any, record: Any, result: Any) -> None:
        futures = _futures(result)
        if not futures:
            self._tracker.end(record, None)
            return
        errors: list[BaseException] = []

        def settled(key: Any, status: str, error: BaseException | None) -> None:
            try:
                if status == "cancelled":
                    record.span.add_event("dask.future.cancelled", {"dask.task.key": str(key)})
                    error = CancelledError(f"future {key} was cancelled")
                elif status == "released":
                    record.span.add_event("dask.future.released", {"dask.task.key": str(key)})
                elif status == "error" and error is None:
                    error = RuntimeError(f"future {key} erred")
            except Exception:
                logger.debug("otel_graph: could not note a future's end", exc_info=True)
            if error is not None and not errors:
                errors.append(error)

        adapter.watch_futures(client, futures, settled,
                              done=lambda: self._tracker.end(record, errors[0] if errors else None))
