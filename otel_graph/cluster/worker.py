"""On each dask.distributed worker: the plugin that puts otel_graph there.

:class:`WorkerTelemetryPlugin` is registered on every worker by an instrumented client
(or by ``dask worker --preload otel_graph``). Its ``transition`` hook runs on the
worker's event loop, so it only copies what the worker recorded about a finished run
(:func:`otel_graph.cluster.adapter.task_run`: plain values, a few microseconds) to the
worker's :class:`.task_spans.WorkerTelemetry`, which makes spans and metric points of
them on a thread of its own. What a worker process shares among its workers (delivery
accounts, SIGTERM, its SDK, the spill counters) is in :mod:`.process`.

The plugin is idempotent: a second client registering it keeps the one the scheduler
holds. A plugin replaced or removed on a running worker (a preloaded one, which the
scheduler does not know, is replaced by a client's) hands its telemetry to its successor,
or closes it if none comes (:meth:`WorkerTelemetryPlugin.teardown`); a worker that
closes delivers what it recorded on its way out. Computes that tasks start
(``get_client().compute(...)``) are traced too, under the running task's compute, with
the capture class the plugin was given (the client's, or the preload's).

Where the telemetry goes: the worker's own ``OTEL_*`` variables; when the worker has
none at all, those of the client that registered the plugin (they may hold exporter
credentials, so the plugin never shows them in its repr or in logs).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from otel_graph.cluster import adapter
from otel_graph.cluster.inside_tasks import TaskContexts, placed, take_span_id
from otel_graph.cluster.process import (
    _deliver_on_sigterm,
    _observe_spill,
    _ProcessTelemetry,
    _tasks_aggregated,
    adopt_client_env,
    process_providers,
)
from otel_graph.cluster.propagation import listen_on_worker, say_listening, seal_env, unseal_env
from otel_graph.cluster.task_spans import _WORKER_DRAIN_S, WorkerTelemetry
from otel_graph.config import exit_timeout
from otel_graph.telemetry.nvtx_ranges import Ranges, process_ranges

logger = logging.getLogger("otel_graph")

PLUGIN_NAME = "otel-graph"
_RAN = frozenset({"executing", "long-running"})
_DONE = frozenset({"memory", "error"})


def _trace_nested_computes(providers: Any, settings: Any, *, nested_capture: Callable[..., Any] | None,
                           ranges: Ranges | None) -> None:
    """In a worker process, trace computes that tasks start (``get_client().compute(...)``),
    with ``nested_capture`` (:class:`otel_graph.cluster.client.ClusterCapture`; None: untraced).

    They nest under the running task's compute (its note says which): without
    this, a nested compute would carry no trace context and its tasks no spans. Where
    the process is already instrumented (an in-process cluster), that covers it.
    """
    if _ProcessTelemetry.nested is not None or nested_capture is None:
        return
    from otel_graph.telemetry.tracker import Tracker

    tracker = Tracker(tracer=providers.tracer, emitter=providers.emitter,
                      metrics=providers.instruments.task_metrics, max_task_spans=settings.max_task_spans,
                      drain_interval_s=min(settings.drain_interval_s, _WORKER_DRAIN_S),
                      progress_interval_s=settings.progress_interval_s, ranges=ranges)
    capture = nested_capture(tracker, settings, register=False)
    capture.install()
    _ProcessTelemetry.nested = (tracker, capture)


def _run_in_ranges(wanted: bool, worker: Any) -> Ranges | None:
    """With ``OTEL_GRAPH_NVTX`` (the worker's or its client's), this process's tasks run inside
    NVTX ranges (:mod:`otel_graph.telemetry.nvtx_ranges`) while it has workers with telemetry:
    the :class:`~otel_graph.telemetry.nvtx_ranges.Ranges`, or None (off, or no tool attached).
    Called under the process lock; a missing binding is said, never raised into the worker."""
    if not wanted:
        return None
    try:
        return process_ranges()
    except Exception as exc:  # ConfigurationError: no binding, or one too old
        logger.warning("otel_graph: no NVTX ranges on worker %s: %s", getattr(worker, "address", "?"), exc)
        return None


def _nothing_to_unwrap() -> None:
    return None


def _telemetry_of(worker: Any) -> WorkerTelemetry | None:
    return _ProcessTelemetry.by_worker.get(worker) if worker is not None else None


#: The running task's span current inside it, on every worker of this process with telemetry.
_CONTEXTS = TaskContexts(_telemetry_of)


def _wrap_runners(ranges: Ranges | None) -> None:
    """distributed's task runners wrapped (:func:`.adapter.run_tasks_within`), in ``ranges`` if
    given: once per process, again only to add ranges. Under the process lock."""
    if _ProcessTelemetry.unwrap_runners is not None:
        if ranges is None or _ProcessTelemetry.runners_ranged:
            return
        _ProcessTelemetry.unwrap_runners()
    try:
        _ProcessTelemetry.unwrap_runners = adapter.run_tasks_within(ranges, contexts=_CONTEXTS)
        _ProcessTelemetry.runners_ranged = ranges is not None
    except Exception as exc:  # a renamed runner: said once, never tried again
        logger.warning("otel_graph: distributed's task runners not found (%s): no task context inside tasks, no "
                       "NVTX ranges on workers, and task times shifted by the current scheduler_delay", exc)
        _ProcessTelemetry.unwrap_runners, _ProcessTelemetry.runners_ranged = _nothing_to_unwrap, True


def _unwrap_when_idle() -> None:
    """The last worker's telemetry gone: distributed's task runners as they were. Under the process lock."""
    if not _ProcessTelemetry.by_worker and _ProcessTelemetry.unwrap_runners is not None:
        unwrap, _ProcessTelemetry.unwrap_runners = _ProcessTelemetry.unwrap_runners, None
        _ProcessTelemetry.runners_ranged = False
        unwrap()


def _start(worker: Any, client_env: dict[str, str], *, nested_capture: Callable[..., Any] | None,
           nvtx: bool = False) -> WorkerTelemetry | None:
    from otel_graph.config import load_settings
    from otel_graph.telemetry.process_state import add_aggregated_source, before_exit, ensure_exit_hook, live_providers

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
        ranges = _run_in_ranges(nvtx or settings.nvtx, worker)
        _wrap_runners(ranges)
        # Before anything it would close exists (the nested capture, the telemetry): what the
        # workers here recorded becomes spans before the exit hook delivers.
        before_exit(close_at_exit)
        providers = live_providers()
        in_process = providers is not None
        if providers is None:
            providers = process_providers(settings, {"dask.worker.id": address, "dask.worker.name": name})
            _trace_nested_computes(providers, settings, nested_capture=nested_capture, ranges=ranges)
            _deliver_on_sigterm()
            if settings.clock != "local" and providers.owned is not None:
                for processor in providers.owned.span_processors:  # users' spans inside tasks: the caller's timeline
                    processor.placement = placed
        ensure_exit_hook()
        add_aggregated_source(_tasks_aggregated)
        telemetry = _ProcessTelemetry.by_worker[worker] = WorkerTelemetry(worker, providers=providers,
                                                                          settings=settings, in_process=in_process)
        _observe_spill(providers.meter_provider)
        return telemetry


def _close_if_unclaimed(worker: Any, telemetry: WorkerTelemetry) -> None:
    import asyncio

    with _ProcessTelemetry.lock:
        if telemetry.claimed or _ProcessTelemetry.by_worker.get(worker) is not telemetry:
            return
        del _ProcessTelemetry.by_worker[worker]
        _unwrap_when_idle()
        _ProcessTelemetry.closing.add(telemetry)
    asyncio.get_running_loop().run_in_executor(None, telemetry.close, telemetry._settings.exit_timeout_s)


def _stop(worker: Any, *, export: bool = True) -> None:
    with _ProcessTelemetry.lock:
        telemetry = _ProcessTelemetry.by_worker.pop(worker, None)
        _unwrap_when_idle()
    if telemetry is not None:
        telemetry.close(telemetry._settings.exit_timeout_s, export=export)


class WorkerTelemetryPlugin(WorkerPlugin):
    """Registered on every worker; see the module docs. Never raises into the worker."""

    name = PLUGIN_NAME
    idempotent = True  # registering again (another client) keeps the one the scheduler holds
    #: Read from the class where a plugin pickled by an earlier otel_graph lacks them: untraced,
    #: no NVTX ranges.
    _nested_capture: Callable[..., Any] | None = None
    _nvtx = False

    def __init__(self, client_env: dict[str, str] | None = None, *,
                 nested_capture: Callable[..., Any] | None = None, nvtx: bool = False) -> None:
        """``nested_capture``: the client's capture class, which traces the computes this worker's
        tasks start; given, not imported here, as the client's module registers this plugin.
        A class pickles by name: a worker process imports it as it receives the plugin.
        ``nvtx``: the client's ``OTEL_GRAPH_NVTX`` (option or variable), which the worker's own
        variable can also turn on."""
        self._nvtx = nvtx
        self._sealed_env = seal_env(dict(client_env or {}))
        self._nested_capture = nested_capture
        self._telemetry: WorkerTelemetry | None = None
        self._worker: Any = None

    def __repr__(self) -> str:  # the client's environment may hold exporter credentials
        return "WorkerTelemetryPlugin()"

    def setup(self, worker: Any) -> None:
        self._worker = worker
        _ProcessTelemetry.plugins.add(self)
        try:  # first: the scheduler sends task contexts once this worker says it reads them
            listen_on_worker(worker)
            say_listening(worker)
        except Exception:
            logger.debug("otel_graph: cannot read task contexts on this worker", exc_info=True)
        try:
            self._telemetry = _start(worker, unseal_env(self._sealed_env), nested_capture=self._nested_capture,
                                     nvtx=self._nvtx)
        except Exception as exc:
            # A bad configuration here must not take the worker down; say so once, without values.
            logger.warning("otel_graph: telemetry is off on worker %s: %s", getattr(worker, "address", "?"),
                           type(exc).__name__ if not isinstance(exc, ValueError) else exc)

    async def teardown(self, worker: Any) -> None:
        import asyncio

        self._telemetry = None
        _ProcessTelemetry.plugins.discard(self)
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
        if start not in _RAN or finish in _RAN:  # executing -> long-running (seceded): still running
            return
        if finish not in _DONE:  # cancelled or released while it ran: its span, if any, is never made
            take_span_id(key)
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
        from otel_graph.telemetry.process_state import live_providers

        if self._worker is None or live_providers() is None:
            return None
        try:
            self._telemetry = _start(self._worker, unseal_env(self._sealed_env), nested_capture=self._nested_capture,
                                     nvtx=self._nvtx)
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


def revive_in_process() -> None:
    """On ``instrument_scheduler()``: workers living in this process whose telemetry an
    ``uninstrument()`` ended start anew now, before their next task runs (its times and its
    NVTX range are read as any task's), not when it ends."""
    for plugin in list(_ProcessTelemetry.plugins):
        telemetry = plugin._telemetry
        if telemetry is None or telemetry._closing:
            plugin._revive()


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
