"""On the client: one trace per ``compute``/``persist``/``get``, and the plugins on the cluster.

:class:`ClusterCapture` wraps ``Client.get`` (what ``dask.compute`` and
``collection.compute()`` use with a distributed client), ``Client.compute``,
``Client.persist``, ``Client.submit`` and ``Client.map`` on the class, so clients
created before and after instrumenting are covered alike. Each call is one trace (a
``map`` of 1,000 calls is one trace of 1,000 tasks); ``gather`` runs no tasks and
opens none. A wrapped call:

1. opens the ``dask.compute`` span (``dask.scheduler=distributed``), a child of the
   caller's current span, or of the running task's compute when called from inside a
   task on a worker;
2. submits the graph inside ``dask.annotate(otel_graph=...)``, which carries the span
   context and each worker's share of the span budget to every task
   (:mod:`.propagation`);
3. ends the span when the results are in: when ``get`` returns, or when the last
   future of the other calls finishes (or errs, or is cancelled).

The first traced call on a client (or ``Client.start``, or
``instrument_scheduler(client=...)``) registers :mod:`.scheduler` and :mod:`.worker`
plugins on its cluster and subscribes to the scheduler's ``otel-graph`` topic, whose
events set ``dask.graph.tasks`` and add ``dask.worker.lost`` events to open computes.

Asynchronous clients are traced alike: ``await client.get(...)`` ends its span when
awaited, and ``await Client(asynchronous=True)`` returns once the plugins are on.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging
import os
import threading
import weakref
from concurrent.futures import CancelledError
from typing import Any

import dask
from opentelemetry import context as otel_context
from opentelemetry import trace

from otel_graph.cluster import adapter
from otel_graph.cluster.propagation import ANNOTATION, annotation, parent_span
from otel_graph.cluster.scheduler import TOPIC, SchedulerTelemetryPlugin
from otel_graph.cluster.worker import PLUGIN_NAME, WorkerTelemetryPlugin, flush_worker

logger = logging.getLogger("otel_graph")

#: Set while a traced call runs, so the calls it makes (``get`` -> ``gather``) are not traced again.
_INSIDE: contextvars.ContextVar[bool] = contextvars.ContextVar("otel_graph_inside", default=False)
_WRAPPED = ("get", "compute", "persist", "submit", "map")


def _futures(result: Any) -> list[Any]:
    from distributed import Future, futures_of

    if isinstance(result, Future):
        return [result]
    return list(futures_of(result))


def _client_env() -> dict[str, str]:
    return {name: value for name, value in os.environ.items() if name.startswith("OTEL_")}


class ClusterCapture:
    """Wraps the Client class; ``register=False`` (inside a worker) only listens, never registers."""

    def __init__(self, tracker: Any, settings: Any, *, register: bool = True) -> None:
        self._tracker = tracker
        self._settings = settings
        self._register = register
        self._originals: dict[str, Any] = {}
        self._attached: weakref.WeakSet = weakref.WeakSet()
        self._lock = threading.Lock()
        self.attach_errors = 0

    # -- install ---------------------------------------------------------------------------
    def install(self) -> None:
        from distributed import Client

        for name in (*_WRAPPED, "start"):
            original = Client.__dict__[name]
            self._originals[name] = original
            setattr(Client, name, self._wrap_start(original) if name == "start" else self._wrap(original, name))

    def uninstall(self, *, detach: bool = True) -> None:
        """Restore the Client class; with ``detach``, also take the plugins off live clusters."""
        from distributed import Client

        for name, original in self._originals.items():
            setattr(Client, name, original)
        self._originals.clear()
        if not detach:
            return
        for client in list(self._attached):
            self._attached.discard(client)
            if getattr(client, "status", "") != "running":
                continue
            try:
                client.unsubscribe_topic(TOPIC)
                if self._register and getattr(client, "asynchronous", False):
                    import asyncio

                    asyncio.ensure_future(client.unregister_worker_plugin(PLUGIN_NAME))
                    asyncio.ensure_future(client.unregister_scheduler_plugin(PLUGIN_NAME))
                elif self._register:
                    client.unregister_worker_plugin(PLUGIN_NAME)
                    client.unregister_scheduler_plugin(PLUGIN_NAME)
            except Exception:
                logger.debug("otel_graph: could not take the plugins off a cluster", exc_info=True)

    # -- cluster side ----------------------------------------------------------------------
    def attach(self, client: Any) -> None:
        """Register the plugins on ``client``'s cluster and listen to its scheduler, once per client.

        An asynchronous client cannot wait here: its registration is scheduled on its
        loop, so a compute submitted at once may start before the workers have the plugin.
        """
        if getattr(client, "status", "") != "running":
            return
        with self._lock:
            if client in self._attached:
                return
            self._attached.add(client)
        if getattr(client, "asynchronous", False):
            import asyncio

            try:
                asyncio.ensure_future(self.attach_async(client, claimed=True))
            except RuntimeError:  # no running loop in this thread: the next traced call retries
                self._attached.discard(client)
            return
        if self._register:
            for plugin, where in self._plugins():
                self._registered(where, lambda plugin=plugin: client.register_plugin(plugin, name=PLUGIN_NAME),
                                 client)
        self._subscribe(client)

    async def attach_async(self, client: Any, *, claimed: bool = False) -> None:
        if not claimed:
            with self._lock:
                if client in self._attached:
                    return
                self._attached.add(client)
        if self._register:
            for plugin, where in self._plugins():
                try:
                    await client.register_plugin(plugin, name=PLUGIN_NAME)
                except Exception as exc:
                    self._attach_failed(where, client, exc)
        self._subscribe(client)

    def _plugins(self) -> list[tuple[Any, str]]:
        return [(SchedulerTelemetryPlugin(_client_env()), "scheduler"),
                (WorkerTelemetryPlugin(_client_env()), "workers")]

    def _registered(self, where: str, register: Any, client: Any) -> None:
        try:
            register()
        except Exception as exc:
            self._attach_failed(where, client, exc)

    def _attach_failed(self, where: str, client: Any, exc: BaseException) -> None:
        self.attach_errors += 1
        # The type only: a message could echo the plugin's configuration.
        logger.warning("otel_graph: no telemetry plugin on the %s of %s (is otel_graph installed there?): %s",
                       where, getattr(client, "scheduler", "?"), type(exc).__name__)

    def _subscribe(self, client: Any) -> None:
        try:
            client.subscribe_topic(TOPIC, self._on_event)
        except Exception:
            self.attach_errors += 1
            logger.debug("otel_graph: could not subscribe to the scheduler's events", exc_info=True)

    def flush(self, timeout_s: float) -> bool:
        """Ask every attached cluster's workers to export what they have; True if all did."""
        ok = True
        for client in list(self._attached):
            # An asynchronous client's workers cannot be waited on from here; they export
            # every second and at teardown regardless.
            if getattr(client, "status", "") != "running" or getattr(client, "asynchronous", False):
                continue
            try:
                results = client.run(flush_worker, timeout_s=timeout_s)
            except Exception:
                logger.debug("otel_graph: worker flush failed", exc_info=True)
                ok = False
                continue
            ok = ok and all(results.values())
        return ok

    def _on_event(self, event: Any) -> None:
        try:
            _, message = event
            if message.get("op") == "graph":
                record = self._tracker.find_traceparent(message.get("traceparent"))
                if record is not None:
                    record.graph_tasks = (record.graph_tasks or 0) + int(message.get("tasks", 0))
            elif message.get("op") == "worker-lost":
                for record in self._tracker.running():
                    if record.scheduler == "distributed":
                        record.span.add_event("dask.worker.lost", {"dask.worker.id": message.get("worker", ""),
                                                                   "dask.worker.removal": message.get("stimulus_id", "")})
        except Exception:
            logger.debug("otel_graph: bad scheduler event", exc_info=True)

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

    def _wrap(self, original: Any, kind: str) -> Any:
        capture = self

        @functools.wraps(original)
        def traced(client: Any, *args: Any, **kwargs: Any) -> Any:
            if _INSIDE.get():
                return original(client, *args, **kwargs)
            return capture._traced(original, kind, client, args, kwargs)

        return traced

    def _traced(self, original: Any, kind: str, client: Any, args: tuple, kwargs: dict) -> Any:
        record = None
        try:
            self.attach(client)
            record = self._begin()
        except Exception:
            self._tracker.failed_to_begin()
            logger.debug("otel_graph: could not open a distributed compute span", exc_info=True)
        if record is None:
            return original(client, *args, **kwargs)
        budget = self._settings.max_task_spans
        if budget is not None:
            budget = -(-budget // adapter.client_worker_count(client))
        note = annotation(record.span.get_span_context(), budget=budget)
        token = _INSIDE.set(True)
        try:
            with dask.annotate(**{ANNOTATION: note}):
                result = original(client, *args, **kwargs)
        except BaseException as exc:
            self._tracker.end(record, exc)
            raise
        finally:
            _INSIDE.reset(token)
        if kind == "get" and kwargs.get("sync", True) and inspect.isawaitable(result):
            return self._end_when_awaited(record, result)  # an asynchronous client's get
        if (kind == "get" and kwargs.get("sync", True)) or (kind == "compute" and kwargs.get("sync")):
            self._tracker.end(record, None)
        else:
            self._end_when_done(record, result)
        return result

    async def _end_when_awaited(self, record: Any, pending: Any) -> Any:
        try:
            result = await pending
        except BaseException as exc:
            self._tracker.end(record, exc)
            raise
        self._tracker.end(record, None)
        return result

    def _begin(self) -> Any:
        parent = None
        if trace.get_current_span() is trace.INVALID_SPAN:
            # Called from inside a task on a worker: nest under that task's compute.
            inside = parent_span(adapter.current_task_annotation(annotation_name=ANNOTATION))
            if inside is not None:
                parent = trace.set_span_in_context(inside)
        if parent is None:
            return self._tracker.begin("distributed")
        token = otel_context.attach(parent)
        try:
            return self._tracker.begin("distributed")
        finally:
            otel_context.detach(token)

    def _end_when_done(self, record: Any, result: Any) -> None:
        futures = _futures(result)
        if not futures:
            self._tracker.end(record, None)
            return
        left = [len(futures)]
        lock = threading.Lock()
        first_error: list[BaseException] = []

        def done(future: Any) -> None:
            try:
                status = future.status
                if status == "cancelled":
                    record.span.add_event("dask.future.cancelled", {"dask.task.key": str(future.key)})
                    error: BaseException | None = CancelledError(f"future {future.key} was cancelled")
                elif status == "error":
                    error = adapter.future_error(future) or RuntimeError(f"future {future.key} erred")
                else:
                    error = None
            except BaseException as exc:  # noqa: BLE001 - a failure to read it is still a failure
                error = exc
            with lock:
                if error is not None and not first_error:
                    first_error.append(error)
                left[0] -= 1
                last = left[0] == 0
            if last:
                self._tracker.end(record, first_error[0] if first_error else None)

        for future in futures:
            future.add_done_callback(done)
