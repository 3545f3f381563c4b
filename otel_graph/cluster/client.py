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

The adapter replaces these methods on the class and puts them back
(:func:`.adapter.patch_client`); what the replacements do is this module's.

A client is *attached* to its cluster once, at ``Client.start`` or its first traced call
(:mod:`.membership`): the plugins go on the cluster, and the client listens to it.

Asynchronous clients are traced alike: ``await client.compute(...)`` futures end their
span when they settle, and ``await Client(asynchronous=True)`` returns once attached.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging
import time
from concurrent.futures import CancelledError
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace

from otel_graph.cluster import adapter
from otel_graph.cluster.bounded import CLUSTER_TIMEOUT_S, bounded_all
from otel_graph.cluster.clock import worker_placement
from otel_graph.cluster.membership import ClusterMembership
from otel_graph.cluster.note import clock_of, make_note, parent_span
from otel_graph.cluster.propagation import compute_message, note_of
from otel_graph.cluster.spans import SpanCapture, drop_own_frame, span_attributes, stand_ins

logger = logging.getLogger("otel_graph")

#: Set while a traced call runs, so the calls it makes (``get`` -> ``gather``) are not traced again.
_INSIDE: contextvars.ContextVar[bool] = contextvars.ContextVar("otel_graph_inside", default=False)
#: The note (:mod:`.propagation`) of the traced call running in this context: it goes
#: ahead of the graph that call sends, and of no other.
_NOTE: contextvars.ContextVar[str | None] = contextvars.ContextVar("otel_graph_note", default=None)


def _futures(result: Any) -> list[Any]:
    from distributed import Future, futures_of

    if isinstance(result, Future):
        return [result]
    return list(futures_of(result))


class ClusterCapture(ClusterMembership):
    """Wraps the Client class; ``register=False`` (inside a worker) only listens, never registers."""

    def __init__(self, tracker: Any, settings: Any, *, register: bool = True) -> None:
        super().__init__(tracker, settings, register=register)
        self._originals: dict[str, Any] = {}
        #: Traced calls whose graph went without its context: the scheduler could not read it.
        self.unannounced = 0
        #: ``distributed.span`` blocks as spans (:mod:`.spans`).
        self._spans = SpanCapture(tracker.tracer, launcher=tracker.launcher)

    def _nested_capture(self) -> type[ClusterCapture]:
        # The workers trace the computes their tasks start as this client traces its own.
        return ClusterCapture

    # -- install ---------------------------------------------------------------------------
    def install(self) -> None:
        # A distributed without the send gets no contexts sent: computes are traced, their
        # tasks counted, without spans (stats() says how many).
        self._originals = adapter.patch_client(traced=self._wrap, start=self._wrap_start, send=self._wrap_send)
        self._spans.install()

    def uninstall(self, *, detach: bool = True) -> None:
        """Restore the Client class; with ``detach``, also leave the clusters (see the module docs)."""
        self._closed = True
        self._spans.uninstall()
        adapter.restore_client(self._originals)
        self._originals.clear()
        leaving = []
        for client in list(self._attached):
            self._attached.discard(client)
            if detach and getattr(client, "status", "") == "running":
                leave = self._leave(client)
                if leave is not None:
                    leaving.append(leave)
        if leaving:  # side by side: a cluster that does not answer costs the wait once
            bounded_all(leaving, CLUSTER_TIMEOUT_S, "leaving the cluster")

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
        (the send this wraps queues that next, and the loop runs them in order)."""
        try:
            stream = self._streams.get(client)
            if stream is None or adapter.scheduler_stream(client) is not stream:
                self.unannounced += 1
                self._reprobe(client)  # once per stream: it may read them on this one
                return
            message = compute_message(note, graph.get("keys") or ())

            def send() -> None:
                # Only on the connection the scheduler said it reads them on: a new
                # scheduler without our plugin would close the stream on an unknown op.
                if adapter.scheduler_stream(client) is stream:
                    try:
                        message["sent"] = time.time()
                        stream.send(message)
                    except Exception:  # the stream broke: so does the graph's, which distributed says
                        self.unannounced += 1

            client.loop.add_callback(send)
        except Exception:
            self.unannounced += 1
            logger.debug("otel_graph: could not send a compute's context", exc_info=True)

    def _wrap(self, original: Any, kind: str) -> Any:
        # Run in distributed's module (adapter.patch_client), so it reads no global of ours:
        # all it needs comes through the closure.
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

        return traced

    def _enter(self, client: Any) -> tuple[Any, Any, Any] | None:
        """Open the call's compute span; (record, tokens...) or None when it cannot be traced."""
        record = None
        outer: list[Any] = []
        try:
            self._follow_scheduler(client)
            self.attach(client)
            record = self._begin(outer)
            record.cluster = adapter.scheduler_address(client)
            record.failed_tasks = record.output_bytes = -1  # unknown until the scheduler says
            named = span_attributes()  # the distributed span it is submitted in
            if named:
                record.span.set_attributes(named)
            budget = self._settings.max_task_spans
            if budget is not None:
                budget = -(-budget // adapter.client_worker_count(client))
            note = make_note(record.span.get_span_context(), budget=budget, clock=self.clock_for_note(client))
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

    def _begin_inside(self, parent: trace.Span, worker: Any, note: str | None) -> Any:
        """A compute a task started: under ``parent`` (of the task's trace), on its caller's timeline."""
        shift_ns, clock = (0, {}) if self._settings.clock == "local" else worker_placement(worker, clock_of(note))
        token = otel_context.attach(trace.set_span_in_context(parent))
        try:
            record = self._tracker.begin("distributed", shift_ns=shift_ns)
        finally:
            otel_context.detach(token)
        if record is not None and clock:
            record.span.set_attributes(clock)
        return record

    def _begin(self, outer: list[Any]) -> Any:
        """Open the compute span; ``outer`` gets the spans opened around it (:func:`.spans.stand_ins`)."""
        current = trace.get_current_span()
        running = adapter.current_task(default=None)
        note = note_of(*running) if running is not None else None
        inside = parent_span(note)
        # Inside a task, nest under the current span where it is of the task's trace (the
        # task's own: .inside_tasks; or one its code opened), else under the task's compute.
        # A thread of an in-process worker may carry an unrelated context (wherever the
        # cluster was started), which must not win.
        if inside is not None:
            same_trace = current.get_span_context().trace_id == inside.get_span_context().trace_id
            return self._begin_inside(current if same_trace else inside, running[0], note)
        # Not inside a task: distributed puts the task's own span in its annotations, and
        # its compute already stands for it. Not in a forked child: nothing is traced there.
        if running is None and not self._tracker.forked:
            outer.extend(stand_ins(self._tracker.tracer, launcher=self._tracker.launcher))
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
