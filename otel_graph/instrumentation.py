"""The live instrumentation: what ``instrument_scheduler()`` sets up and its handle tears down.

One :class:`Instrumentation` is live per process at most. It owns:

* the providers in use: the caller's, the global SDK ones the application set, or,
  when there are none, ones built from the environment by :mod:`otel_graph.sdk`
  (then also set globally, so that spans the user's own code makes inside tasks go to
  the same place);
* the :class:`~otel_graph.tracker.Tracker` that turns task records into telemetry;
* the Dask wrappers of :mod:`otel_graph.local`;
* the resource readings of :mod:`otel_graph.resources`.

SDK providers built here live for the rest of the process (OpenTelemetry cannot
unset a global provider), and are reused if instrumentation is switched on again. At
interpreter exit, the live instrumentation drains, delivers within
``OTEL_GRAPH_EXIT_TIMEOUT`` of no progress, and warns once about anything undelivered.
"""

from __future__ import annotations

import atexit
import importlib.util
import logging
import os
import sys
import threading
import time
import weakref
from collections import Counter
from dataclasses import dataclass
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_graph._version import __version__
from otel_graph.config import ConfigurationError, Settings, exit_timeout, load_settings
from otel_graph.local import LocalCapture
from otel_graph.metrics import TaskMetrics, observe_delivery, observe_memory
from otel_graph.resources import Switch
from otel_graph.sdk import OwnedSdk, build_sdk, exit_window
from otel_graph.spans import ApiEmitter, DirectEmitter
from otel_graph.tracker import Tracker

logger = logging.getLogger("otel_graph")

SCOPE = InstrumentationScope("otel_graph", __version__)
_UNINSTRUMENT_DRAIN_S = 60.0


class _Process:
    """Per-process state: the live handle and the SDK we built, guarded by one lock."""

    lock = threading.RLock()
    live: Instrumentation | None = None
    owned: OwnedSdk | None = None
    exit_hook = False
    #: The process that registered the exit hook: a child forked from it inherits the hook,
    #: and must leave the parent's data to the parent (:mod:`otel_graph.forks`).
    exit_pid = 0
    meters: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
    #: Counts of tasks folded into aggregate spans by parts with no handle (cluster workers).
    aggregated_sources: list = []


def _is_sdk_tracer_provider(provider: Any) -> bool:
    from opentelemetry.sdk.trace import TracerProvider

    return isinstance(provider, TracerProvider)


def _is_sdk_meter_provider(provider: Any) -> bool:
    from opentelemetry.sdk.metrics import MeterProvider

    return isinstance(provider, MeterProvider)


