"""What code inside a task on a dask.distributed worker sees of its trace.

While a task runs on a worker (on a thread of its pool, or an ``async def`` task on its event
loop), OpenTelemetry's current span stands in for the task's own span: a
:class:`~otel_graph.telemetry.task_context.TaskParent` in the compute's trace. Spans the task's code
starts (its own, an instrumented library's) nest under it, and a log record stamped with the
current context points at it. :class:`TaskContexts` makes it current around each run
(:func:`.adapter.run_tasks_within`).

The task's span is made after the run (:mod:`.task_spans`), so it has no id while the task
runs. One is drawn when something asks for the current span's context, and kept under the
task's key until the worker records the run (:func:`take_span_id`, into ``TaskRun.span_id``);
the task's span is then emitted with that id, whatever the span budget, so the children
always find their parent. Anything that reads the current span's context counts as asking:
a span started inside the task, a log handler that stamps records with trace context.
Where the worker's spans cannot be given an id (they go through an application's own
tracer, which picks ids itself) or the compute is not sampled, the stand-in answers with
the compute span's context instead. The compute is the one the task's note names
(:mod:`.propagation`); a task whose note has not come yet (the first tasks a scheduler sends a
new worker) runs with the context it had.

In a worker process whose SDK otel_graph built, the spans that code inside tasks makes are put
on the caller's timeline, as the task spans are (:mod:`.clock`): :func:`placed` is the
span processor's ``placement`` hook (:class:`~otel_graph.export.pipeline.ReliableSpanProcessor`).
It moves a span of a compute that ran here, other than otel_graph's own (placed as they are
made), by this worker's offset from the caller as it is when the span ends, events included,
and marks it with ``dask.clock.correction`` and ``dask.clock.uncertainty``. A worker process
with an SDK of its own keeps its clock for them.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable
from itertools import islice
from typing import Any

from otel_graph.cluster.clock import Reading, worker_placement
from otel_graph.cluster.note import clock_of, parent_context
from otel_graph.cluster.propagation import note_of
from otel_graph.telemetry.process_state import SCOPE  # otel_graph's own spans: placed as they are made
from otel_graph.telemetry.task_context import TaskParent, attach_context, detach_context, with_span

logger = logging.getLogger("otel_graph")

#: Span ids given out, by task key, until the worker records the task's run or the task
#: leaves ``executing`` otherwise (:func:`take_span_id`); written by the running task's
#: :class:`TaskParent`. Past :data:`_KEPT` entries (runs never taken), the oldest are
#: forgotten: a running task's is among the newest. Two workers of one process running one
#: key at once share an entry.
_given: dict[Any, int] = {}
#: trace id -> (the caller's clock from the note, the worker that ran its tasks), for
#: :func:`placed`; the newest :data:`_KEPT` computes.
_callers: dict[int, tuple[Reading | None, Any]] = {}
_callers_lock = threading.Lock()
_KEPT = 4096


def take_span_id(key: Any) -> int:
    """The span id code inside the task ``key`` was given as it ran (0: none), forgotten here."""
    return _given.pop(key, 0) if _given else 0


def _make_room() -> None:
    if len(_given) >= _KEPT:
        for key in list(islice(_given, _KEPT // 4)):
            _given.pop(key, None)


class TaskContexts:
    """Each run's stand-in span, current while it runs; see the module docs."""

    def __init__(self, telemetry_of: Callable[[Any], Any]) -> None:
        """``telemetry_of(worker)``: the worker's telemetry (``assigns_span_ids``, ``local``), or None."""
        self._telemetry_of = telemetry_of
        #: (note, the compute span's context) of the last note read: one per compute and step.
        self._last: tuple[Any, Any] = (None, None)
        self._warned = False

    def entered(self, worker: Any, key: Any) -> Any:
        try:
            telemetry = self._telemetry_of(worker)
            if telemetry is None:
                return None
            note = note_of(worker, key)
            if note is None:
                return None
            last_note, compute = self._last  # one read: tasks start on several threads
            if note != last_note:
                compute = parent_context(note)
                self._last = (note, compute)
                if compute is not None and not telemetry.local:
                    _remember(compute.trace_id, clock_of(note), worker)
            if compute is None:
                return None
            _make_room()
            parent = TaskParent(compute, _given, assign_ids=compute.trace_flags.sampled and telemetry.assigns_span_ids)
            parent.key = key
            return parent, attach_context(with_span(parent))
        except Exception as exc:  # a changed internal costs the context, never the task
            if not self._warned:
                self._warned = True
                logger.warning("otel_graph: tasks on this worker run without their span current (%s: %s); "
                               "spans their code starts are not joined to the compute's trace", type(exc).__name__, exc)
            return None

    def left(self, token: Any) -> None:
        parent, attached = token
        parent.key = None  # read later (a thread the task left running): the compute's
        detach_context(attached)


def _remember(trace_id: int, caller: Reading | None, worker: Any) -> None:
    with _callers_lock:  # tasks start on several threads; taken only when the note changes
        _callers.pop(trace_id, None)
        _callers[trace_id] = (caller, weakref.ref(worker) if worker is not None else None)
        if len(_callers) > _KEPT:
            del _callers[next(iter(_callers))]


def placed(span: Any) -> Any:
    """``span`` on its caller's timeline, where it belongs to a compute whose tasks ran here
    and is not otel_graph's own; else ``span`` itself."""
    context = span.context
    entry = _callers.get(context.trace_id) if context is not None else None
    if entry is None:
        return span
    scope = span.instrumentation_scope
    if scope is not None and scope.name == SCOPE.name:
        return span
    caller, worker_ref = entry
    worker = worker_ref() if worker_ref is not None else None
    shift_ns, clock = worker_placement(worker, caller)
    if not clock:  # nothing measured here yet
        return span
    return _moved(span, shift_ns, clock)


def _moved(span: Any, shift_ns: int, clock: dict[str, float]) -> Any:
    """A copy of an ended SDK span, ``shift_ns`` later, events too, carrying ``clock``."""
    from opentelemetry.attributes import BoundedAttributes
    from opentelemetry.sdk.trace import Event, ReadableSpan
    from opentelemetry.sdk.util import BoundedList

    attributes = BoundedAttributes(None, {**(span.attributes or {}), **clock}, immutable=True)
    attributes.dropped = span.dropped_attributes
    events = BoundedList.from_seq(None, [Event(event.name, event.attributes, event.timestamp + shift_ns)
                                         for event in span.events])
    events.dropped = span.dropped_events
    links = BoundedList.from_seq(None, span.links)
    links.dropped = span.dropped_links
    return ReadableSpan(
        name=span.name, context=span.context, parent=span.parent, resource=span.resource, attributes=attributes,
        events=events, links=links, kind=span.kind, status=span.status,
        start_time=span.start_time + shift_ns if span.start_time is not None else None,
        end_time=span.end_time + shift_ns if span.end_time is not None else None,
        instrumentation_scope=span.instrumentation_scope,
    )
