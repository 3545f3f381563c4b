"""A compute's spans as the rows of a waterfall: the trace browser's data, without Bokeh.

:func:`waterfall` gives one compute's rows as plain columns (label, times, colour, what to
show on a click); :mod:`otel_graph.report.waterfall` draws them.

What a waterfall shows
----------------------
Every span of the compute's trace under its ``dask.compute`` span (``Loaded.traces``):
task spans, aggregate spans, ``dask.compute.progress`` spans, ``transfer``, ``disk-read``
and ``disk-write`` phases under tasks, users' own spans and nested computes. One row per
span, depth first with children in start order (Jaeger's layout): the label is indented
by ``· `` per level, and the bar runs on an axis of seconds since the compute started.
An aggregate span is labelled as what it stands for (``load ×1,234 tasks (aggregate)``),
and its details give the tasks' summed, shortest, mean and longest run times. Task spans
take their prefix's colour from the page's palette (``colour_of``), other spans are grey,
failed spans red, and the compute's critical path is outlined in black. A click on a bar
shows the span's times, status, attributes (those the reader keeps,
:data:`otel_graph.report.otlp_read.KEPT_ATTRIBUTES`) and exception with its stack trace.

Bounds
------
At most :data:`MAX_ROWS` rows a compute (Jaeger's own page slows above about 2,000 spans):
past it the rows kept are the root, the failed spans, the aggregates, the critical path, then
the longest, each with its ancestors so that the tree stays whole. Attribute values are cut
at :data:`MAX_VALUE_CHARS` characters; exception text is kept at length (a stack trace's
last 4,000 characters) until a page holds :data:`MAX_EXCEPTION_CHARS` of it, then short
(:class:`Budget`, one per page).

>>> from otel_graph.report.otlp_read import Span
>>> root = Span("t", "r", "", "dask.compute", 0, 10**9, {"dask.scheduler": "threads"}, 0, {})
>>> load = Span("t", "a", "r", "load", 0, 5 * 10**8, {"dask.task.prefix": "load", "dask.task.count": 1234,
...             "dask.task.aggregate": True, "dask.task.duration.sum": 61.7}, 0, {})
>>> step = Span("t", "u", "r", "user.step", 10**8, 2 * 10**8, {}, 2, {}, "ValueError: no", ("ValueError", "no", ""))
>>> rows = waterfall(Compute(root, [load]), [root, load, step], colour_of={"load": "#1f77b4"})
>>> rows.columns["label"], rows.columns["colour"]
(['dask.compute', '· load ×1,234 tasks (aggregate)', '· user.step'], ['#5f6b7a', '#1f77b4', '#d62728'])
>>> rows.aggregated, rows.shown, rows.total, rows.failed
(1234, 3, 3, 0)
"""

from __future__ import annotations

import heapq
import json
import math
import re
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from otel_graph.report.analysis import COMPUTE, Compute, critical_path, is_aggregate, tasks_in
from otel_graph.report.labels import CRITICAL as PATH
from otel_graph.report.labels import FAILED, seconds
from otel_graph.report.otlp_read import ERROR, Span

MAX_ROWS = 2_000
MAX_VALUE_CHARS = 300
MAX_EXCEPTION_CHARS = 1_000_000
MAX_LIST_ITEMS = 8
LABEL_CHARS = 48
_TOKEN = re.compile(r"[0-9a-f]{12,}")
COMPUTE_GREY, GREY = "#5f6b7a", "#a3a8ae"
_FALLBACK = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")  # no red
_PHASES = frozenset({"transfer", "disk-read", "disk-write"})
_PROGRESS = (("dask.compute.tasks_done", "done"), ("dask.compute.tasks_running", "running"),
             ("dask.compute.tasks_waiting", "waiting"))
_RESOURCE_SHOWN = ("service.name", "host.name", "process.pid", "dask.worker.id")


@dataclass
class Waterfall:
    """One compute's rows, as the columns of the page's data source."""

    compute: Compute
    columns: dict[str, list[Any]]
    shown: int  # rows
    total: int  # spans under the compute's root, the root included
    aggregated: int  # tasks standing in aggregate spans (their dask.task.count summed)
    aggregates: int  # aggregate spans
    failed: int  # failed task spans under the root, shown or not
    x_range: tuple[float, float]


class Budget:
    """Exception text the page holds: at length until :data:`MAX_EXCEPTION_CHARS`, then cut short."""

    def __init__(self) -> None:
        self.left = MAX_EXCEPTION_CHARS

    def cut(self, text: str, limit: int, *, end: bool = False) -> str:
        limit = limit if self.left > 0 else 200
        if len(text) > limit:
            text = "…" + text[1 - limit:] if end else text[:limit - 1] + "…"
        self.left -= len(text)
        return text


