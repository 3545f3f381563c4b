"""On the dask.distributed scheduler: cheap gauges, and the few events a trace needs.

The scheduler is every cluster's bottleneck (one event loop), so next to nothing here
runs per task. :class:`SchedulerTelemetryPlugin` does these things:

* **Gauges, read only when a metric reader collects**, from summaries the scheduler
  already keeps (:mod:`.scheduler_gauges`), and distributed's fine performance metrics
  as counters (:mod:`.fine_metrics`).
* **Each task's trace context**, from the note a client sent ahead of its graph, handed
  to the worker the task is sent to (:class:`.propagation.Routes`: a dict entry a task,
  and one message per worker and scheduler step).
* **Per graph update**, one event to subscribed clients with the number of tasks the
  update brought, for the compute span's ``dask.graph.tasks``, and its
  ``dask.graph.fingerprint``; **per compute**, once its outputs settle (and at its first
  failed output), one event to the client that submitted it with its failed tasks and
  result bytes (:mod:`.compute_totals`).
* **Per worker removed**, one event, so that open compute spans can say which worker
  was lost mid-graph, carrying what the worker took with it: tasks that ran there whose
  telemetry it never delivered (:mod:`.ledger`). That takes the one per-task step here,
  :meth:`SchedulerTelemetryPlugin.transition`: a tally per run that finished on a worker
  that keeps accounts (~3 us, measured; the scheduler spends ~100 us or more a task),
  and one to its compute's totals (~1-2 us more).
* It keeps the set of instrumented clients using the cluster (:func:`join_cluster`,
  :func:`leave_cluster`), so the last one to ``uninstrument()`` takes the plugins off
  and the others keep theirs.

Events go out on the ``otel-graph`` topic, to the clients subscribed to it (an
instrumented client is), and nowhere else: the scheduler does not keep them, so its
event log (``get_events()``, the dashboard) and other plugins never see them. Workers
say what the plugin needs (that they read task contexts; their delivery reports) on
their streams to the scheduler, inside the ``keep-alive`` messages every scheduler
takes and ignores (:func:`.adapter.say_to_scheduler`). Where the scheduler runs in a process without otel_graph
instrumented (``dask scheduler --preload otel_graph``), the gauges use an SDK built
from that process's own ``OTEL_*`` variables.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections import OrderedDict
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

from otel_graph.cluster import adapter, compute_totals, ledger
from otel_graph.cluster.note import traceparent_of
from otel_graph.cluster.propagation import (
    COMPUTE_OP,
    Routes,
    heard_listening,
    on_compute,
    seal_env,
    unseal_env,
)
from otel_graph.cluster.scheduler_gauges import PLUGIN_NAME, SCHEDULERS, observe_scheduler
from otel_graph.naming import OTHER_PREFIXES
from otel_graph.telemetry.job import graph_fingerprint

logger = logging.getLogger("otel_graph")

TOPIC = "otel-graph"

#: scheduler -> {address: WorkerState} of the workers that said they read task contexts,
#: on the connection that WorkerState stands for (a reconnect makes a new one). Per
#: scheduler, not per plugin: a worker says so once, and a plugin registered anew (the
#: last client left, or a user replaced it) must know it too.
_LISTENING: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: How long joining a cluster waits for its workers to say they read task contexts.
JOIN_WAIT_S = 1.0
#: Computes whose submitting client is remembered, for the event of a lost worker.
_MAX_OWNERS = 4096
#: Rows of lost telemetry one worker-lost event carries at most; past it, a compute's
#: prefixes are summed into one OTHER_PREFIXES row.
_MAX_LOST_ROWS = 2000


class SchedulerTelemetryPlugin(SchedulerPlugin):
    """Registered on the scheduler by an instrumented client or by ``--preload otel_graph``."""

    name = PLUGIN_NAME
    idempotent = True  # registering again (another client) keeps the one in place

    def __init__(self, client_env: dict[str, str] | None = None, *, preloaded: bool = False) -> None:
        self._sealed_env = seal_env(dict(client_env or {}))
        #: Put there by ``--preload``: the cluster's own, never taken off by a client.
        self.preloaded = preloaded
        #: Instrumented clients using this cluster: the plugins come off when the last leaves.
        self.clients: set[str] = set()
        self._ledger = ledger.Ledger()
        self._runs = ledger.MetricLedger()
        self._totals = compute_totals.ComputeTotals()
        #: The telemetry session each worker reports from.
        self._sessions: dict[str, int] = {}
        self._owners: OrderedDict[str, str] = OrderedDict()  # traceparent -> the client that submitted it
        self._scheduler: Any = None
        #: Each task's trace context, and its way to the task's worker (:mod:`.propagation`).
        self.routes = Routes()

    def __repr__(self) -> str:  # the client's environment may hold exporter credentials
        return "SchedulerTelemetryPlugin()"

    async def start(self, scheduler: Any) -> None:  # the scheduler gathers its plugins' starts: async only
        self._scheduler = scheduler
        adapter.add_stream_handler(scheduler, COMPUTE_OP, on_compute(weakref.ref(scheduler), PLUGIN_NAME))
        adapter.read_worker_says(scheduler, _worker_says(weakref.ref(scheduler)))
        _hear_again(scheduler, self.routes)  # never raises: a failure would fail the registration
        try:
            from otel_graph.cluster.process import adopt_client_env

            adopt_client_env(unseal_env(self._sealed_env))
            self.observe(scheduler)
        except Exception as exc:
            logger.warning("otel_graph: scheduler gauges are off: %s", exc)

    def observe(self, scheduler: Any) -> None:
        """Report the gauges through this process's instrumentation, or an SDK of its own.

        Again when a client joins: in a process instrumented anew while its cluster lived
        (an in-process cluster), the plugin in place reports through the new providers.
        """
        from otel_graph.cluster.process import process_providers
        from otel_graph.config import load_settings
        from otel_graph.telemetry.process_state import SCOPE, ensure_exit_hook, live_providers

        providers = live_providers()
        if providers is None:
            if scheduler in SCHEDULERS:
                return  # its own SDK is made once
            settings = load_settings()
            if settings.sdk_disabled:
                return
            providers = process_providers(settings, {"dask.scheduler.address": str(scheduler.address)})
            ensure_exit_hook()
        meter = providers.meter_provider.get_meter(SCOPE.name, SCOPE.version)
        observe_scheduler(providers.meter_provider, meter)
        SCHEDULERS[scheduler] = self

    async def close(self) -> None:
        scheduler = getattr(self, "_scheduler", None)
        if scheduler is not None:
            SCHEDULERS.pop(scheduler, None)

    def update_graph(self, scheduler: Any, *, client: str = "", keys: Any = (), tasks: Any = (),
                     **kwargs: Any) -> None:
        try:
            claimed = self.routes.claim(str(client), keys, tasks)
        except Exception:  # a changed internal costs the trace, never the scheduler
            logger.debug("otel_graph: could not read a graph update", exc_info=True)
            return
        note, sent, received = claimed if claimed is not None else (None, None, None)
        traceparent = traceparent_of(note)
        if note is not None and traceparent is not None:
            self._owners[traceparent] = str(client)
            self._owners.move_to_end(traceparent)
            while len(self._owners) > _MAX_OWNERS:
                self._owners.popitem(last=False)
            # sent/received/replied: three of a clock exchange's readings (:mod:`.clock`).
            adapter.publish(scheduler, TOPIC, {"op": "graph", "traceparent": traceparent,
                                               "tasks": len(tasks), "client": str(client),
                                               "fingerprint": _fingerprint(scheduler, tasks),
                                               "sent": sent, "received": received, "replied": time.time()})
            try:
                totals = self._totals.expect(note, str(client), adapter.unsettled(scheduler, keys))
            except Exception:  # a changed internal: the compute's totals stay unknown
                logger.debug("otel_graph: could not read a graph update's outputs", exc_info=True)
                return
            if totals is not None:
                self._send(scheduler, totals)

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        if finish == "processing":
            if self.routes.notes and self._scheduler is not None:
                try:
                    self.routes.hand_over(self._scheduler, key, str(kwargs.get("stimulus_id", "")))
                except Exception:  # a changed internal costs the trace, never the scheduler
                    logger.debug("otel_graph: could not hand a task's context over", exc_info=True)
            return
        if start == "processing" and (finish == "memory" or finish == "erred"):
            self._finished(key, finish == "erred", kwargs)
        if (finish == "memory" or finish == "erred" or finish == "forgotten") and self._totals.awaited \
                and key in self._totals.awaited:
            for totals in self._totals.settled(key, erred=finish == "erred"):
                self._send(self._scheduler, totals)
        if finish == "forgotten":
            self.routes.forget(key)

    def _finished(self, key: Any, failed: bool, details: dict) -> None:
        """A run ended: its compute's totals, and the ledgers of a worker that keeps accounts."""
        scheduler = self._scheduler
        if scheduler is None:
            return
        try:
            note = self.routes.notes.get(key)
            if note is not None:
                self._totals.ran(note, failed=failed, nbytes=-1 if failed else adapter.result_nbytes(scheduler, key))
            worker = details.get("worker")
            if worker is None or not self._ledger.keeps(worker):
                return
            # Only a worker the notes go to has spans of the run to deliver (or lose).
            run = adapter.finished_run(scheduler, key, details, note=self.routes.counted(worker, key, note))
            if run is None:
                return
            self._runs.finished(worker, run.prefix, failed=failed, duration_s=run.stop_s - run.start_s)
            traceparent = traceparent_of(run.note)
            # Unsampled computes get no spans anywhere, so nothing of them can be lost.
            if traceparent is not None and int(traceparent[-2:], 16) & 1:
                self._ledger.finished(worker, traceparent, run.prefix, start_s=run.start_s, stop_s=run.stop_s,
                                      failed=failed)
        except Exception:  # a changed internal costs the tallies, never the scheduler
            return

    def _send(self, scheduler: Any, totals: compute_totals.Totals) -> None:
        """A compute's totals, to the client that submitted it (:mod:`.compute_totals`)."""
        if scheduler is None:
            return
        try:
            adapter.publish(scheduler, TOPIC, {"op": "totals", "traceparent": traceparent_of(totals.note),
                                               "client": totals.client, "failed_tasks": totals.failed,
                                               "output_bytes": totals.nbytes}, to=totals.client)
        except Exception:  # its client's stream just broke: the compute's totals stay unknown
            logger.debug("otel_graph: could not send a compute's totals", exc_info=True)

    def log_event(self, topic: str, msg: Any) -> None:
        if topic == "stealing":
            # A steal the thief confirmed sends the task there outside any transition.
            stolen = adapter.stolen(msg)
            if stolen is not None and self._scheduler is not None and stolen[0] in self.routes.notes:
                try:
                    self.routes.hand_over(self._scheduler, stolen[0], str(msg[-1]))
                except Exception:
                    logger.debug("otel_graph: could not hand a stolen task's context over", exc_info=True)
            return
        if topic == ledger.TOPIC and isinstance(msg, dict):
            # A worker that was not told the scheduler reads its reports on its stream.
            self.delivery_report(msg.get("worker"), msg)

    def delivery_report(self, worker: Any, msg: Any) -> None:
        """A worker's report of what its exporter delivered (:mod:`.ledger`)."""
        if not isinstance(msg, dict) or not isinstance(worker, str) \
                or worker not in getattr(self._scheduler, "workers", ()):
            return
        try:
            if not self._current(worker, msg.get("session")):
                return
            closing = bool(msg.get("closing"))
            self._ledger.join(worker)  # any report says the worker keeps accounts
            self._ledger.delivered(worker, msg.get("delivered"), closing=closing)
            if msg.get("metrics") is not None:  # its task counts are exported, and counted
                self._runs.join(worker)
                self._runs.delivered(worker, msg.get("metrics"), closing=closing)
        except Exception:  # a report it cannot read costs the ledger, never the scheduler
            logger.debug("otel_graph: unreadable delivery report", exc_info=True)

    def _current(self, worker: str, session: Any) -> bool:
        """Is a report from the worker's current telemetry? A newer one starts its accounts
        afresh; a replaced one's late reports are ignored (see :mod:`.ledger`)."""
        if not isinstance(session, int):  # a worker of an earlier otel_graph: no sessions
            return True
        known = self._sessions.get(worker)
        if known is not None and session < known:
            return False
        if known is not None and session > known:
            self._ledger.forget(worker)
            self._runs.forget(worker)
        self._sessions[worker] = session
        return True

    def remove_client(self, scheduler: Any, client: str) -> None:
        self.clients.discard(client)
        self.routes.client_gone(client)
        self._totals.client_gone(client)

    def remove_worker(self, scheduler: Any, worker: str, *, stimulus_id: str = "", **kwargs: Any) -> None:
        # A retiring worker delivers its own on its way out, after the scheduler let it go
        # (a worker closing on its own says so first: see the ledger).
        self.routes.worker_gone(str(worker))
        _LISTENING.get(scheduler, {}).pop(str(worker), None)
        retired = str(stimulus_id).startswith("retire-workers")
        lost = [] if retired else self._lost_rows(str(worker))
        runs = [] if retired else [list(row) for row in self._runs.lost(str(worker))]
        self._ledger.forget(str(worker))
        self._runs.forget(str(worker))
        self._sessions.pop(str(worker), None)
        # Task metrics are not per compute: one instrumented client records the lost runs.
        recorder = min(self.clients) if self.clients else ""
        adapter.publish(scheduler, TOPIC, {"op": "worker-lost", "worker": str(worker), "time": time.time(),
                                    "stimulus_id": str(stimulus_id), "lost": lost, "lost_runs": runs,
                                    "runs_recorder": recorder})

    def _lost_rows(self, worker: str) -> list[list[Any]]:
        """``[traceparent, client, prefix, tasks, duration_s, start_s, stop_s]`` per prefix of a compute."""
        lost = self._ledger.lost(worker)
        if len(lost) > _MAX_LOST_ROWS:
            merged: dict[str, list[Any]] = {}
            for row in lost:
                total = merged.setdefault(row.traceparent, [0, 0.0, row.start_s, row.stop_s])
                total[0] += row.count
                total[1] += row.duration_s
                total[2], total[3] = min(total[2], row.start_s), max(total[3], row.stop_s)
            lost = [ledger.Lost(tp, OTHER_PREFIXES, *total) for tp, total in merged.items()]
        return [[row.traceparent, self._owners.get(row.traceparent, ""), row.prefix, row.count, row.duration_s,
                 row.start_s, row.stop_s] for row in lost]


