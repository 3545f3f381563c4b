"""A local compute's ``dask.compute`` span, made without the SDK's span machinery.

Every local compute opens one root span, and a loop of tiny computes pays for it each
time: the SDK's ``Tracer.start_span`` and ``Span.end`` cost about 11 µs, and the span
they leave in the export queue is a dozen objects (bounded attribute and event lists,
each with its lock and deque) that live until the next batch is exported, long enough
for the garbage collector to promote them and run full collections for them.

Where otel_graph built the SDK itself (its :class:`otel_graph.telemetry.spans.DirectEmitter` hands
spans straight to its own processors), the root is a :class:`ComputeSpan` instead: the
same decisions as ``start_span`` (the provider's sampler, asked with the caller's
context; its id generator; the sampler's attributes and trace state; a span the sampler
drops is a ``NonRecordingSpan`` with the same context), and at ``end()`` one
``ReadableSpan``, cut to the SDK's span limits, handed to the processors. It implements
the whole ``Span`` API with the SDK span's rules (a status once OK stays, UNSET is
ignored, calls after ``end()`` are ignored), though only the tracker holds it: what code
inside a compute finds as its current span is a ``TaskParent`` (otel_graph.telemetry.task_context).
It is used only while every processor on the provider is otel_graph's own (one an
application adds gets ``on_start`` for it, so its computes then take ``start_span``), and
it does not count in the SDK's own span metrics. Computes on dask.distributed keep SDK
spans: events reach them from other threads, and they live as long as the compute.

>>> from opentelemetry.sdk.trace import TracerProvider
>>> from opentelemetry.sdk.trace.export import SimpleSpanProcessor
>>> from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
>>> from opentelemetry.sdk.util.instrumentation import InstrumentationScope
>>> from otel_graph.telemetry.spans import DirectEmitter
>>> exported = InMemorySpanExporter()
>>> provider = TracerProvider()
>>> provider.add_span_processor(SimpleSpanProcessor(exported))
>>> span = start_compute_span(DirectEmitter(provider, InstrumentationScope("demo")), "dask.compute",
...                           start_ns=1, attributes={"dask.scheduler": "sync"})
>>> span.set_attribute("dask.graph.tasks", 3)
>>> span.end(end_time=5)
>>> (done,) = exported.get_finished_spans()
>>> done.name, dict(done.attributes), done.end_time
('dask.compute', {'dask.scheduler': 'sync', 'dask.graph.tasks': 3}, 5)
"""

from __future__ import annotations

import random as random_module
import time
from collections.abc import Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.span import DEFAULT_TRACE_STATE as _NO_STATE
from opentelemetry.trace.span import TraceState

from otel_graph.telemetry.attributes import exception_event_attributes
from otel_graph.telemetry.encoded_batch import UNSET_STATUS
from otel_graph.telemetry.events import describe_exception
from otel_graph.telemetry.task_context import current_context, span_in

_getrandbits = random_module.getrandbits

#: W3C's random-trace-id flag (SDK 1.45.2 and later set it, as this does where it exists).
_RANDOM = getattr(TraceFlags, "RANDOM_TRACE_ID", 0)
#: One of each, not one a compute: (sampled, random trace id) -> flags.
_FLAGS = {(sampled, random): TraceFlags((TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT)
                                        | (_RANDOM if random else 0))
          for sampled in (False, True) for random in (False, True)}


def _span_context_is_its_tuple() -> bool:
    """Whether a SpanContext is the tuple (trace id, span id, is_remote, flags, trace state,
    is_valid) its constructor makes, read by its properties (checked, not assumed, per release)."""
    try:
        flags, state = TraceFlags(1), TraceState([("k", "v")])
        made = tuple.__new__(SpanContext, (3, 5, False, flags, state, True))
        return made == SpanContext(3, 5, False, flags, state) and (made.trace_id, made.span_id, made.is_remote) == \
            (3, 5, False) and made.trace_flags is flags and made.trace_state is state and made.is_valid is True
    except Exception:  # noqa: BLE001 - then the constructor it is
        return False


_tuple_new = tuple.__new__
_AS_TUPLE = _span_context_is_its_tuple()