def _owned_sdk(settings: Settings, *, traces: bool, metrics_: bool,
               resource_attributes: dict[str, Any] | None = None) -> OwnedSdk:
    owned = _Process.owned
    if owned is None:
        owned = _Process.owned = build_sdk(settings, traces=traces, metrics=metrics_, scope=SCOPE,
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

    The observable callbacks read through ``_Process.live``, so they follow whichever
    handle is live on this provider and report nothing while none is.
    """

    def __init__(self, provider: Any, meter: Any, histograms: Any) -> None:
        self.task_metrics = TaskMetrics(meter, histograms=histograms)
        self.readings = Switch()
        self.readings.stop()
        self._meter = meter
        self._resources = False

        provider_ref = weakref.ref(provider)  # a strong one would keep the WeakKeyDictionary key alive

        def live() -> Instrumentation | None:
            handle = _Process.live
            return handle if handle is not None and handle._meter_provider is provider_ref() else None

        def delivery() -> dict[str, int]:
            handle = live()
            if handle is not None:
                return handle.stats()
            owned = _Process.owned
            # A worker or scheduler process: nothing instrumented here, but our SDK exports.
            if owned is not None and owned.meter_provider is provider_ref():
                current = owned.stats()
                current["tasks_aggregated"] = sum(source() for source in _Process.aggregated_sources)
                return current
            return {}

        observe_memory(meter, lambda: live()._held() if live() else [])
        observe_delivery(meter, delivery)

    def start_readings(self, *, gpu: bool) -> None:
        if not self._resources:
            from otel_graph.resources import observe_resources

            self._resources = True
            observe_resources(self._meter, gpu=gpu, switch=self.readings)
        self.readings.on = True


def _instruments_for(provider: Any, meter: Any, histograms: Any, settings: Settings) -> _MeterInstruments:
    instruments = _Process.meters.get(provider)
    if instruments is None:
        instruments = _Process.meters[provider] = _MeterInstruments(provider, meter, histograms)
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
    owned = _Process.owned
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

    Shared by :class:`Instrumentation` and the distributed worker plugin, which run
    the same choice: the caller's providers, else the application's global SDK ones,
    else ours built from the environment.
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
        from otel_graph.sdk_internals import span_processor

        if span_processor(tracer_provider) is not None:
            emitter = DirectEmitter(tracer_provider, SCOPE)
    histograms = owned.histograms if owned is not None and meter_provider is owned.meter_provider else None
    instruments = _instruments_for(meter_provider, meter, histograms, settings)
    return Providers(tracer_provider, meter_provider, owned, tracer, emitter, instruments)


class Instrumentation:
    """The handle ``instrument_scheduler()`` returns; also a context manager."""

    def __init__(self, settings: Settings, *, tracer_provider: Any = None, meter_provider: Any = None,
                 client: Any = None) -> None:
        self.settings = settings
        chosen = self.providers = providers_for(settings, tracer_provider=tracer_provider,
                                                meter_provider=meter_provider)
        self._owned = chosen.owned
        self._meter_provider = chosen.meter_provider
        self._instruments = chosen.instruments
        self._tracker = Tracker(tracer=chosen.tracer, emitter=chosen.emitter,
                                metrics=self._instruments.task_metrics,
                                max_task_spans=settings.max_task_spans,
                                drain_interval_s=settings.drain_interval_s,
                                progress_interval_s=settings.progress_interval_s,
                                early_drain_tasks=settings.early_drain_tasks)
        self._capture = LocalCapture(self._tracker)
        # The provider's force_flush (OpenTelemetry's own way) makes the computes set aside too.
        self._flushed = [] if self._owned is None else list(self._owned.span_processors)
        for processor in self._flushed:
            processor.before_flush = self._tracker.make_aside
        self._cluster: Any = None
        try:
            self._cluster = _cluster_capture(self._tracker, settings, client=client)
            # Both or neither: a call that raises must leave Dask as it was, and nothing running.
            self._capture.install()
            if self._cluster is not None:
                self._cluster.install()
        except BaseException:
            self._capture.uninstall()
            if self._cluster is not None:
                self._cluster.uninstall(detach=False)
            self._instruments.readings.stop()
            self._tracker.stop(0, drain=False)
            self._unhook_flush()
            raise
        self._live = True

    # -- public ----------------------------------------------------------------------------
    def flush(self, timeout_s: float | None = None) -> bool:
        """Block until everything recorded so far is exported; True if it all went."""
        deadline = time.monotonic() + (30.0 if timeout_s is None else timeout_s)
        drained = self._tracker.flush(timeout_s)
        if self._cluster is not None:
            # Workers flush side by side with us: each exports to the collector itself.
            drained = self._cluster.flush(max(0.1, deadline - time.monotonic())) and drained
        if self._owned is None:
            return drained
        return self._owned.flush(max(0.1, deadline - time.monotonic())) and drained

    def uninstrument(self) -> None:
        """Stop instrumenting, flush, and restore Dask exactly as it was."""
        with _Process.lock:
            if not self._live:
                return
            self._live = False
            self._capture.uninstall()
            if _Process.live is self:
                _Process.live = None
            # Under the lock: a handle made on the same meter provider once it is released
            # turns the readings on again, and a stop after that would silence its readings.
            self._instruments.readings.stop()
        if self._cluster is not None:
            # Outside the lock: taking plugins off a cluster waits on it (teardowns flush).
            self._cluster.uninstall()
            from otel_graph.cluster.worker import close_in_process

            close_in_process()
        # Building spans is our own CPU work and always progresses: bounded generously.
        self._tracker.stop(_UNINSTRUMENT_DRAIN_S)
        self._unhook_flush()
        owned = self._owned
        if owned is not None and (owned.span_processor is None or owned.span_processor.healthy):
            owned.flush(self.settings.exit_timeout_s)

    def _unhook_flush(self) -> None:
        for processor in self._flushed:
            if processor.before_flush == self._tracker.make_aside:
                processor.before_flush = None

    def stats(self, *, workers: bool = False, timeout_s: float = 10.0) -> dict[str, int]:
        """Delivery counters: spans and points exported and undelivered, tasks aggregated,
        and, with dask.distributed, computes whose tasks could not be given their context.

        This process's; with ``workers=True``, plus those of the attached dask.distributed
        clusters' worker processes (each exports on its own), asked within ``timeout_s``,
        and ``worker_processes``, how many of them answered.
        """
        current = self._owned.stats() if self._owned is not None else {}
        current["tasks_aggregated"] = self._tracker.tasks_aggregated
        current["tasks_recovered"] = self._tracker.tasks_recovered
        current["span_errors"] = self._tracker.span_errors
        if self._cluster is not None:
            # Traced calls whose graph went to a scheduler that could not be told their
            # trace context: their computes have spans, their tasks none.
            current["computes_without_task_context"] = self._cluster.unannounced
        if workers:
            cluster, answered = self._cluster.worker_stats(timeout_s) if self._cluster is not None else ({}, 0)
            summed = Counter(current)
            summed.update(cluster)  # adds, and keeps zeros (Counter's + would drop them)
            current = dict(summed)
            current["worker_processes"] = answered
        return current

    def __enter__(self) -> Instrumentation:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.uninstrument()

    # -- private ---------------------------------------------------------------------------
    def _held(self) -> list[tuple[str, int, int]]:
        if not self._live:
            return []
        return [(r.scheduler, *r.held()) for r in self._tracker.running()]

    def _at_exit(self) -> None:
        timeout = self.settings.exit_timeout_s
        started = time.monotonic()

        def left() -> float:
            return max(0.1, timeout - (time.monotonic() - started))

        self._capture.uninstall()
        if self._cluster is not None:
            self._cluster.uninstall(detach=False)  # the cluster may be gone; workers flush themselves
        owned = self._owned
        # With the collector down or hung (it may be back: asked once, now, rather than
        # trusting the last export), building the last spans only delays the exit: they
        # are counted as not delivered instead; and one that cannot answer gets only a
        # moment more (exit_window).
        answers = True if owned is None else owned.answers_at_exit(timeout)
        unbuilt = self._tracker.stop(left(), drain=answers is True)
        if owned is not None:
            # Readings stay on until the final collection, so short scripts report them too.
            _report_undelivered(owned, exit_window(answers, left()), unbuilt)
        self._instruments.readings.stop()


def _report_undelivered(owned: OwnedSdk, timeout_s: float, unbuilt: int = 0) -> None:
    owned.deliver_at_exit(timeout_s=timeout_s)
    stats = owned.stats()
    spans, points = stats["spans_undelivered"], stats["points_undelivered"]
    if spans or points or unbuilt:
        names = owned.undelivering()
        by = f" by {'exporters' if len(names) > 1 else 'exporter'} {', '.join(names)}" if names else ""
        unbuilt_text = f" ({unbuilt} task records were never turned into spans)" if unbuilt else ""
        logger.warning("otel_graph: %d spans and %d metric points were not delivered%s%s",
                       spans, points, by, unbuilt_text)


class _Disabled:
    """What ``OTEL_SDK_DISABLED=true`` gets: the same handle API, and Dask left untouched."""

    def flush(self, timeout_s: float | None = None) -> bool:
        return True

    def uninstrument(self) -> None:
        with _Process.lock:
            if _Process.live is self:
                _Process.live = None

    def stats(self, *, workers: bool = False, timeout_s: float = 10.0) -> dict[str, int]:
        return {}

    def __enter__(self) -> _Disabled:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.uninstrument()

    def _at_exit(self) -> None:
        return None


def _cluster_capture(tracker: Tracker, settings: Settings, *, client: Any) -> Any:
    """dask.distributed's capture, or None where it is not installed (or does not import)."""
    if not _distributed_available():
        if client is not None:
            raise ConfigurationError("instrument_scheduler(client=...) needs dask.distributed installed")
        return None
    try:
        from otel_graph.cluster.client import ClusterCapture
    except ImportError as exc:  # installed but broken (a version that does not match dask's, say)
        if client is not None:
            raise
        logger.warning("otel_graph: dask.distributed does not import (%s); its clusters are not traced, "
                       "Dask's local schedulers are", exc)
        return None
    return ClusterCapture(tracker, settings)


def _distributed_available() -> bool:
    # Imported when installed (about 0.3 s, once): Clients made later must be caught too.
    return "distributed" in sys.modules or importlib.util.find_spec("distributed") is not None


def live_providers() -> Providers | None:
    """The providers of the live instrumentation in this process, if any."""
    handle = _Process.live
    return getattr(handle, "providers", None)


_EXIT_HOOK_LOCK = threading.Lock()


def add_aggregated_source(source: Any) -> None:
    """Count tasks that a part without a handle (a cluster worker) folds into aggregates."""
    with _EXIT_HOOK_LOCK:
        if source not in _Process.aggregated_sources:
            _Process.aggregated_sources.append(source)


def ensure_exit_hook() -> None:
    with _EXIT_HOOK_LOCK:  # not _Process.lock: an event loop thread may call this while it is held
        if not _Process.exit_hook:
            _Process.exit_hook = True
            _Process.exit_pid = os.getpid()
            atexit.register(_exit)


def instrument_scheduler(*, tracer_provider: Any = None, meter_provider: Any = None, client: Any = None,
                         **options: Any) -> Instrumentation:
    """Trace and meter every task of Dask's schedulers from now on; see :mod:`otel_graph`."""
    with _Process.lock:
        handle: Any = _Process.live
        if handle is None:
            settings = load_settings(**options)
            if settings.sdk_disabled and tracer_provider is None and meter_provider is None:
                handle = _Disabled()
            else:
                handle = Instrumentation(settings, tracer_provider=tracer_provider,
                                         meter_provider=meter_provider, client=client)
            _Process.live = handle
        elif options or tracer_provider is not None or meter_provider is not None:
            _ignored(handle, load_settings(**options), tracer_provider, meter_provider)
        ensure_exit_hook()
    # Outside the lock: registering plugins waits on the cluster, and an in-process
    # scheduler's plugin looks up the live handle from the event loop's thread.
    cluster = getattr(handle, "_cluster", None)
    if client is not None and cluster is not None:
        cluster.attach(client)
    return handle


def _ignored(handle: Any, settings: Settings, tracer_provider: Any, meter_provider: Any) -> None:
    """Say which of a later call's choices the live handle does not follow (validated all the same)."""
    providers = getattr(handle, "providers", None)
    differ = [f"the {name}" for name, given, live in
              (("tracer_provider", tracer_provider, getattr(providers, "tracer_provider", None)),
               ("meter_provider", meter_provider, getattr(providers, "meter_provider", None)))
              if given is not None and given is not live]
    live_settings = getattr(handle, "settings", None)
    if live_settings is not None and settings != live_settings:
        differ.append("its options")
    if differ:
        logger.warning("otel_graph: already instrumented; this call's %s are ignored (the live handle is "
                       "returned): call uninstrument() first to change them", " and ".join(differ))


#: Taken by the first exit, never released.
_EXITING = threading.Lock()


def _exit() -> None:
    # Once: a worker's SIGTERM handler runs this too, maybe while the atexit hook already
    # does. Test and set in one step: a signal can land between a separate test and set.
    if os.getpid() != _Process.exit_pid or not _EXITING.acquire(blocking=False):
        return
    worker = sys.modules.get("otel_graph.cluster.worker")
    if worker is not None:
        worker.close_at_exit()
    handle = _Process.live
    if handle is not None:
        handle._at_exit()
    elif _Process.owned is not None:  # a cluster process's own SDK
        _report_undelivered(_Process.owned, _Process.owned.exit_budget(exit_timeout()))