def _worker_says(scheduler_ref: weakref.ref) -> Any:
    """What the scheduler does with what a worker says (:func:`.adapter.say_to_scheduler`):
    that it reads task contexts, and its delivery reports."""

    def heard(worker: Any, payload: Any) -> None:
        scheduler = scheduler_ref()
        if scheduler is None or not isinstance(payload, dict) or not isinstance(worker, str):
            return
        listening = heard_listening(payload)
        if listening:
            state = adapter.worker_state(scheduler, worker)
            if state is not None:
                said = _LISTENING.setdefault(scheduler, {})
                for address, known in list(said.items()):  # gone or reconnected since
                    if adapter.worker_state(scheduler, address) is not known:
                        del said[address]
                said[worker] = state
        plugin = _our_plugin(scheduler)
        if plugin is None:
            return
        plugin.routes.said_at(worker, payload.get("sent"))  # before the answer that carries it back
        if listening:
            plugin.routes.heard(scheduler, worker)
        if "report" in payload:
            plugin.delivery_report(worker, payload["report"])

    return heard


def _hear_again(scheduler: Any, routes: Routes) -> None:
    """A plugin new on a running scheduler: the workers that said, on their current
    connection, that they read task contexts do (they say so once)."""
    for address, state in list(_LISTENING.get(scheduler, {}).items()):
        if adapter.worker_state(scheduler, address) is state:
            try:
                routes.heard(scheduler, address)
            except Exception:  # its stream just broke: it says so again when it reconnects
                logger.debug("otel_graph: could not tell a worker it was heard", exc_info=True)


