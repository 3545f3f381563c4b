"""distributed's spans as OpenTelemetry spans.

``with distributed.span("load"):`` is how Dask users name a part of their work:
distributed files every task submitted inside the block under that span (the dashboard's
*Fine Performance Metrics* are broken down by it). With otel_graph installed, the block is
also an OpenTelemetry span, current for the block, so that everything inside it nests
under it: the computes it submits (and the task spans under them), the spans the user's
own code opens, and the distributed spans nested in it (and, with no span current, it
is the child of a launcher's ``TRACEPARENT``, as a compute is)::

    etl                      (dask.span.name="etl")
    └─ load                  (dask.span.name="etl/load")
       └─ dask.compute
          └─ read-csv ...    (task spans)

Each is named by its tag, with the attributes ``dask.span.name`` (the tags from the
outermost span, joined by ``/``, as the fine performance metrics name it) and
``dask.span.id`` (distributed's id of it, the key of its ``Span`` on the scheduler). A
block that raises ends its span with an error status and ``error.type``.

:func:`install` replaces ``distributed.span`` (and ``distributed.spans.span``) with a
function that returns distributed's own context manager wrapped in a small class: same
arguments, same value from ``with ... as``, same errors, and the same traceback (a class,
not a generator, so a user's exception passes through distributed's frames only).

A distributed span entered some other way (``dask.annotate(span=...)``, or a reference
to distributed's function taken before otel_graph was installed) has no block of ours
to follow. Each compute submitted under one gets it as a span of its own around the
compute (:func:`stand_ins`, ended with the compute): the same name and attributes, so a
search by ``dask.span.id`` finds every compute of it; a ``distributed.span`` block inside
one gets it likewise, around the block. Every compute span also says which
distributed span it was submitted in (:func:`span_attributes`). A collection built
inside a span and computed outside it carries the span in its graph, not in the
caller's context: its compute says nothing of it.
"""

from __future__ import annotations

import logging
from contextlib import ContextDecorator
from contextvars import Token
from typing import Any, cast

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Status, StatusCode

from otel_graph.telemetry.env_context import under_launcher

logger = logging.getLogger("otel_graph")

#: Where distributed defines it, and where it is re-exported.
_PLACES = ("distributed.spans", "distributed")
#: The ids of the distributed spans whose OTel spans are open in this context, outermost first.
_OPEN_IDS = otel_context.create_key("otel_graph.dask_span_ids")


def span_name(tags: Any) -> str | None:
    """``("etl", "load")`` -> ``"etl/load"``; None for anything else."""
    if isinstance(tags, (tuple, list)) and tags and all(isinstance(tag, str) for tag in tags):
        return "/".join(tags)
    return None