def start_compute_span(emitter: Any, name: str, *, start_ns: int, attributes: dict[str, Any],
                       context: otel_context.Context | None = None) -> trace.Span:
    """A root span under ``context``'s span (None: the current context's), as ``tracer.start_span``
    would make it.

    ``attributes`` are the span's, taken as they are: pass a dict of its own."""
    if context is None:
        context = current_context()
    current = span_in(context)
    parent = None
    if current is not None and current is not trace.INVALID_SPAN and isinstance(current, trace.Span):
        parent = current.get_span_context()  # no span: the usual case
        if not parent.is_valid:
            parent = None
    ids = emitter.id_generator
    # The SDK's RandomIdGenerator's draws, made here without its calls: each id is drawn from
    # the random module, and redrawn (by the generator) while invalid.
    draws = emitter.draws_ids
    if parent is None:
        trace_id, random = (draws and _getrandbits(128)) or ids.generate_trace_id(), emitter.random_trace_ids
    else:
        trace_id, random = parent.trace_id, bool(getattr(parent.trace_flags, "random_trace_id", False))
    if emitter.follows_parent:  # the SDK's default sampler, decided as it decides
        sampled = recording = parent is None or parent.trace_flags.sampled
        trace_state = None if parent is None else parent.trace_state
    else:
        decision = emitter.sampler.should_sample(context, trace_id, name, SpanKind.INTERNAL, attributes, ())
        sampled, recording = decision.decision.is_sampled(), decision.decision.is_recording()
        trace_state, attributes = decision.trace_state, dict(decision.attributes or {})
    if draws and _AS_TUPLE:
        # The tuple SpanContext() would make, without its checks: the ids are valid (drawn non-zero,
        # or the SDK generator's; a parent's trace id was checked valid above).
        state = _NO_STATE if trace_state is None else trace_state
        span_context = _tuple_new(SpanContext, (trace_id, _getrandbits(64) or ids.generate_span_id(), False,
                                                _FLAGS[sampled, random], state, True))
    else:
        span_context = SpanContext(trace_id, (draws and _getrandbits(64)) or ids.generate_span_id(), is_remote=False,
                                   trace_flags=_FLAGS[sampled, random], trace_state=trace_state)
    if not recording:
        return NonRecordingSpan(span_context)
    return ComputeSpan(emitter, name, span_context, parent, start_ns, attributes)


class ComputeSpan(trace.Span):
    """A recording root span whose ``end()`` hands one ``ReadableSpan`` to the processors."""

    __slots__ = ("_emitter", "_name", "_context", "_parent", "_start", "_end", "_attributes", "_events",
                 "_status")

    def __init__(self, emitter: Any, name: str, context: SpanContext, parent: SpanContext | None,
                 start_ns: int, attributes: dict[str, Any]) -> None:
        self._emitter = emitter
        self._name = name
        self._context = context
        self._parent = parent
        self._start = start_ns
        self._end: int | None = None
        self._attributes = attributes
        self._events: list[Any] = []  # the SDK's Event, made as the span's own add_event makes them
        self._status = UNSET_STATUS

    def get_span_context(self) -> SpanContext:
        return self._context

    def is_recording(self) -> bool:
        return self._end is None

    def set_attribute(self, key: str, value: Any) -> None:
        if self._end is None:
            self._attributes[key] = value

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        if self._end is None:
            self._attributes.update(attributes)

    def add_event(self, name: str, attributes: Mapping[str, Any] | None = None,
                  timestamp: int | None = None) -> None:
        if self._end is None:
            self._events.append(self._emitter.event(name, dict(attributes or {}),
                                                    time.time_ns() if timestamp is None else timestamp))

    def add_link(self, context: SpanContext, attributes: Mapping[str, Any] | None = None) -> None:
        return None  # a compute span links to nothing

    def update_name(self, name: str) -> None:
        if self._end is None:
            self._name = name

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        code = status.status_code if isinstance(status, Status) else status
        if self._end is not None or self._status.status_code is StatusCode.OK or code is StatusCode.UNSET:
            return  # as the SDK's span: OK is final, UNSET is no change
        self._status = status if isinstance(status, Status) else Status(status, description)

    def record_exception(self, exception: BaseException, attributes: Mapping[str, Any] | None = None,
                         timestamp: int | None = None, escaped: bool = False) -> None:
        event = {**exception_event_attributes(describe_exception(exception)), "exception.escaped": str(escaped),
                 **(attributes or {})}
        self.add_event("exception", event, timestamp)

    def end_aside(self, end_time: int) -> tuple[Any, ...] | None:
        """End the span, to be encoded later (:meth:`EncodedBatch.add`): ``(name, context, parent,
        start, end, attributes)``, the context a plain tuple of the SpanContext's first five fields
        (an empty trace state as None), which, unlike a SpanContext, the garbage collector stops
        tracking. None, having done nothing, where the span ended already or has events or a status."""
        if self._end is not None or self._events or self._status is not UNSET_STATUS:
            return None
        self._end = end_time
        trace_id, span_id, remote, flags, state = self._context[:5]
        return (self._name, (trace_id, span_id, remote, int(flags), None if state is _NO_STATE or not state else state),
                self._parent, self._start, end_time, self._attributes)

    def end(self, end_time: int | None = None, *, into: Any = None) -> None:
        """End the span and hand it to the processors; or, given ``into`` (an ``EncodedBatch``
        of this span's emitter), keep it there, to be queued with its compute's task spans."""
        if self._end is not None:
            return
        self._end = end_time or time.time_ns()
        if into is not None:
            into.add(self._name, self._context, self._parent, self._start, self._end, self._attributes,
                     tuple(self._events), self._status)
            return
        self._emitter.hand_over(name=self._name, context=self._context, parent=self._parent,
                                start_ns=self._start, end_ns=self._end, attributes=self._attributes,
                                events=tuple(self._events), status=self._status)
