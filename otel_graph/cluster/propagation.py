"""How a compute's trace context travels from the client to every task on every worker.

The client opens the ``dask.compute`` span, then submits the graph inside
``dask.annotate(otel_graph=...)``. distributed applies such call-time annotations on the
scheduler, to every task of the update, after the client has optimised and fused the
graph, so fusion cannot lose it; the scheduler sends each task's annotations to the
worker that runs it. The annotation is one short string:

``<traceparent>;<budget>``
    the W3C trace context of the compute span (``00-<trace id>-<span id>-<flags>``),
    then the task spans each worker may emit for this compute (the compute's budget
    shared between the workers); without ``;<budget>``, unlimited.

Every task carries its own decoded copy on the scheduler and on its worker, for as long
as they hold the task: as a string it costs ~110 B a task, where the dict of earlier
versions cost ~320 B (6 MB on a worker holding 20,000 results). Such a dict is still
read, from a client of an earlier version.

>>> from opentelemetry.trace import SpanContext, TraceFlags
>>> ctx = SpanContext(0x1F, 0x2A, is_remote=False, trace_flags=TraceFlags(1))
>>> note = annotation(ctx, budget=10)
>>> note
'00-0000000000000000000000000000001f-000000000000002a-01;10'
>>> parent_context(note).span_id == 0x2A, budget_of(note), budget_of(annotation(ctx, budget=None))
(True, 10, None)
>>> parent_context("garbage") is None, budget_of(note.partition(";")[0] + ";" + "9" * 5000)
(True, None)
>>> budget_of({"traceparent": note.partition(";")[0], "budget": 3})  # an earlier client's dict
3
"""

from __future__ import annotations

from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanContext, TraceFlags

#: The annotation name on every task of a traced compute.
ANNOTATION = "otel_graph"


def annotation(context: SpanContext, *, budget: int | None) -> str:
    flags = int(context.trace_flags)
    traceparent = f"00-{context.trace_id:032x}-{context.span_id:016x}-{flags:02x}"
    return traceparent if budget is None else f"{traceparent};{budget}"


def _parts(note: Any) -> tuple[Any, Any]:
    if isinstance(note, str):
        traceparent, _, budget = note.partition(";")
        return traceparent, budget
    if isinstance(note, dict):  # a client of an earlier version
        return note.get("traceparent"), note.get("budget")
    return None, None


def traceparent_of(note: Any) -> str | None:
    """The compute span's W3C traceparent as a task's annotation carries it; None if not ours."""
    traceparent = _parts(note)[0]
    return traceparent if isinstance(traceparent, str) and traceparent else None


def budget_of(note: Any) -> int | None:
    """Task spans a worker may emit for the compute; None for unlimited (or unreadable)."""
    budget = _parts(note)[1]
    # Bounded: int() refuses a decimal string of over 4,300 digits (a ValueError here).
    if isinstance(budget, str) and budget.isdigit() and budget.isascii() and len(budget) <= 18:
        budget = int(budget)
    return budget if isinstance(budget, int) and budget >= 0 else None


def parent_context(note: Any) -> SpanContext | None:
    """The compute span's context from a task's annotation; None when it is not ours or malformed."""
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


def seal_env(env: dict[str, str]) -> bytes:
    """The client's ``OTEL_*`` settings as they travel inside a plugin: compressed.

    distributed logs whole messages at DEBUG, pickled plugins included; compressed, the
    settings (exporter headers carry credentials) never appear there as text. This keeps
    them out of logs; it is not encryption (secure the cluster's comms with TLS for that).

    >>> unseal_env(seal_env({"OTEL_EXPORTER_OTLP_HEADERS": "authorization=secret"}))
    {'OTEL_EXPORTER_OTLP_HEADERS': 'authorization=secret'}
    >>> b"secret" in seal_env({"OTEL_EXPORTER_OTLP_HEADERS": "authorization=secret"})
    False
    """
    import json
    import zlib

    return zlib.compress(json.dumps(env).encode(), 9)


def unseal_env(sealed: bytes) -> dict[str, str]:
    import json
    import zlib

    try:
        env = json.loads(zlib.decompress(sealed))
    except Exception:
        return {}
    return {str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else {}
