"""A client attached to its cluster: the plugins there, and what the cluster tells it.

A client is *attached* once (at ``Client.start``, on its first traced call, or by
``instrument_scheduler(client=...)``): the scheduler and worker plugins are registered
if the cluster does not have them yet, the client joins the scheduler's set of
instrumented clients, and it listens to the ``otel-graph`` topic, whose events set
``dask.graph.tasks`` and add ``dask.worker.lost`` events to its open computes. A client
that distributed reconnected to a scheduler started anew on the same address is
attached again at its next traced call (:meth:`ClusterMembership._follow_scheduler`). Waiting
on the cluster is bounded (:data:`.bounded.CLUSTER_TIMEOUT_S`); past it the work goes on in the
background and the caller's call proceeds. ``uninstrument()`` leaves the cluster, and
the last instrumented client to leave takes the plugins off.

A client that registers nothing (inside a worker, where a task started it) only asks
whether the scheduler reads compute contexts. A client whose stream broke and came back
asks again, and joins again (the scheduler let it go with the stream). Until the
scheduler said it reads contexts on the client's current stream, a traced call's graph
goes without its context (counted: ``computes_without_task_context``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable
from typing import Any

from otel_graph.cluster import adapter
from otel_graph.cluster.bounded import CLUSTER_TIMEOUT_S, bounded, bounded_all
from otel_graph.cluster.clock import Clocks, Reading, observe_offsets
from otel_graph.cluster.note import clock_of, parent_span
from otel_graph.cluster.propagation import COMPUTE_OP, current_task_note
from otel_graph.cluster.scheduler import TOPIC, SchedulerTelemetryPlugin, contexts_read, join_cluster, leave_cluster
from otel_graph.cluster.worker import PLUGIN_NAME, WorkerTelemetryPlugin, flush_worker
from otel_graph.telemetry.compute_record import ComputeRecord

logger = logging.getLogger("otel_graph")

def _client_env() -> dict[str, str]:
    return {name: value for name, value in os.environ.items() if name.startswith("OTEL_")}


#: How long joining a scheduler waits for a reconnecting client's new stream.
_RECONNECT_WAIT_S = 5.0


def _reconnecting(client: Any) -> bool:
    """Whether the client is between streams: a scheduler's answer read then would be about
    no stream (the graph the client sends next goes on the one it gets), so joining waits."""
    return adapter.scheduler_stream(client) is None and getattr(client, "status", "") == "connecting"


class ClusterMembership:
    """The clients attached to their clusters; ``register=False`` (inside a worker) only asks, never registers."""

    def __init__(self, tracker: Any, settings: Any, *, register: bool = True) -> None:
        self._tracker = tracker
        self._settings = settings
        self._register = register
        self._attached: weakref.WeakSet = weakref.WeakSet()
        #: The scheduler each attached client was attached to (its ``Scheduler-<uuid>`` id).
        self._scheduler_ids: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        self._closed = False
        self._pending: set[Any] = set()  # asyncio tasks in flight: an unreferenced task may vanish
        #: client -> its stream to a scheduler known to read compute contexts (COMPUTE_OP).
        self._streams: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        #: Streams whose scheduler was asked again whether it reads contexts (:meth:`_reprobe`).
        self._probed: weakref.WeakSet = weakref.WeakSet()
        #: This process's clock against each scheduler's (:mod:`.clock`).
        self.clocks = Clocks()

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
            bounded(lambda: self._join(client), CLUSTER_TIMEOUT_S, "registering otel_graph's plugins")
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
        return SchedulerTelemetryPlugin(env), WorkerTelemetryPlugin(env, nested_capture=self._nested_capture(),
                                                                     nvtx=self._settings.nvtx)

    def _nested_capture(self) -> Any:
        """The class the workers trace the computes their tasks start with (None: untraced)."""
        return None

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
            sent = time.time()
            answer = client.run_on_scheduler(join_cluster, client_id=client.id)
            if self._joined(client, stream, answer, sent=sent, returned=time.time()):
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
            sent = time.time()
            answer = await client.run_on_scheduler(join_cluster, client_id=client.id)
            if self._joined(client, stream, answer, sent=sent, returned=time.time()):
                return

    def _joined(self, client: Any, stream: Any, answer: Any, *, sent: float, returned: float) -> bool:
        """Read :func:`join_cluster`'s answer: True if the client is in. Where the scheduler
        reads compute contexts, graphs sent on ``stream`` (the connection the client had
        before asking, and still has) carry theirs. The call was a clock exchange too."""
        if not isinstance(answer, dict) or not answer.get("clients"):
            return False
        self.clocks.exchanged(adapter.scheduler_address(client), [sent, answer.get("received"), answer.get("replied")],
                              returned)
        if answer.get("contexts") == COMPUTE_OP and stream is not None and adapter.scheduler_stream(client) is stream:
            self._streams[client] = stream
        return True

    def _probe(self, client: Any) -> None:
        """A client that registers nothing (inside a worker) asks whether the scheduler reads contexts."""
        stream = adapter.scheduler_stream(client)
        done, answer = bounded(lambda: client.run_on_scheduler(contexts_read), CLUSTER_TIMEOUT_S,
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
        asked = [functools.partial(client.run, flush_worker, timeout_s=timeout_s) for client in self._waitable()]
        return all(done and all(results.values()) for done, results in
                   bounded_all(asked, timeout_s, "flushing the workers"))

    def _waitable(self) -> list[Any]:
        return [client for client in list(self._attached)
                if getattr(client, "status", "") == "running" and not getattr(client, "asynchronous", False)]

    def worker_stats(self, timeout_s: float) -> tuple[dict[str, int], int]:
        """The delivery counters of the attached clusters' worker processes, summed; and how many answered."""
        from otel_graph.cluster.worker import worker_delivery

        by_pid: dict[tuple[str, int], dict[str, int]] = {}
        aggregated = 0
        asked = [functools.partial(client.run, worker_delivery) for client in self._waitable()]
        for done, results in bounded_all(asked, timeout_s, "reading the workers' delivery counters"):
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

    def observe_clocks(self, meter_provider: Any) -> None:
        """This process's clock against each scheduler's, as ``dask.clock.offset`` gauges."""
        observe_offsets(meter_provider, self.clocks)

    def clock_for_note(self, client: Any) -> Reading | None:
        """What a compute's note says of the caller's clock (:func:`.note.make_note`):
        this process's against the client's scheduler; inside a task, that task's caller's."""
        if self._settings.clock == "local":
            return None
        inside = current_task_note()
        if inside is not None:  # a compute a task started is on its caller's timeline
            return clock_of(inside)
        return self.clocks.reading(adapter.scheduler_address(client))

    def _on_event(self, client_id: str, cluster: str, event: Any) -> None:
        returned = time.time()
        try:
            _, message = event
            op = message.get("op")
            if op == "graph" and message.get("client") == client_id:
                self.clocks.exchanged(cluster, [message.get("sent"), message.get("received"), message.get("replied")],
                                      returned)
            if (op == "graph" or op == "totals") and message.get("client") == client_id:
                record = self._tracker.find_traceparent(message.get("traceparent"))
                # The scheduler sends both before it reports the compute's outputs, or in the same
                # step as the reports of outputs it had already, which this loop handles in one
                # go before a future's waiter runs: they come while the compute runs. After its
                # end (a compute the client cancelled, or whose futures it held already or
                # dropped at once) they are not the compute's own, drained or not.
                if record is not None and record.end_ns is None:
                    (_graph if op == "graph" else _totals)(record, message)
            elif op == "worker-lost":
                self._worker_lost(cluster, message, self._recover(client_id, cluster, message))
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
            if seen is None:
                seen = record.cluster_events = set()
            elif (worker, why) in seen:  # several clients of one cluster hear the same event
                continue
            seen.add((worker, why))
            attributes: dict[str, Any] = {"dask.worker.id": worker, "dask.worker.removal": why}
            context = record.span.get_span_context()
            count = recovered.get((context.trace_id, context.span_id))
            if count:
                attributes["dask.task.recovered"] = count
            record.span.add_event(name, attributes)

    def _recover(self, client_id: str, cluster: str, message: dict) -> dict[tuple[int, int], int]:
        """Spans for the tasks of this client's computes whose telemetry a lost worker took with it.

        One per compute and prefix, from the scheduler's ledger (:mod:`.ledger`), marked
        ``dask.task.recovered``; only the client that submitted the compute makes them, on
        its own clock (the ledger's times are the scheduler's). Returns the tasks recovered
        per compute, by its span's (trace id, span id).
        """
        worker = str(message.get("worker", ""))
        shift_s = (self.clocks.offset_s(cluster) if self._settings.clock != "local" else None) or 0.0
        per_compute: dict[tuple[int, int], int] = {}
        for row in message.get("lost") or ():
            try:
                traceparent, owner, prefix, count, duration_s, start_s, stop_s = row
                parent = parent_span(traceparent)
                if owner != client_id or parent is None or int(count) <= 0:
                    continue
                self._tracker.recovered(parent, prefix=str(prefix), count=int(count), duration_s=float(duration_s),
                                        start_ns=int((float(start_s) + shift_s) * 1e9),
                                        end_ns=int((float(stop_s) + shift_s) * 1e9),
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


def _graph(record: ComputeRecord, message: dict[str, Any]) -> None:
    """A graph update of the compute: its tasks, and its fingerprint (of several updates, the last's)."""
    record.graph_tasks = (record.graph_tasks or 0) + int(message.get("tasks", 0))
    fingerprint = message.get("fingerprint")
    if type(fingerprint) is str:
        record.fingerprint = fingerprint  # on its span as it ends


def _totals(record: ComputeRecord, message: dict[str, Any]) -> None:
    """A graph update's failed tasks and result bytes, counted by the scheduler (:mod:`.compute_totals`)."""
    failed, nbytes = message.get("failed_tasks"), message.get("output_bytes")
    if type(failed) is int and type(nbytes) is int:
        record.failed_tasks = max(record.failed_tasks, 0) + failed
        record.output_bytes = max(record.output_bytes, 0) + nbytes
