"""The trace a launcher hands this process in its environment: ``TRACEPARENT`` and ``TRACESTATE``.

A CI step, a cron wrapper or a workflow engine's operator that traces its own work makes
a Dask script it starts part of that trace by putting the W3C trace context of its
current span into the child's environment. OpenTelemetry's specification of environment
variables as context propagation carriers names the variables after the W3C headers, in
upper case: ``TRACEPARENT`` holds a ``traceparent`` value, ``TRACESTATE`` a ``tracestate``
value::

    TRACEPARENT=00-<trace id: 32 hex digits>-<parent span id: 16 hex digits>-01 python etl.py

:func:`launcher_parent` reads them as the specification asks, once, at start-up (here:
when otel_graph is instrumented), and parses them with OpenTelemetry's own W3C propagator
(``TraceContextTextMapPropagator``) over a carrier of the headers' lowercase names. Every
span otel_graph opens at the top of the caller's work (a ``dask.compute`` span, a
``distributed.span`` block's) starts in :func:`under_launcher`'s context: the launcher's
span is its parent where no valid span is current; a span begun under one of the
application's own stays that span's child. Where no launcher set the variables, that
costs each such span one comparison with None.

The launcher decides the sampling, as a remote parent does: flags ``01`` (sampled) and
the computes are traced, ``00`` and they are not (under the SDK's default sampler). A
``TRACEPARENT`` the propagator refuses is ignored with one warning, naming the variable
and what is wrong with it, and computes start traces of their own. A ``TRACESTATE`` it
refuses (over 512 characters, a member not in the W3C form, a key twice) is dropped
whole, as the propagator drops it; the trace is kept.

>>> parent = launcher_parent(environ={
...     "TRACEPARENT": "00-0123456789abcdef0123456789abcdef-0123456789abcdef-01",
...     "TRACESTATE": "vendor=on"})
>>> context = parent.get_span_context()
>>> f"{context.trace_id:032x}", f"{context.span_id:016x}", context.is_remote, context.trace_state.to_header()
('0123456789abcdef0123456789abcdef', '0123456789abcdef', True, 'vendor=on')
>>> launcher_parent(environ={"TRACEPARENT": ""}) is None  # set but empty: none
True
>>> _fault("00-0123456789abcdef0123456789abcdef-0123456789abcdef")
"it is not four fields joined by '-' (version-trace id-parent span id-flags)"
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from otel_graph.telemetry.task_context import current_context, span_in, with_span

logger = logging.getLogger("otel_graph")

TRACEPARENT = "TRACEPARENT"
TRACESTATE = "TRACESTATE"

#: The longest ``traceparent`` the W3C propagator reads; it refuses a longer one with a log line
#: of its own, so a longer value is refused here first, with otel_graph's one warning.
MAX_TRACEPARENT_CHARS = 512
#: Of a refused value, the characters its warning quotes.
_QUOTED_CHARS = 64
_HEX = frozenset("0123456789abcdef")
#: A ``traceparent``'s fields, each with its length in lowercase hex digits.
_FIELDS = (("version", 2), ("trace id", 32), ("parent span id", 16), ("flags", 2))
_PROPAGATOR = TraceContextTextMapPropagator()


def launcher_parent(*, environ: Mapping[str, str] | None = None) -> trace.Span | None:
    """The launcher's span, a non-recording span with the remote context of ``TRACEPARENT`` and
    ``TRACESTATE`` in ``environ`` (None: ``os.environ``); None where ``TRACEPARENT`` is unset,
    empty, or refused (then with one warning through the ``otel_graph`` logger)."""
    environ = os.environ if environ is None else environ
    traceparent = environ.get(TRACEPARENT, "")
    if not traceparent.strip():
        return None
    if len(traceparent) > MAX_TRACEPARENT_CHARS:
        _ignore(traceparent, f"it is {len(traceparent)} characters long, over the {MAX_TRACEPARENT_CHARS} "
                             "a W3C traceparent may have")
        return None
    carrier = {"traceparent": traceparent}
    tracestate = environ.get(TRACESTATE)
    if tracestate:
        carrier["tracestate"] = tracestate
    span = trace.get_current_span(_PROPAGATOR.extract(carrier, context=Context()))
    if not span.get_span_context().is_valid:
        _ignore(traceparent, _fault(traceparent))
        return None
    return span


def under_launcher(launcher: trace.Span | None, context: Context | None = None) -> Context | None:
    """``context`` (None: the current one), with ``launcher`` current in it where no valid
    span is; ``context`` itself where nothing changes (so None stays None: start in the
    current context)."""
    if launcher is None:
        return context
    current = span_in(current_context() if context is None else context)
    if current is not None and current.get_span_context().is_valid:
        return context
    return with_span(launcher, context)


def _fault(traceparent: str) -> str:
    """What the W3C propagator refused in ``traceparent``, in words (it says only that it did)."""
    fields = traceparent.strip(" \t").split("-")  # the propagator allows spaces and tabs around
    if len(fields) < len(_FIELDS):
        return "it is not four fields joined by '-' (version-trace id-parent span id-flags)"
    for (name, digits), field in zip(_FIELDS, fields[:len(_FIELDS)], strict=True):
        if len(field) != digits or not _HEX.issuperset(field):
            return f"its {name} {_quoted(field)} is not {digits} lowercase hex digits"
    version, trace_id, span_id = fields[:3]
    if not trace_id.strip("0") or not span_id.strip("0"):
        return "its trace id or parent span id is all zeros"
    if version == "ff":
        return "version ff is forbidden"
    return "version 00 has nothing after the flags"


def _ignore(traceparent: str, reason: str) -> None:
    logger.warning("otel_graph: ignoring %s=%s: %s; computes with no current span start traces of their own",
                   TRACEPARENT, _quoted(traceparent), reason)


def _quoted(value: str) -> str:
    """``value`` as Python quotes it, cut to its first :data:`_QUOTED_CHARS` characters (said so)."""
    if len(value) <= _QUOTED_CHARS:
        return repr(value)
    return f"{value[:_QUOTED_CHARS]!r}... ({len(value)} characters)"
