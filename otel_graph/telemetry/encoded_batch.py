"""Spans encoded as they end: OTLP bytes queued in place of SDK span objects.

Where every span processor of a provider otel_graph built takes encoded spans (the
delivery pipeline's), :class:`~otel_graph.telemetry.spans.DirectEmitter` writes each
finished span straight to its ``ScopeSpans.spans`` entry (:mod:`otel_graph.export.otlp_spans`)
and queues ``(entry, origin)``: bytes and an int, where a ``ReadableSpan`` is a dozen
objects for the garbage collector to traverse while it waits in the queue.

* :class:`SpanEncoding`: the encoders and their memo, for one set of processors;
  :func:`encoded_entry` encodes one span with them.
* :class:`EncodedBatch`: a compute's spans encoded one after another (its task spans in
  one pass, :meth:`EncodedBatch.add_tasks`), then queued together, one lock round trip
  per processor.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode, TraceFlags

from otel_graph.naming import OTHER_PREFIXES, task_prefix
from otel_graph.telemetry.attributes import TaskFacts
from otel_graph.telemetry.events import AT_END, AT_ERROR, AT_KEY, AT_NBYTES, AT_START, TaskEvent

if TYPE_CHECKING:
    from otel_graph.telemetry.metrics import Run


#: The status of a span that did not fail; the encoders know it by identity.
UNSET_STATUS = Status(StatusCode.UNSET)


class EncodedBatch(list):
    """Spans encoded as they ended, ``(entry, origin)``, for the processors it was made for
    (:meth:`~otel_graph.telemetry.spans.DirectEmitter.encoded_batch`): :meth:`queue` hands
    them over with one lock round trip each."""

    __slots__ = ("emitter", "processors", "parts")

    #: The :class:`~otel_graph.telemetry.spans.DirectEmitter` that made it: its span ids, and
    #: the generic path for a span that cannot be encoded.
    emitter: Any
    processors: Any
    parts: SpanEncoding

    def add(self, name: str, context: Any, parent: Any, start_ns: int, end_ns: int, attributes: dict[str, Any],
            events: tuple[Any, ...], status: Status) -> None:
        """A finished span, as :meth:`DirectEmitter.hand_over <otel_graph.telemetry.spans.DirectEmitter.hand_over>`
        takes it, encoded into this batch (or, where it cannot be encoded, handed over on its own).
        No span limit applies: a batch is only made where none bites."""
        encoded = encoded_entry(self.parts, name, context, parent, start_ns, end_ns, attributes, events, status)
        if encoded is None:
            if type(context) is tuple:  # a set-aside root's context, as a plain tuple of its fields
                context = span_context_of(context)
            self.emitter.hand_over(name=name, context=context, parent=parent, start_ns=start_ns, end_ns=end_ns,
                                   attributes=attributes, events=events, status=status)
        else:
            self.append(encoded)

    def add_tasks(self, parent: Any, tasks: Sequence[tuple[tuple[Any, ...], TaskFacts]],
                  label: Callable[[str], str | None], scheduler: str, encode: Callable[..., bytes]
                  ) -> tuple[list[Run], list[tuple[TaskEvent, str]]]:
        """Task records (TaskEvent's fields), each with its :data:`TaskFacts`,
        as task spans, children of the span whose context is ``parent`` (a SpanContext, or a tuple
        of its first five fields), in one pass:
        the tasks' runs, for :meth:`otel_graph.telemetry.metrics.TaskMetrics.record_runs`, and the tasks
        left out, ``(event, prefix)``.

        Each task is labelled ``label(prefix)`` (:meth:`~otel_graph.telemetry.metrics.TaskMetrics.label`),
        in order, failed ones too, and its span named by the label. One that succeeded is added
        as :meth:`add_task` adds it, its attributes ``encode(ev, prefix, facts, memo)``
        (:meth:`otel_graph.telemetry.task_encoding.TaskAttributeEncoder.encode`). Left out, for
        :meth:`DirectEmitter.emit <otel_graph.telemetry.spans.DirectEmitter.emit>` to make: failed
        tasks (their spans carry an exception event), and those whose attributes raised (the
        generic path logs the attribute and leaves it out)."""
        parts = self.parts
        memo, child_entry, origin = parts.memo, parts.child_entry, parts.origin
        span_id, make, append = self.emitter._random.getrandbits, TaskEvent._make, self.append
        runs: list[Run] = []
        left: list[tuple[TaskEvent, str]] = []
        # A record is read by position (events.AT_*), made a TaskEvent only if left out.
        for task, facts in tasks:
            prefix = task_prefix(task[AT_KEY])
            labelled = label(prefix)
            failed = task[AT_ERROR] is not None
            start, end = task[AT_START], task[AT_END]
            runs.append((labelled, scheduler, failed, end - start, task[AT_NBYTES]))
            if failed:
                left.append((make(task), prefix))
                continue
            try:  # add_task's body, inlined: a call a task cost a small compute's spans a tenth more
                entry = child_entry(parent, span_id(64) or 1, OTHER_PREFIXES if labelled is None else prefix,
                                    start, end, encode(task, prefix, facts, memo), memo)
            except Exception:  # noqa: BLE001 - made the generic way, which says what it left out
                left.append((make(task), prefix))
                continue
            append((entry, origin))
        return runs, left

    def add_task(self, parent: trace.Span, ev: TaskEvent, prefix: str, name: str, encode: Callable[..., bytes],
                 graph: Any, state: Any) -> bool:
        """The span of a task that succeeded, a child of ``parent`` named ``name`` (status UNSET,
        no events), encoded into this batch, its attributes ``encode(ev, prefix, graph, state,
        memo)`` (:class:`otel_graph.telemetry.task_encoding.TaskAttributeEncoder`): no attribute dict, no
        span context, no ``ReadableSpan``. False, having added nothing, for a failed task or
        attributes that raised: :meth:`DirectEmitter.emit <otel_graph.telemetry.spans.DirectEmitter.emit>`
        then makes it."""
        if ev.error is not None:
            return False
        parts = self.parts
        memo = parts.memo
        try:
            entry = parts.child_entry(self.emitter._context_of(parent), self.emitter._random.getrandbits(64) or 1,
                                      name, ev.start_ns, ev.end_ns, encode(ev, prefix, graph, state, memo), memo)
        except Exception:  # noqa: BLE001 - made the generic way, which says what it left out
            return False
        self.append((entry, parts.origin))
        return True

    def queue(self) -> None:
        if self:
            try:
                for processor in self.processors:
                    processor.on_end_encoded_many(self)
            finally:  # refused, they are counted once (by the caller), never queued again
                self.clear()


def span_context_of(fields: tuple[Any, ...]) -> trace.SpanContext:
    """The SpanContext of a plain tuple of its first five fields (a set-aside root's context:
    :meth:`otel_graph.telemetry.compute_span.ComputeSpan.end_aside`)."""
    trace_id, span_id, remote, flags, state = fields
    return trace.SpanContext(trace_id, span_id, remote, TraceFlags(flags), state)


def encoded_entry(parts: SpanEncoding, name: str, context: Any, parent: Any, start_ns: int, end_ns: int,
                  attributes: dict[str, Any], events: Sequence[Any], status: Status) -> tuple[bytes, int] | None:
    """A finished INTERNAL span encoded as it is queued, ``(entry, origin)``; None where it cannot
    be encoded: as a ReadableSpan, the exporter then refuses it alone."""
    try:
        if status is UNSET_STATUS and not events:
            return parts.simple_entry(context, parent, name, start_ns, end_ns, attributes, parts.memo), parts.origin
        return parts.span_entry(context, parent, name, SpanKind.INTERNAL, start_ns, end_ns, attributes, events, (),
                                status, parts.memo), parts.origin
    except Exception:  # noqa: BLE001
        return None


class SpanEncoding:
    """What encodes spans as they end, for one set of processors: the encoders, their memo,
    and the number of the spans' (resource, scope)."""

    __slots__ = ("span_entry", "simple_entry", "child_entry", "memo", "origin")

    def __init__(self, resource: Any, scope: Any) -> None:
        from otel_graph.export.otlp_fast import origin
        from otel_graph.export.otlp_spans import child_entry, new_memo, simple_entry, span_entry

        self.span_entry, self.simple_entry, self.child_entry = span_entry, simple_entry, child_entry
        self.memo = new_memo()
        self.origin = origin(resource, scope)
