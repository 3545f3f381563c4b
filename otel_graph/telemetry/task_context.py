"""The running task as the parent of spans that user code starts inside it.

Task spans are built after the fact, in bulk, from records (``otel_graph.telemetry.tracker``), so
while a task runs there is no span object to make current. Yet a task that calls
instrumented code (an HTTP client, a database driver, its own ``tracer.start_span``)
should see those spans nest under the task's span, not under ``dask.compute``.

:class:`TaskParent` stands in for the task span in the OpenTelemetry context of the
thread that runs tasks. Capture sets :attr:`TaskParent.key` as each task starts and
clears it when the task ends: one attribute write each, the whole cost when nobody asks.
When something does ask (a span started inside the task reads its parent), a span id is
made for that task and noted under its key in ``ids``; the tracker then emits that
task's span with exactly this id, whatever the span budget, so the children always have
their parent. Outside a task, or where spans cannot be given an id (an application's
own TracerProvider: spans go through its tracer, which picks ids itself), it answers
with the compute span's context, so user spans nest under ``dask.compute`` instead.

Making that context current is a few context operations per compute; :func:`attach_context`,
:func:`detach_context`, :func:`current_context` and :func:`with_span` are OpenTelemetry's
own, done straight on its context variable while its runtime context is the default one
(each API function goes through two Python calls, which a loop of tiny computes feels).

>>> from opentelemetry import trace
>>> compute = trace.SpanContext(1, 2, False, trace.TraceFlags(1))
>>> ids = {}
>>> parent = TaskParent(compute, ids, assign_ids=True)
>>> parent.get_span_context().span_id  # no task running: the compute span
2
>>> parent.key = "inc-1"
>>> child_parent = parent.get_span_context()
>>> child_parent.span_id == ids["inc-1"] and child_parent.trace_id == 1
True
>>> parent.get_span_context().span_id == ids["inc-1"]  # asked again: the same id
True
"""

from __future__ import annotations

import random
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.context import Context
from opentelemetry.trace import NonRecordingSpan, SpanContext

_random = random.Random()


def _runtime() -> tuple[Any, Any]:
    """OpenTelemetry's runtime context, and the ContextVar behind it where it is the default one
    (``ContextVarsRuntimeContext``); else (None, None)."""
    try:
        from opentelemetry.context import _RUNTIME_CONTEXT
        from opentelemetry.context.contextvars_context import ContextVarsRuntimeContext
    except ImportError:
        return None, None
    variable = getattr(_RUNTIME_CONTEXT, "_current_context", None)
    if type(_RUNTIME_CONTEXT) is not ContextVarsRuntimeContext or not callable(getattr(variable, "reset", None)):
        return None, None
    return _RUNTIME_CONTEXT, variable


# OpenTelemetry's context functions each go through its runtime context: two Python calls
# each, eight a compute. While that is the default, its ContextVar is used as it would use
# it; an application may put another in its place (Sentry's OpenTelemetry integration does),
# and from then on the API's functions are called.
_RUNTIME, _VARIABLE = _runtime()


def attach_context(context: Any) -> Any:
    """``opentelemetry.context.attach``."""
    if _VARIABLE is not None and otel_context._RUNTIME_CONTEXT is _RUNTIME:
        return _VARIABLE.set(context)
    return otel_context.attach(context)


def current_context() -> Any:
    """``opentelemetry.context.get_current``."""
    if _VARIABLE is not None and otel_context._RUNTIME_CONTEXT is _RUNTIME:
        return _VARIABLE.get()
    return otel_context.get_current()


def detach_context(token: Any) -> None:
    """``opentelemetry.context.detach``: which logs, never raises, where the token is not this context's."""
    if _VARIABLE is not None and otel_context._RUNTIME_CONTEXT is _RUNTIME:
        try:
            _VARIABLE.reset(token)
            return
        except Exception:  # noqa: BLE001 - the API's own detach says so, as it would have
            pass
    otel_context.detach(token)


SPAN_KEY: str | None
try:  # the key the API keeps the current span under
    from opentelemetry.trace import propagation as _propagation

    SPAN_KEY = _propagation._SPAN_KEY
except (ImportError, AttributeError):
    SPAN_KEY = None


def span_in(context: Any) -> Any:
    """``trace.get_current_span(context)``, read without its two calls where the key is known
    (then None, not INVALID_SPAN, when the context holds no span)."""
    if SPAN_KEY is None:
        from opentelemetry.trace import get_current_span

        return get_current_span(context)
    return context.get(SPAN_KEY)


def with_span(span: Any, context: Any = None) -> Any:
    """``trace.set_span_in_context(span, context)``, as the API makes it: a copy of ``context``
    (None: the current one) with ``span`` current."""
    if SPAN_KEY is None:
        from opentelemetry.trace import set_span_in_context

        return set_span_in_context(span, context)
    values = (current_context() if context is None else context).copy()
    values[SPAN_KEY] = span
    return Context(values)


class TaskParent(NonRecordingSpan):
    """Parent of the spans started inside the task now running on one thread."""

    __slots__ = ("key", "_ids", "_assign", "_compute")

    def __init__(self, compute: SpanContext, ids: dict[Any, int], *, assign_ids: bool) -> None:
        """``compute`` is the compute span's context; ``assign_ids`` whether a task gets a span
        id when asked (not where its span cannot take one, nor in an unsampled compute, whose
        children follow it, unsampled, and which emits no task spans)."""
        super().__init__(compute)
        self._compute = compute
        self.key: Any = None
        self._ids = ids
        self._assign = assign_ids

    def get_span_context(self) -> SpanContext:
        key = self.key
        if key is None or not self._assign:
            return self._compute
        span_id = self._ids.get(key)
        if span_id is None:  # two threads of one task asking at once get one id
            span_id = self._ids.setdefault(key, _random.getrandbits(64) or 1)
        compute = self._compute
        return SpanContext(compute.trace_id, span_id, False, compute.trace_flags, compute.trace_state)
