"""Finished spans -> the provider: two emitters, each returning the new span's context.

Telemetry hands every span it makes (a task's, an aggregate's, a phase's) to an emitter,
with its name, times, parent and attributes (:mod:`otel_graph.telemetry.attributes`); the
emitter returns the span's context, for children such as a task's phases.

* :class:`ApiEmitter` goes through ``tracer.start_span``: any provider, including
  one the application configured, receives the spans the ordinary way.
* :class:`DirectEmitter` builds the SDK's ``ReadableSpan`` itself and hands it to the
  provider's span processors. It is used only for providers otel_graph built, and
  costs a tenth of the API path, which is what makes a span per task affordable.
  Where every processor takes encoded spans, it makes no ``ReadableSpan`` at all: the
  span is encoded as it ends (:mod:`otel_graph.telemetry.encoded_batch`). It applies the
  provider's span limits (``OTEL_*_LIMIT``) itself, as ``tracer.start_span`` would.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from otel_graph.telemetry.attributes import exception_event_attributes
from otel_graph.telemetry.encoded_batch import UNSET_STATUS, EncodedBatch, SpanEncoding, encoded_entry
from otel_graph.telemetry.events import ErrorInfo

#: (key, value) pairs the encoder of spans as they end remembers, at most (about 1 MB).
_MEMO_PAIRS = 4096


def _status(error: ErrorInfo | None) -> Status:
    if error is None:
        return UNSET_STATUS
    return Status(StatusCode.ERROR, f"{error.type_name}: {error.message}"[:1024])


class ApiEmitter:
    """Spans through the tracer API; works with any TracerProvider."""

    def __init__(self, tracer: trace.Tracer) -> None:
        self._tracer = tracer

    def emit(self, *, parent: trace.Span, name: str, start_ns: int, end_ns: int,
             attributes: dict[str, Any], error: ErrorInfo | None = None) -> trace.SpanContext:
        context = trace.set_span_in_context(parent)
        span = self._tracer.start_span(name, context=context, kind=SpanKind.INTERNAL,
                                       attributes=attributes, start_time=start_ns)
        if error is not None:
            span.add_event("exception", exception_event_attributes(error), timestamp=end_ns)
            span.set_status(_status(error))
        span.end(end_time=end_ns)
        return span.get_span_context()


class DirectEmitter:
    """ReadableSpans handed straight to an SDK provider's processors (providers we built)."""

    #: emit() takes the span id given out while the task ran (otel_graph.telemetry.task_context).
    sets_span_ids = True

    def __init__(self, provider: Any, scope: Any) -> None:
        from opentelemetry.sdk.trace import Event, ReadableSpan
        from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
        from opentelemetry.trace import SpanContext

        from otel_graph.export.sdk_internals import follows_parent, processors_behind, span_processor

        self._processor = span_processor(provider)
        #: The provider's processor, where its list of processors can be read (each span asks
        #: whether that list changed: one attribute read, the release's layout checked here once).
        self._multi = self._processor if self._processor is not None and processors_behind(self._processor) \
            is not None else None
        self._resource = provider.resource
        self._scope = scope
        self._readable = ReadableSpan
        #: The SDK's span event class (a compute's root span makes its events with it too).
        self.event = Event
        #: What a root span is made with (otel_graph.telemetry.compute_span), as the provider's tracer would.
        self.sampler, self.id_generator = provider.sampler, provider.id_generator
        #: The id generator is the SDK's RandomIdGenerator itself (a root span draws its ids as it does).
        self.draws_ids = type(provider.id_generator) is RandomIdGenerator
        #: Whether its trace ids are random (W3C's flag for a root span says so); a generator
        #: that cannot say is taken as not random.
        try:
            self.random_trace_ids = bool(getattr(self.id_generator, "is_trace_id_random", bool)())
        except Exception:  # noqa: BLE001 - an application's generator must not stop instrumenting
            self.random_trace_ids = False
        #: The sampler is the SDK's default: a root span's decision needs no call to it.
        self.follows_parent = follows_parent(provider.sampler)
        self._checked: tuple[Any, bool] = (None, False)
        self._encoding: tuple[Any, Any] = (None, None)  # (processors, the encoder's parts or None)
        self._span_context = SpanContext
        self._random = random.Random()
        #: (the last parent, its context), one attribute: emit() runs in more than one thread.
        self._parent: tuple[Any, Any] = (None, None)
        #: The span limits the provider applies to spans it starts (OTEL_*_LIMIT), applied
        #: here too; None when nothing otel_graph makes can reach them (the defaults).
        self._limits = _biting_limits()
        if self._limits is None:
            self.encoding = self._encoder  # type: ignore[method-assign]

    def emit(self, *, parent: trace.Span, name: str, start_ns: int, end_ns: int,
             attributes: dict[str, Any], error: ErrorInfo | None = None, span_id: int = 0) -> Any:
        parent_context = self._context_of(parent)
        span_id = span_id or self._random.getrandbits(64) or 1
        context = self._span_context(parent_context.trace_id, span_id, False, parent_context.trace_flags,
                                     parent_context.trace_state)
        events: tuple[Any, ...] = ()
        if error is not None:
            events = (self.event("exception", exception_event_attributes(error), end_ns),)
        self._hand_over(name, context, parent_context, start_ns, end_ns, attributes, events, _status(error))
        return context

    def _context_of(self, parent: trace.Span) -> Any:
        """``parent``'s span context: spans come in runs of one compute, so it is read once a run."""
        last, parent_context = self._parent
        if parent is not last:
            parent_context = parent.get_span_context()
            self._parent = (parent, parent_context)
        return parent_context

    def queues_only(self) -> bool:
        """Whether every processor on the provider is one of otel_graph's, which queue a span
        and return: then spans may be made in the user's thread, and a root span needs no
        ``on_start``. Asked per compute (an application may add a processor of its own),
        answered from the last answer while the provider's list is the same object."""
        multi = self._multi
        if multi is None:
            return False
        current = multi._span_processors
        checked = self._checked  # one read: computes begin in several threads
        if current is not checked[0]:
            checked = self._checked = (current, bool(current) and all(getattr(p, "never_blocks", False)
                                                                     for p in current))
        return checked[1]

    def _encoder(self) -> tuple[Any, SpanEncoding] | None:
        """(processors, what encodes for them) while every processor takes encoded spans, else None.
        Asked per span (a cluster's ledger may start reading delivered spans), answered from
        the last answer while the provider's processors are the same, and its memo not too
        big (a new one then: task keys would grow it without end)."""
        multi = self._multi
        if multi is None:
            return None
        current = multi._span_processors
        known, parts = self._encoding
        if parts is not None and len(parts.memo.pairs) > _MEMO_PAIRS:
            known = None  # a new memo: task keys would grow it without end
        if current is not known:
            parts = None
            if current and all(getattr(p, "takes_encoded", False) for p in current):
                parts = SpanEncoding(self._resource, self._scope)
            self._encoding = (current, parts)
        if parts is None:
            return None
        for processor in current:
            if not processor.takes_encoded:
                return None
        return current, parts

    def encoding(self) -> tuple[Any, SpanEncoding] | None:
        """Where spans are encoded as they end: (the processors now, what encodes for them), for
        :meth:`encoded_batch`; None where they are not, or where a span limit bites. (Where none
        bites, the instance's own ``encoding`` is :meth:`_encoder` itself: a call fewer.)"""
        return None if self._limits is not None else self._encoder()

    def encoded_batch(self, encoding: tuple[Any, SpanEncoding] | None = None) -> EncodedBatch | None:
        """Somewhere to encode spans as they end (:meth:`EncodedBatch.add_tasks`, :meth:`EncodedBatch.add_task`,
        :meth:`EncodedBatch.add`), to queue them together (:meth:`EncodedBatch.queue`) to the processors
        of ``encoding`` (an earlier :meth:`encoding`'s, taken as it is; None: now's, and None where
        spans are not encoded as they end, or where a span limit bites)."""
        if encoding is None:
            encoding = self.encoding()
            if encoding is None:
                return None
        batch = EncodedBatch()  # list's own __init__: a Python one cost each compute a call
        batch.emitter, (batch.processors, batch.parts) = self, encoding
        return batch

    @staticmethod
    def _queue_encoded(processors: Any, encoded: tuple[bytes, int]) -> None:
        for processor in processors:
            processor.on_end_encoded(encoded)

    def hand_over(self, *, name: str, context: Any, parent: Any, start_ns: int, end_ns: int,
                  attributes: dict[str, Any], events: tuple[Any, ...], status: Status) -> None:
        """One finished span, cut to the span limits, to the provider's processors.

        Encoded here, once, when every processor queues it for an exporter of encoded
        chunks (:mod:`otel_graph.export.otlp_fast`): no ``ReadableSpan`` is made, nor encoded later.
        """
        self._hand_over(name, context, parent, start_ns, end_ns, attributes, events, status)

    def _hand_over(self, name: str, context: Any, parent: Any, start_ns: int, end_ns: int,
                   attributes: dict[str, Any], events: Sequence[Any], status: Status) -> None:
        # hand_over's body, called positionally once a task span: keywords cost a span ~0.3 µs.
        if self._limits is not None:
            attributes, events = _limited(self._limits, attributes, events, self.event)
        else:
            encoding = self._encoder()
            if encoding is not None:
                processors, parts = encoding
                encoded = encoded_entry(parts, name, context, parent, start_ns, end_ns, attributes, events, status)
                if encoded is not None:
                    self._queue_encoded(processors, encoded)
                    return
        self._processor.on_end(self._readable(
            name=name, context=context, parent=parent, resource=self._resource,
            attributes=attributes, events=events, kind=SpanKind.INTERNAL, status=status,
            start_time=start_ns, end_time=end_ns, instrumentation_scope=self._scope,
        ))


