"""A compute's note: what travels with each of its tasks to the worker that runs it (:mod:`.propagation`).

A note is one short string:

``<traceparent>;<budget>;<offset>,<uncertainty>,<process>``
    the W3C trace context of the compute span (``00-<trace id>-<span id>-<flags>``),
    then the task spans each worker may emit for this compute (the compute's budget
    shared between the workers; empty: unlimited), then the caller's clock minus the
    scheduler's and how far that may be off, in integer nanoseconds, and the process
    whose clock that is (a :class:`.clock.Reading`; absent where the caller keeps every
    clock local or has not measured it yet).

>>> from opentelemetry.trace import SpanContext, TraceFlags
>>> ctx = SpanContext(0x1F, 0x2A, is_remote=False, trace_flags=TraceFlags(1))
>>> note = make_note(ctx, budget=10, clock=Reading(-3_000_000_000, 1_500_000, "5eed"))
>>> note
'00-0000000000000000000000000000001f-000000000000002a-01;10;-3000000000,1500000,5eed'
>>> parent_context(note).span_id == 0x2A, budget_of(note), clock_of(note)
(True, 10, Reading(offset_ns=-3000000000, uncertainty_ns=1500000, process='5eed'))
>>> plain = make_note(ctx, budget=None, clock=None)
>>> budget_of(plain), clock_of(plain), clock_of(plain + ";1,x")
(None, None, None)
>>> parent_context("garbage") is None, budget_of(note.partition(";")[0] + ";" + "9" * 5000)
(True, None)
"""

from __future__ import annotations

from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanContext, TraceFlags

from otel_graph.cluster.clock import Reading


def make_note(context: SpanContext, *, budget: int | None, clock: Reading | None) -> str:
    flags = int(context.trace_flags)
    traceparent = f"00-{context.trace_id:032x}-{context.span_id:016x}-{flags:02x}"
    shares = "" if budget is None else str(budget)
    if clock is None:
        return traceparent if budget is None else f"{traceparent};{shares}"
    return f"{traceparent};{shares};{clock.offset_ns},{clock.uncertainty_ns},{clock.process}"


def _parts(note: Any) -> tuple[Any, Any, Any]:
    if isinstance(note, str):
        traceparent, _, rest = note.partition(";")
        budget, _, clock = rest.partition(";")
        return traceparent, budget, clock
    return None, None, None


def traceparent_of(note: Any) -> str | None:
    """The compute span's W3C traceparent in a note; None if it is not one."""
    traceparent = _parts(note)[0]
    return traceparent if isinstance(traceparent, str) and traceparent else None


def budget_of(note: Any) -> int | None:
    """Task spans a worker may emit for the compute; None for unlimited (or unreadable)."""
    budget = _parts(note)[1]
    # Bounded: int() refuses a decimal string of over 4,300 digits (a ValueError here).
    if isinstance(budget, str) and budget.isdigit() and budget.isascii() and len(budget) <= 18:
        return int(budget)
    return None


def clock_of(note: Any) -> Reading | None:
    """The caller's clock against the scheduler's; None where the note has none."""
    parts = (_parts(note)[2] or "").split(",")
    if len(parts) != 3 or not all(0 < len(part) <= 20 for part in parts):  # bounded: int() of a short string
        return None
    try:
        return Reading(int(parts[0]), int(parts[1]), parts[2])
    except ValueError:
        return None


def parent_context(note: Any) -> SpanContext | None:
    """The compute span's context from a note; None when it is not one or malformed."""
    parts = (traceparent_of(note) or "").split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    try:
        trace_id, span_id, flags = int(parts[1], 16), int(parts[2], 16), int(parts[3], 16)
    except ValueError:
        return None
    if not trace_id or not span_id:
        return None
    return SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(flags & 0xFF))


def parent_span(note: Any) -> trace.Span | None:
    context = parent_context(note)
    return trace.NonRecordingSpan(context) if context is not None else None
