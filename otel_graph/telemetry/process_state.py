"""The telemetry one process holds, below both the handle and the dask.distributed parts.

* :class:`ProcessState`: the live handle (at most one, from ``instrument_scheduler()``),
  the SDK built from the environment (once per process: OpenTelemetry cannot unset a
  global provider), and the instruments made on each meter provider;
* :func:`providers_for`: the providers telemetry goes through, the caller's, else the
  application's global SDK ones, else ours; the handle and a cluster worker or scheduler
  without one choose alike;
* the exit hook (:func:`ensure_exit_hook`, :func:`deliver_at_exit`): parts that hold
  records close first (:func:`before_exit`), then the live handle drains and delivers,
  or a cluster process's own SDK does, and what was not delivered is said once.

The handle (:mod:`otel_graph.instrumentation`) and the cluster code import this module;
it imports neither.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_graph._version import __version__
from otel_graph.config import Settings, exit_timeout
from otel_graph.export.sdk import OwnedSdk, build_sdk
from otel_graph.readings.guard import Switch
from otel_graph.telemetry.metrics import TaskMetrics, observe_delivery, observe_memory
from otel_graph.telemetry.spans import ApiEmitter, DirectEmitter

logger = logging.getLogger("otel_graph")

SCOPE = InstrumentationScope("otel_graph", __version__)


class ProcessState:
    """Per-process state: the live handle and the SDK we built, guarded by one lock."""

    lock = threading.RLock()
    #: The handle instrument_scheduler() returned (otel_graph.instrumentation's), if live.
    live: Any = None
    owned: OwnedSdk | None = None
    exit_hook = False
    #: The process that registered the exit hook: a child forked from it inherits the hook,
    #: and must leave the parent's data to the parent (:mod:`otel_graph.export.forks`).
    exit_pid = 0
    meters: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
    #: Counts of tasks folded into aggregate spans by parts with no handle (cluster workers).
    aggregated_sources: list = []
    #: Called first by the exit hook (:func:`before_exit`).
    closers: list[Callable[[], None]] = []


def _is_sdk_tracer_provider(provider: Any) -> bool:
    from opentelemetry.sdk.trace import TracerProvider

    return isinstance(provider, TracerProvider)


def _is_sdk_meter_provider(provider: Any) -> bool:
    from opentelemetry.sdk.metrics import MeterProvider

    return isinstance(provider, MeterProvider)


def _owned_sdk(settings: Settings, *, traces: bool, metrics_: bool,
               resource_attributes: dict[str, Any] | None = None) -> OwnedSdk:
    owned = ProcessState.owned
    if owned is None:
        owned = ProcessState.owned = build_sdk(settings, traces=traces, metrics=metrics_, scope=SCOPE,
                                           resource_attributes=resource_attributes)
        _set_globals(owned)
    elif traces and owned.tracer_provider is None or metrics_ and owned.meter_provider is None:
        # Built earlier for one signal (the caller passed a provider for the other) and now
        # wanted for both: without the missing one, its telemetry went to the API's no-op.
        more = build_sdk(settings, traces=traces and owned.tracer_provider is None,
                         metrics=metrics_ and owned.meter_provider is None, scope=SCOPE,
                         resource_attributes=resource_attributes)
        owned.adopt(more)
        _set_globals(more)
    return owned


def _set_globals(owned: OwnedSdk) -> None:
    if owned.tracer_provider is not None:
        trace.set_tracer_provider(owned.tracer_provider)
    if owned.meter_provider is not None:
        metrics.set_meter_provider(owned.meter_provider)


class _MeterInstruments:
    """Instruments made once per meter provider: a meter keeps the first callbacks under a name.

    The observable callbacks read through ``ProcessState.live``, so they follow whichever
    handle is live on this provider and report nothing while none is.
    """

    def __init__(self, provider: Any, meter: Any, histograms: Any) -> None:
        self.task_metrics = TaskMetrics(meter, histograms=histograms)
        self.readings = Switch()
        self.readings.stop()
        self._meter = meter
        self._resources = False

        provider_ref = weakref.ref(provider)  # a strong one would keep the WeakKeyDictionary key alive

        def live() -> Any:
            handle = ProcessState.live
            return handle if handle is not None and handle._meter_provider is provider_ref() else None

        def delivery() -> dict[str, int]:
            handle = live()
            if handle is not None:
                return handle.stats()
            owned = ProcessState.owned
            # A worker or scheduler process: nothing instrumented here, but our SDK exports.
            if owned is not None and owned.meter_provider is provider_ref():
                current = owned.stats()
                current["tasks_aggregated"] = sum(source() for source in ProcessState.aggregated_sources)
                return current
            return {}

        observe_memory(meter, lambda: live()._held() if live() else [])
        observe_delivery(meter, delivery)

    def start_readings(self, *, gpu: bool) -> None:
        if not self._resources:
            from otel_graph.readings.resources import observe_resources

            self._resources = True
            observe_resources(self._meter, gpu=gpu, switch=self.readings)
        self.readings.on = True


def _instruments_for(provider: Any, meter: Any, histograms: Any, settings: Settings) -> _MeterInstruments:
    instruments = ProcessState.meters.get(provider)
    if instruments is None:
        instruments = ProcessState.meters[provider] = _MeterInstruments(provider, meter, histograms)
    if settings.resources:
        instruments.start_readings(gpu=settings.gpu)
    return instruments


@dataclass
class Providers:
    """The providers telemetry goes through, and what otel_graph made on them."""

    tracer_provider: Any
    meter_provider: Any
    owned: OwnedSdk | None
    tracer: Any
    emitter: Any
    instruments: _MeterInstruments


def _choose(current: Any, is_sdk: Any, attribute: str, settings: Settings, *, own_metrics: bool,
            resource_attributes: dict[str, Any] | None) -> tuple[Any, OwnedSdk | None]:
    """The global provider if the application set an SDK one; else ours, built once per process."""
    owned = ProcessState.owned
    if owned is not None and current is getattr(owned, attribute):
        return current, owned
    if is_sdk(current):
        return current, None
    owned = _owned_sdk(settings, traces=attribute == "tracer_provider", metrics_=own_metrics,
                       resource_attributes=resource_attributes)
    return getattr(owned, attribute) or current, owned


def providers_for(settings: Settings, *, tracer_provider: Any = None, meter_provider: Any = None,
                  resource_attributes: dict[str, Any] | None = None) -> Providers:
    """Pick (or build) the providers and make otel_graph's instruments on them.

    Shared by the handle (:class:`otel_graph.instrumentation.Instrumentation`) and the
    dask.distributed scheduler and worker processes without one, which make the same choice:
    the caller's providers, else the application's global SDK ones, else ours built from the
    environment.
    """
    owned: OwnedSdk | None = None
    if tracer_provider is None:
        tracer_provider, owned = _choose(trace.get_tracer_provider(), _is_sdk_tracer_provider,
                                         "tracer_provider", settings, own_metrics=meter_provider is None,
                                         resource_attributes=resource_attributes)
    if meter_provider is None:
        meter_provider, owned_meter = _choose(metrics.get_meter_provider(), _is_sdk_meter_provider,
                                              "meter_provider", settings, own_metrics=True,
                                              resource_attributes=resource_attributes)
        owned = owned or owned_meter
    tracer = tracer_provider.get_tracer(SCOPE.name, SCOPE.version)
    meter = meter_provider.get_meter(SCOPE.name, SCOPE.version)
    emitter: Any = ApiEmitter(tracer)
    if owned is not None and tracer_provider is owned.tracer_provider:
        from otel_graph.export.sdk_internals import span_processor

        if span_processor(tracer_provider) is not None:
            emitter = DirectEmitter(tracer_provider, SCOPE)
    histograms = owned.histograms if owned is not None and meter_provider is owned.meter_provider else None
    instruments = _instruments_for(meter_provider, meter, histograms, settings)
    return Providers(tracer_provider, meter_provider, owned, tracer, emitter, instruments)


def report_undelivered(owned: OwnedSdk, timeout_s: float, unbuilt: int = 0) -> None:
    """Deliver what ``owned`` holds within ``timeout_s``; warn once of what was not delivered,
    and of ``unbuilt`` task records never made spans."""
    owned.deliver_at_exit(timeout_s=timeout_s)
    stats = owned.stats()
    spans, points = stats["spans_undelivered"], stats["points_undelivered"]
    if spans or points or unbuilt:
        names = owned.undelivering()
        by = f" by {'exporters' if len(names) > 1 else 'exporter'} {', '.join(names)}" if names else ""
        unbuilt_text = f" ({unbuilt} task records were never turned into spans)" if unbuilt else ""
        logger.warning("otel_graph: %d spans and %d metric points were not delivered%s%s",
                       spans, points, by, unbuilt_text)


def live_providers() -> Providers | None:
    """The providers of the live instrumentation in this process, if any."""
    handle = ProcessState.live
    return getattr(handle, "providers", None)


_EXIT_HOOK_LOCK = threading.Lock()


def add_aggregated_source(source: Any) -> None:
    """Count tasks that a part without a handle (a cluster worker) folds into aggregates."""
    with _EXIT_HOOK_LOCK:
        if source not in ProcessState.aggregated_sources:
            ProcessState.aggregated_sources.append(source)


def ensure_exit_hook() -> None:
    """Register :func:`deliver_at_exit` with ``atexit``, once per process."""
    with _EXIT_HOOK_LOCK:  # not ProcessState.lock: an event loop thread may call this while it is held
        if not ProcessState.exit_hook:
            ProcessState.exit_hook = True
            ProcessState.exit_pid = os.getpid()
            atexit.register(deliver_at_exit)


#: Taken by the first exit, never released.
_EXITING = threading.Lock()


def before_exit(close: Callable[[], None]) -> None:
    """Have :func:`deliver_at_exit` call ``close`` first (once however often given): a part
    whose records become spans only when it closes (a cluster worker's telemetry)."""
    with _EXIT_HOOK_LOCK:
        if close not in ProcessState.closers:
            ProcessState.closers.append(close)


def deliver_at_exit() -> None:
    """The exit hook: what is recorded becomes spans, and this process's SDK delivers it."""
    # Once: a worker's SIGTERM handler runs this too, maybe while the atexit hook already
    # does. Test and set in one step: a signal can land between a separate test and set.
    if os.getpid() != ProcessState.exit_pid or not _EXITING.acquire(blocking=False):
        return
    for close in list(ProcessState.closers):
        close()
    handle = ProcessState.live
    if handle is not None:
        handle._at_exit()
    elif ProcessState.owned is not None:  # a cluster process's own SDK
        report_undelivered(ProcessState.owned, ProcessState.owned.exit_budget(exit_timeout()))