#: More than any span otel_graph makes carries: limits at or above it change nothing.
_MOST_ATTRIBUTES = 128


def _biting_limits() -> Any:
    """The span limits of a provider otel_graph built (the SDK's ``SpanLimits()``, read from
    the ``OTEL_*_LIMIT`` variables, as that provider's were), or None where they cannot
    touch a span of ours."""
    from opentelemetry.sdk.trace import SpanLimits

    limits = SpanLimits()

    def under(value: int | None) -> bool:
        return value is not None and value < _MOST_ATTRIBUTES

    if limits.max_span_attribute_length is None and limits.max_attribute_length is None \
            and not any(under(v) for v in (limits.max_span_attributes, limits.max_events,
                                           limits.max_event_attributes)):
        return None
    return limits


def _limited(limits: Any, attributes: dict[str, Any], events: Sequence[Any], make_event: Any
             ) -> tuple[Any, Sequence[Any]]:
    """``attributes`` and ``events`` cut to ``limits`` as the SDK cuts a span it started
    (``Span.set_attributes``, ``Span.add_event``), with what was dropped counted."""
    from opentelemetry.attributes import BoundedAttributes

    bounded = BoundedAttributes(limits.max_span_attributes, attributes, immutable=True,
                                max_value_len=limits.max_span_attribute_length)
    if events:
        from opentelemetry.sdk.util import BoundedList

        events = BoundedList.from_seq(limits.max_events, [  # keeps the last, counts the rest, as Span does
            make_event(event.name, BoundedAttributes(limits.max_event_attributes, event.attributes, immutable=True,
                                                     max_value_len=limits.max_attribute_length), event.timestamp)
            for event in events])
    return bounded, events