def waterfall(compute: Compute, trace: Iterable[Span], *, colour_of: Mapping[str, str],
              max_rows: int = MAX_ROWS) -> Waterfall:
    """The rows of ``compute``'s spans found in ``trace`` (its trace's spans), at most ``max_rows``."""
    return rows_of(compute, tree_of(compute.root, children_of(trace)), colour_of=colour_of, max_rows=max_rows,
                      budget=Budget())


def children_of(trace: Iterable[Span]) -> dict[str, list[Span]]:
    """Each span id's child spans, in start order."""
    children: dict[str, list[Span]] = {}
    for span in trace:
        children.setdefault(span.parent_id, []).append(span)
    for spans in children.values():
        spans.sort(key=lambda s: (s.start_ns, s.span_id))
    return children


def tree_of(root: Span, children: Mapping[str, list[Span]]) -> list[tuple[Span, int]]:
    """(span, depth) depth first from ``root``; a span met again (malformed ids, a cycle) is left out."""
    rows: list[tuple[Span, int]] = []
    seen: set[str] = set()
    stack = [(root, 0)]
    while stack:
        span, depth = stack.pop()
        if span.span_id in seen:
            continue
        seen.add(span.span_id)
        rows.append((span, depth))
        stack.extend((child, depth + 1) for child in reversed(children.get(span.span_id, ())))
    return rows


def _kept(tree: list[tuple[Span, int]], on_path: set[str], max_rows: int) -> list[tuple[Span, int]]:
    """At most ``max_rows`` of the tree: root, failed, aggregates, critical path, longest; ancestors with each."""
    if len(tree) <= max_rows:
        return tree
    parent = {span.span_id: span.parent_id for span, _ in tree}
    keep: set[str] = set()

    def add(span_id: str) -> None:
        chain: list[str] = []
        while span_id in parent and span_id not in keep and span_id not in chain:
            chain.append(span_id)
            span_id = parent[span_id]
        if len(keep) + len(chain) <= max_rows:
            keep.update(chain)

    spans = [span for span, _ in tree]
    for group in ([spans[0]], (s for s in spans if s.failed), (s for s in spans if is_aggregate(s)),
                  (s for s in spans if s.span_id in on_path),
                  heapq.nlargest(max_rows, spans, key=lambda s: s.duration_ns)):
        for span in group:
            if len(keep) >= max_rows:
                break
            add(span.span_id)
    return [(span, depth) for span, depth in tree if span.span_id in keep]


def rows_of(compute: Compute, tree: list[tuple[Span, int]], *, colour_of: Mapping[str, str], max_rows: int,
            budget: Budget, where: Callable[[Span], str] | None = None) -> Waterfall:
    """The rows of ``tree``; ``where`` names the worker thread a task span ran on (the page's lane names)."""
    on_path = {step.span.span_id for step in critical_path(compute).steps}
    kept = _kept(tree, on_path, max(1, max_rows))
    origin = compute.root.start_ns
    low = min(0.0, min((span.start_ns - origin) / 1e9 for span, _ in kept))
    high = max(compute.wall_ns / 1e9, max((span.end_ns - origin) / 1e9 for span, _ in kept))
    least = max(high - low, 1e-6) / 300  # the narrowest bar drawn: a 1 µs task stays visible, and clickable
    columns: dict[str, list[Any]] = {}
    for index, (span, depth) in enumerate(kept):
        start, path = (span.start_ns - origin) / 1e9, span.span_id in on_path
        kind, note = _what(span, path)
        kind_of_error, message, stack = span.exception or ("", "", "")
        said = span.status_message  # otel_graph's is the exception's "type: message", cut: not said twice
        said = "" if (kind_of_error or message) and f"{kind_of_error}: {message}".startswith(said) else said
        right = max((span.end_ns - origin) / 1e9, start + least)
        row = {"row": index, "left": round(start, 6), "right": round(right, 6),
               "label": cut("· " * min(depth, 12) + _label(span), LABEL_CHARS), "name": cut(span.name, 200),
               "what": kind, "start": _signed(start), "duration": seconds(span.duration_ns / 1e9),
               "status": {ERROR: "ERROR", 1: "OK"}.get(span.status_code, "unset"),
               "message": budget.cut(said, 1000), "colour": _colour(span, colour_of),
               "alpha": 0.5 if is_aggregate(span) else 0.9, "line": PATH if path else None,
               "line_width": 2 if path else 0, "attrs": _attributes(span), "note": note,
               "exc_type": cut(kind_of_error, 200), "exc_message": budget.cut(message, 1000),
               "exc_stack": budget.cut(stack, 4000, end=True),
               "where": where(span) if where is not None and "dask.task.prefix" in span.attributes else ""}
        for name, value in row.items():
            columns.setdefault(name, []).append(value)
    aggregates = [span for span in compute.tasks if is_aggregate(span)]
    pad = max(high - low, 1e-6) / 100  # a compute of no length still has an axis to draw on
    failed_tasks = sum(1 for span, _ in tree if span.failed and "dask.task.prefix" in span.attributes)
    return Waterfall(compute, columns, len(kept), len(tree), sum(tasks_in(s) for s in aggregates), len(aggregates),
                     failed_tasks, (round(low - pad, 6), round(high + pad, 6)))


