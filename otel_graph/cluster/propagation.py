"""How a compute's trace context travels from the client to every task on every worker.

The client opens the ``dask.compute`` span, then submits the graph inside
``dask.annotate(otel_graph=...)``. distributed applies such call-time annotations on the
scheduler, to every task of the update, after the client has optimised and fused the
graph, so fusion cannot lose it; the scheduler sends each task's annotations to the
worker that runs it. The annotation is a small dict:

``traceparent``
    W3C trace context of the compute span (``00-<trace id>-<span id>-<flags>``).
``budget``
    Task spans each worker may emit for this compute (the compute's budget shared
    between the workers), or None for unlimited.

>>> from opentelemetry.trace import SpanContext, TraceFlags
>>> ctx = SpanContext(0x1F, 0x2A, is_remote=False, trace_flags=TraceFlags(1))
>>> note = annotation(ctx, budget=10)
>>> note
{'traceparent': '00-0000000000000000000000000000001f-000000000000002a-01', 'budget': 10}
>>> parent_context(note).span_id == 0x2A
True
>>> parent_context({"traceparent": "garbage"}) is None
True
"""

from __future__ import annotations

from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanContext, TraceFlags

#: The annotation name on every task of a traced compute.
ANNOTATION = "otel_graph"


def annotation(context: SpanContext, *, budget: int | None) -> dict[str, Any]:
    flags = int(context.trace_flags)
    return {"traceparent": f"00-{context.trace_id:032x}-{context.span_id:016x}-{flags:02x}", "budget": budget}


def parent_context(note: Any) -> SpanContext | None:
    """The compute span's context from a task's annotation; None when it is not ours or malformed."""
    if not isinstance(note, dict):
        return None
    parts = str(note.get("traceparent", "")).split("-")
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


def budget_of(note: Any) -> int | None:
    value = note.get("budget") if isinstance(note, dict) else None
    return value if isinstance(value, int) and value >= 0 else None


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
