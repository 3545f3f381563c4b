"""The live instrumentation: what ``instrument_scheduler()`` sets up and its handle tears down.

One :class:`Instrumentation` is live per process at most. It owns:

* the providers in use, chosen by :func:`otel_graph.telemetry.process_state.providers_for`: the
  caller's, the global SDK ones the application set, or, when there are none, ones
  built from the environment by :mod:`otel_graph.export.sdk` (then also set globally, so that
  spans the user's own code makes inside tasks go to the same place);
* the :class:`~otel_graph.telemetry.tracker.Tracker` that turns task records into telemetry,
  with the trace a launcher handed the process in ``TRACEPARENT``, read once here
  (:mod:`otel_graph.telemetry.env_context`);
* the Dask wrappers of :mod:`otel_graph.capture.local`, and dask.distributed's capture
  (:mod:`otel_graph.cluster.client`) where it is installed;
* the resource readings of :mod:`otel_graph.readings.resources`.

SDK providers built for it live for the rest of the process (OpenTelemetry cannot
unset a global provider), and are reused if instrumentation is switched on again. At
interpreter exit (:func:`otel_graph.telemetry.process_state.deliver_at_exit`), the live
instrumentation drains, delivers within ``OTEL_GRAPH_EXIT_TIMEOUT`` of no progress, and
warns once about anything undelivered.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
import time
from collections import Counter
from typing import Any

from otel_graph.capture.local import LocalCapture
from otel_graph.config import ConfigurationError, Settings, load_settings
from otel_graph.export.sdk import exit_window
from otel_graph.telemetry.env_context import launcher_parent
from otel_graph.telemetry.nvtx_ranges import process_ranges
from otel_graph.telemetry.process_state import ProcessState, ensure_exit_hook, providers_for, report_undelivered
from otel_graph.telemetry.tracker import Tracker

logger = logging.getLogger("otel_graph")

_UNINSTRUMENT_DRAIN_S = 60.0


class Instrumentation:
    """The handle ``instrument_scheduler()`` returns; also a context manager."""

    def __init__(self, settings: Settings, *, tracer_provider: Any = None, meter_provider: Any = None,
                 client: Any = None) -> None:
        self.settings = settings
        # First: a missing binding is a configuration error, raised before anything is set up.
        ranges = process_ranges() if settings.nvtx else None
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
                                early_drain_tasks=settings.early_drain_tasks, ranges=ranges,
                                launcher=launcher_parent())
        self._capture = LocalCapture(self._tracker, ranges=ranges)
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
                self._cluster.observe_clocks(self._meter_provider)
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
        # A failed compute's tasks still running are waited for, but never with the time the
        # export of everything else needs.
        drained = self._tracker.flush(timeout_s, stragglers_s=None if timeout_s is None else timeout_s / 2)
        if self._cluster is not None:
            # Workers flush side by side with us: each exports to the collector itself.
            drained = self._cluster.flush(max(0.1, deadline - time.monotonic())) and drained
        if self._owned is None:
            return drained
        return self._owned.flush(max(0.1, deadline - time.monotonic())) and drained

    def uninstrument(self) -> None:
        """Stop instrumenting, flush, and restore Dask exactly as it was."""
        with ProcessState.lock:
            if not self._live:
                return
            self._live = False
            self._capture.uninstall()
            if ProcessState.live is self:
                ProcessState.live = None
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
            report_undelivered(owned, exit_window(answers, left()), unbuilt)
        self._instruments.readings.stop()


class _Disabled:
    """What ``OTEL_SDK_DISABLED=true`` gets: the same handle API, and Dask left untouched."""

    def flush(self, timeout_s: float | None = None) -> bool:
        return True

    def uninstrument(self) -> None:
        with ProcessState.lock:
            if ProcessState.live is self:
                ProcessState.live = None

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


def instrument_scheduler(*, tracer_provider: Any = None, meter_provider: Any = None, client: Any = None,
                         **options: Any) -> Instrumentation:
    """Trace and meter every task of Dask's schedulers from now on; see :mod:`otel_graph`."""
    with ProcessState.lock:
        handle: Any = ProcessState.live
        if handle is None:
            settings = load_settings(**options)
            if settings.sdk_disabled and tracer_provider is None and meter_provider is None:
                handle = _Disabled()
            else:
                handle = Instrumentation(settings, tracer_provider=tracer_provider,
                                         meter_provider=meter_provider, client=client)
            ProcessState.live = handle
        elif options or tracer_provider is not None or meter_provider is not None:
            _ignored(handle, load_settings(**options), tracer_provider, meter_provider)
        ensure_exit_hook()
    # Outside the lock: registering plugins waits on the cluster, and an in-process
    # scheduler's plugin looks up the live handle from the event loop's thread.
    cluster = getattr(handle, "_cluster", None)
    if cluster is not None:
        from otel_graph.cluster.worker import revive_in_process

        revive_in_process()
        if client is not None:
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