def _current() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The tags and ids of the distributed span this thread is in
    (``dask.get_annotations()["span"]``); empty outside any, or where they are not such."""
    import dask

    annotation = dask.get_annotations().get("span")
    if not isinstance(annotation, dict):
        return (), ()
    tags, ids = annotation.get("name"), annotation.get("ids")
    # span_name is None for anything but a non-empty tuple or list of strings; the isinstance
    # says so to the type checker.
    if (not isinstance(tags, (tuple, list)) or span_name(tags) is None or not isinstance(ids, (tuple, list))
            or len(ids) != len(tags)):
        return (), ()
    return tuple(tags), tuple(str(i) for i in ids)


def _attributes(tags: tuple[str, ...], ids: tuple[str, ...], depth: int) -> dict[str, str]:
    return {"dask.span.name": "/".join(tags[:depth]), "dask.span.id": ids[depth - 1]}


def span_attributes() -> dict[str, str]:
    """The distributed span this thread is in, as attributes; empty outside any."""
    try:
        tags, ids = _current()
        return _attributes(tags, ids, len(tags)) if tags else {}
    except Exception:
        return {}


def _open_depth(ids: tuple[str, ...]) -> int:
    """How many of the outermost of ``ids`` have their span open in this context."""
    opened = cast("tuple[str, ...]", otel_context.get_value(_OPEN_IDS) or ())
    depth = 0
    while depth < min(len(opened), len(ids)) and opened[depth] == ids[depth]:
        depth += 1
    return depth


def stand_ins(tracer: trace.Tracer, *, launcher: trace.Span | None = None) -> list[trace.Span]:
    """Spans, outermost first and each under the one before, for the distributed spans this
    thread is in whose blocks opened none here (see the module docs); empty in the usual
    case. The caller makes the last the current span of its compute, and ends them with it.
    With no valid span current, the outermost is a child of ``launcher``
    (:func:`~otel_graph.telemetry.env_context.under_launcher`)."""
    try:
        tags, ids = _current()
        if not tags:
            return []
        made: list[trace.Span] = []
        context = under_launcher(launcher)
        for level in range(_open_depth(ids) + 1, len(tags) + 1):
            span = tracer.start_span(tags[level - 1], context=context,
                                     attributes=_attributes(tags, ids, level))
            made.append(span)
            context = trace.set_span_in_context(span)
        return made
    except Exception:
        logger.debug("otel_graph: could not open a span for a distributed span", exc_info=True)
        return []


def drop_own_frame(exc: BaseException) -> None:
    """Take the frame of the wrapper handling ``exc`` (the first) off its traceback, so that
    the user's traceback is the one they would have seen without otel_graph. A bare
    ``raise`` then re-raises it without adding the frame back (Python 3.11 and later; on
    3.10 the frame stays)."""
    tb = exc.__traceback__
    if tb is not None and tb.tb_next is not None:
        exc.__traceback__ = tb.tb_next


class _Traced(ContextDecorator):
    """distributed's context manager for one ``span(*tags)`` call, and its OTel spans.

    A decorator too, as distributed's is (``@distributed.span("load")``): each call of
    the decorated function enters a fresh one.
    """

    __slots__ = ("_inner", "_tracer", "_launcher", "_levels", "_opened")

    def __init__(self, inner: Any, tracer: trace.Tracer, launcher: trace.Span | None, levels: int) -> None:
        self._inner = inner
        self._tracer = tracer
        self._launcher = launcher
        self._levels = levels  # span("a", "b") opens two nested spans
        self._opened: list[tuple[trace.Span, Token[Context]]] = []

    def _recreate_cm(self) -> _Traced:
        return _Traced(self._inner._recreate_cm(), self._tracer, self._launcher, self._levels)

    def __enter__(self) -> Any:
        try:
            value = self._inner.__enter__()
        except BaseException as exc:  # distributed's errors are the user's, as they are
            drop_own_frame(exc)
            raise
        try:
            self._open()
        except Exception:
            logger.debug("otel_graph: could not open a span for a distributed span", exc_info=True)
        return value

    def _open(self) -> None:
        tags, ids = _current()
        if len(tags) < self._levels:
            return
        # This block's own levels, and any enclosing one no span was opened for here (a
        # span function imported before instrumenting): those last as long as this block.
        first = min(_open_depth(ids), len(tags) - self._levels) + 1
        for depth in range(first, len(tags) + 1):
            span = self._tracer.start_span(tags[depth - 1], context=under_launcher(self._launcher),
                                           attributes=_attributes(tags, ids, depth))
            opened = otel_context.set_value(_OPEN_IDS, ids[:depth])
            token = otel_context.attach(trace.set_span_in_context(span, opened))
            self._opened.append((span, token))

    def __exit__(self, kind: Any, error: Any, traceback: Any) -> Any:
        try:
            while self._opened:
                span, token = self._opened.pop()
                if error is not None:
                    span.set_attribute("error.type", type(error).__qualname__)
                    span.set_status(Status(StatusCode.ERROR, type(error).__qualname__))
                span.end()
                otel_context.detach(token)  # logs, never raises, if left in another context
        except Exception:
            logger.debug("otel_graph: could not end a distributed span's span", exc_info=True)
        return self._inner.__exit__(kind, error, traceback)


class SpanCapture:
    """Puts :func:`span` in distributed's place, and takes it back out."""

    def __init__(self, tracer: trace.Tracer, *, launcher: trace.Span | None = None) -> None:
        """``launcher``: the parent of a block's span begun with no valid span current (``TRACEPARENT``)."""
        self._tracer = tracer
        self._launcher = launcher
        self._original: Any = None
        self._replaced: list[Any] = []

    def install(self) -> None:
        import importlib

        modules: list[Any] = [importlib.import_module(name) for name in _PLACES]
        original = getattr(modules[0], "span", None)
        if not callable(original):
            return  # a distributed without spans
        tracer, launcher = self._tracer, self._launcher

        def span(*tags: str) -> Any:
            return _Traced(original(*tags), tracer, launcher, len(tags))

        span.__name__, span.__qualname__, span.__doc__ = "span", "span", original.__doc__
        span.__module__, span.__wrapped__ = original.__module__, original  # type: ignore[attr-defined]
        self._original = original
        for module in modules:
            if getattr(module, "span", None) is original:
                module.span = span
                self._replaced.append(module)

    def uninstall(self) -> None:
        for module in self._replaced:
            module.span = self._original
        self._replaced.clear()