def _colour(span: Span, colour_of: Mapping[str, str]) -> str:
    """Red if it failed; a task's prefix's colour on the page; grey for any other span."""
    if span.failed:
        return FAILED
    if span.name == COMPUTE:
        return COMPUTE_GREY
    if "dask.task.prefix" not in span.attributes:
        return GREY
    prefix = str(span.attributes["dask.task.prefix"])
    return colour_of.get(prefix) or _FALLBACK[zlib.crc32(prefix.encode("utf-8", "replace")) % len(_FALLBACK)]


def _label(span: Span) -> str:
    attributes = span.attributes
    if is_aggregate(span):
        kind = "recovered" if attributes.get("dask.task.recovered") else "aggregate"
        return f"{attributes.get('dask.task.prefix', span.name)} ×{tasks_in(span):,} tasks ({kind})"
    # Tokens are 32 hex digits: six tell tasks apart in one compute, and leave room for the rest.
    return _TOKEN.sub(lambda match: match.group()[:6] + "…", str(attributes.get("dask.task.key", span.name)))


def _what(span: Span, on_path: bool) -> tuple[str, str]:
    """What kind of span it is, and a sentence on what it stands for."""
    a = span.attributes
    if is_aggregate(span):
        count = tasks_in(span)
        total = _seconds(a.get("dask.task.duration.sum")) or 0.0
        mean = _seconds(a.get("dask.task.duration.mean"))
        times = [f"{label} {seconds(value)}" for label, value in (
            ("shortest", _seconds(a.get("dask.task.duration.min"))),
            ("mean", total / count if mean is None and count else mean),
            ("longest", _seconds(a.get("dask.task.duration.max")))) if value is not None]
        why = ("whose spans a lost worker took with it, rebuilt from the scheduler's records"
               if a.get("dask.task.recovered") else "past the span budget (OTEL_GRAPH_MAX_TASK_SPANS)")
        return ("aggregate", f"Stands for {count:,} {a.get('dask.task.prefix', span.name)} tasks {why}, from the "
                f"first's start to the last's end: run times summed {seconds(total)}"
                + "".join(f", {time}" for time in times) + ".")
    if "dask.task.prefix" in a:
        return "task", "On the compute's critical path." if on_path else ""
    if span.name == COMPUTE:
        return "compute", ""
    if span.name == "dask.compute.progress":
        counts = [f"{a[name]:,} {state}" for name, state in _PROGRESS if isinstance(a.get(name), int)]
        return "progress", f"At its end: {', '.join(counts)}." if counts else ""
    if span.name in _PHASES and "dask.task.key" in a:
        return "phase of a task", ""
    return ("distributed span" if "dask.span.id" in a else "span"), ""


def _attributes(span: Span) -> list[str]:
    """The span's attributes and its process's, flattened: key, value, key, value..."""
    flat: list[str] = []
    for key, value in sorted(span.attributes.items()):
        flat += [cut(key, 100), _value(value)]
    for key in _RESOURCE_SHOWN:
        if key in span.resource:
            flat += [f"resource {key}", cut(str(span.resource[key]), MAX_VALUE_CHARS)]
    return flat


def _value(value: Any) -> str:
    if isinstance(value, list):
        items = [v if isinstance(v, str) else json.dumps(v) for v in value[:MAX_LIST_ITEMS]]
        more = len(value) - MAX_LIST_ITEMS
        text = ", ".join(items) + (f", … ({more:,} more)" if more > 0 else "")
    elif isinstance(value, float):
        text = f"{value:.6g}"
    else:
        text = value if isinstance(value, str) else json.dumps(value)
    return cut(text, MAX_VALUE_CHARS)


def _seconds(value: Any) -> float | None:
    """A duration attribute's seconds; None if it is missing or not a number (it is only shown)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value) if -1e300 < value < 1e300 else math.inf  # an int past a float's range
    return number if math.isfinite(number) and number >= 0 else None


def cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _signed(value: float) -> str:
    return ("-" if value < 0 else "+") + seconds(abs(value))
