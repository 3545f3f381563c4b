"""What a worker process shares among its workers' telemetry: delivery accounts, SIGTERM, its SDK.

A process runs one worker (``dask worker``) or several (an in-process cluster), each
with its :class:`.task_spans.WorkerTelemetry`, kept in :class:`_ProcessTelemetry`.

* **Delivery accounts** (:mod:`.deliveries`, for the scheduler's :mod:`.ledger`): the
  process's span processor and metric exporter call back as the collector takes each
  batch (:func:`_count_deliveries`), and each worker that keeps accounts reports its
  share to the scheduler at once.
* **SIGTERM** (:func:`_deliver_on_sigterm`): a worker process of its own delivers what
  it recorded before it ends, as it would have ended.
* **Its SDK** (:func:`process_providers`): for a scheduler or worker process otel_graph
  did not instrument, with a Prometheus port of its own per process.
* **Spilling**, counted in full from each worker's own totals, as
  ``dask.worker.spill.io`` (By), ``.operations`` and ``.time`` (s), by
  ``dask.spill.direction`` (write, read) (:func:`_observe_spill`), and each worker's
  clock against its scheduler's (``dask.clock.offset``, :mod:`.clock`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from opentelemetry.metrics import Observation

from otel_graph.cluster import adapter
from otel_graph.cluster.clock import known_worker_clock, observe_offsets
from otel_graph.cluster.deliveries import Deliveries, MetricDeliveries
from otel_graph.config import exit_timeout
from otel_graph.conventions import observe

logger = logging.getLogger("otel_graph")


class _ProcessTelemetry:
    """The WorkerTelemetry of each worker in this process (several, for an in-process cluster)."""

    lock = threading.Lock()
    by_worker: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
    #: The worker plugins set up in this process (revived by :func:`.worker.revive_in_process`).
    plugins: weakref.WeakSet = weakref.WeakSet()
    nested: Any = None  # (tracker, capture) tracing computes that tasks here start
    #: Puts distributed's task runners back (wrapped while this process has workers with
    #: telemetry); ``runners_ranged``: they run tasks in NVTX ranges.
    unwrap_runners: Callable[[], None] | None = None
    runners_ranged = False
    #: What the process's span exporter delivered, per worker, until reported.
    deliveries = Deliveries()
    #: The task counts the process's metric exporter delivered (one worker's, with accounts);
    #: counted only where otel_graph's exporter pushes them (not to a Prometheus scrape).
    metric_deliveries = MetricDeliveries()
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
        # Before the worker records any task: a reader set turns off encoding spans as they
        # end (pipeline.ReliableSpanProcessor.takes_encoded), whose spans it could not read.
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
            from otel_graph.telemetry.process_state import deliver_at_exit

            delivery = threading.Thread(target=deliver_at_exit, name="otel-graph-sigterm", daemon=True)
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
    from dataclasses import replace

    from otel_graph.export.sdk import PortInUse
    from otel_graph.telemetry.process_state import providers_for

    try:
        return providers_for(settings, resource_attributes=resource_attributes)
    except PortInUse:
        pass
    for offset in range(1, PROMETHEUS_PORT_SPAN + 1):
        moved = replace(settings, prometheus_port=settings.prometheus_port + offset)
        try:
            providers = providers_for(moved, resource_attributes=resource_attributes)
        except PortInUse:
            continue
        logger.warning("otel_graph: port %d was taken; this process serves Prometheus metrics on %s:%d",
                       settings.prometheus_port, moved.prometheus_host, moved.prometheus_port)
        return providers
    others = tuple(name for name in settings.metrics_exporters if name != "prometheus")
    logger.warning("otel_graph: no free Prometheus port in %d..%d; this process serves no Prometheus metrics%s",
                   settings.prometheus_port, settings.prometheus_port + PROMETHEUS_PORT_SPAN,
                   f" (its metrics still go to {', '.join(others)})" if others else "")
    return providers_for(replace(settings, metrics_exporters=others), resource_attributes=resource_attributes)


def _tasks_aggregated() -> int:
    return sum(t.tasks_aggregated for t in list(_ProcessTelemetry.by_worker.values()))


def _observe_spill(meter_provider: Any) -> None:
    """Spill counters from the worker's own totals, read at collection: complete, with bytes.

    Per-task ``disk-read``/``disk-write`` spans only exist where distributed timed one
    above 5 ms; these counters count every spill.
    """
    from otel_graph.telemetry.process_state import SCOPE

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

    observe_offsets(meter_provider, _WORKER_CLOCKS)
    observe(meter, "dask.worker.spill.io", [reading("bytes")])
    observe(meter, "dask.worker.spill.operations", [reading("count")])
    observe(meter, "dask.worker.spill.time", [reading("seconds")])


_SPILL_OBSERVED: weakref.WeakSet = weakref.WeakSet()


class _WorkerClocks:
    """This process's workers' clocks against their schedulers' (for :func:`.clock.observe_offsets`)."""

    def offsets(self) -> list[tuple[str, float]]:
        points = []
        for worker in list(_ProcessTelemetry.by_worker.keys()):
            clock = known_worker_clock(worker)
            offset = clock.offset_s() if clock is not None else None
            if offset is not None:
                points.append((adapter.worker_scheduler(worker), offset))
        return points


_WORKER_CLOCKS = _WorkerClocks()


def adopt_client_env(client_env: dict[str, str]) -> None:
    """Take the client's ``OTEL_*`` variables when this process has none of its own."""
    if client_env and not any(name.startswith("OTEL_") for name in os.environ):
        os.environ.update(client_env)