def _our_plugin(dask_scheduler: Any) -> Any:
    plugin = dask_scheduler.plugins.get(PLUGIN_NAME)
    return plugin if hasattr(plugin, "clients") else None


async def join_cluster(dask_scheduler: Any = None, client_id: str = "") -> dict[str, Any]:
    """Run on the scheduler (``Client.run_on_scheduler``) by a client that instruments it,
    once it has registered the plugins.

    ``clients``: the instrumented clients using the cluster (0: our plugin is not there);
    ``contexts``: the op the client sends a graph's context with, if the scheduler reads it.
    Workers that just set our plugin up say so on their streams, which may lag this call:
    it waits for them, :data:`JOIN_WAIT_S` at most (a worker without otel_graph, or with
    an earlier one, never says so: its tasks get no context, and it keeps its stream).
    """
    received = time.time()
    plugin = _our_plugin(dask_scheduler)
    if plugin is None:
        return {"clients": 0, "contexts": None}
    plugin.clients.add(client_id)
    try:
        plugin.observe(dask_scheduler)
    except Exception as exc:
        logger.warning("otel_graph: scheduler gauges are off: %s", exc)
    deadline = time.monotonic() + JOIN_WAIT_S
    while not set(dask_scheduler.workers) <= plugin.routes.ready and time.monotonic() < deadline:
        await asyncio.sleep(0.01)  # what the workers say comes on their streams, unsignalled
    contexts = COMPUTE_OP if adapter.handles(dask_scheduler, COMPUTE_OP) else None
    # received/replied: the scheduler's half of a clock exchange (:mod:`.clock`).
    return {"clients": len(plugin.clients), "contexts": contexts, "received": received, "replied": time.time()}


def contexts_read(dask_scheduler: Any = None) -> str | None:
    """Run on the scheduler by a client that registers nothing (inside a worker): the op
    the scheduler reads compute contexts on, or None where it does not."""
    plugin = _our_plugin(dask_scheduler)
    return COMPUTE_OP if plugin is not None and adapter.handles(dask_scheduler, COMPUTE_OP) else None


async def leave_cluster(dask_scheduler: Any = None, client_id: str = "") -> bool:
    """The client stops instrumenting; the last one takes the plugins off. True if it did.

    Runs on the scheduler's event loop: the scheduler plugin goes first, in the same
    step as the decision, so a client joining meanwhile finds none and registers anew
    (see ``ClusterMembership._join``). A preloaded cluster keeps its plugins.
    """
    plugin = _our_plugin(dask_scheduler)
    if plugin is None:
        return False
    plugin.clients.discard(client_id)
    if plugin.clients or getattr(plugin, "preloaded", False):
        return False
    dask_scheduler.remove_plugin(name=PLUGIN_NAME)
    SCHEDULERS.pop(dask_scheduler, None)  # remove_plugin does not call close()
    if PLUGIN_NAME in dask_scheduler.worker_plugins:
        await dask_scheduler.unregister_worker_plugin(comm=None, name=PLUGIN_NAME)
    return True


def _fingerprint(scheduler: Any, tasks: Any) -> str | None:
    """The ``dask.graph.fingerprint`` of the tasks a graph update brought: O(tasks), once a
    compute, against the update's own O(tasks) work (about 1.7 µs a task to its ~100)."""
    try:
        return graph_fingerprint(adapter.graph_dependencies(scheduler, tasks))
    except Exception:  # a changed internal costs the attribute, never the scheduler
        logger.debug("otel_graph: could not fingerprint a graph update", exc_info=True)
        return None
