"""The trace browser: a compute's spans as a waterfall in the HTML report, for people without Jaeger.

:func:`trace_browser` returns a Bokeh layout that :mod:`otel_graph.report.html` puts on its
page: a Select listing the computes, the chosen compute's spans as a waterfall (the rows of
:mod:`otel_graph.report.trace_rows`), and a details panel that a click on a bar fills. Bokeh
is imported inside the function that draws, as in the rest of the report.

Staying small and fast
----------------------
The rows of every listed compute are in the page (switching computes is a swap in the
browser), so what is embedded is bounded, and the page says what it left out: at most
:data:`~otel_graph.report.trace_rows.MAX_ROWS` rows per compute ("2,000 of 100,001 spans
shown"); at most :data:`MAX_PAGE_ROWS` rows in all, shared evenly (a compute needing fewer
than its share leaves the rest to the others); at most :data:`MAX_COMPUTES` computes
listed, the longest, plus the failed ones up to as many again.

Untrusted text
--------------
Names, keys, attribute values and exception messages come from the telemetry. HTML made
in Python (the summaries) escapes them with :func:`html.escape`; the details panel is made
in the browser from the span's data columns, every value passed through an escaping
function. Select options and hover tooltips are text to Bokeh, never HTML.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence
from html import escape
from typing import Any, Protocol

from otel_graph.report.analysis import Compute
from otel_graph.report.labels import seconds
from otel_graph.report.otlp_read import Span
from otel_graph.report.trace_rows import MAX_ROWS, Budget, Waterfall, children_of, cut, rows_of, tree_of

#: Rows in the whole page; computes listed (plus failed ones up to as many).
MAX_PAGE_ROWS = 10_000
MAX_COMPUTES = 200
#: Rows in view at once; the mouse wheel scrolls through the rest.
VISIBLE_ROWS = 30


class Traced(Protocol):
    """What the browser reads of :class:`otel_graph.report.text.Loaded` (not imported: ``text``
    imports the page, which imports this module)."""

    @property
    def computes(self) -> Sequence[Compute]: ...

    @property
    def traces(self) -> Mapping[str, Sequence[Span]]: ...


def _failed(compute: Compute) -> bool:
    return compute.root.failed or any(span.failed for span in compute.tasks)


def _listed(computes: Sequence[Compute], most: int) -> tuple[list[tuple[int, Compute]], str]:
    """The computes listed, numbered in start order from 1, and what the page says of those left out."""
    numbered = list(enumerate(computes, 1))
    if len(numbered) <= most:
        return numbered, ""
    failed = [(n, c) for n, c in numbered if _failed(c)][:most]
    chosen = dict(heapq.nlargest(most, numbered, key=lambda nc: nc[1].wall_ns)) | dict(failed)
    note = (f" Listed: {len(chosen):,} of the {len(computes):,} computes, the {most:,} longest and {len(failed):,} "
            "failed ones, to keep the page small.")
    return sorted(chosen.items(), key=lambda nc: nc[0]), note


def _shares(sizes: Sequence[int], total: int, cap: int) -> list[int]:
    """Rows for each compute: at most ``cap`` and its size, ``total`` in all, shared evenly."""
    shares = [0] * len(sizes)
    left = total
    for done, index in enumerate(sorted(range(len(sizes)), key=sizes.__getitem__)):
        shares[index] = max(1, min(sizes[index], cap, left // (len(sizes) - done)))
        left -= shares[index]
    return shares


def _title(number: int, rows: Waterfall) -> str:
    """The Select's text for a compute (text, not HTML)."""
    compute = rows.compute
    scheduler = compute.root.attributes.get("dask.scheduler")
    parts = [f"#{number} {compute.root.name}" + (" (incomplete)" if compute.incomplete else ""),
             *([cut(str(scheduler), 40)] if scheduler else []), seconds(compute.wall_ns / 1e9),
             f"{compute.task_count:,} tasks", *([f"{rows.failed:,} failed"] if rows.failed else [])]
    return " · ".join(parts)


def _summary(number: int, rows: Waterfall) -> str:
    """What the waterfall of a compute shows and leaves out, as HTML."""
    text = f"<b>{escape(_title(number, rows))}</b>. "
    if rows.shown < rows.total:
        text += (f"{rows.shown:,} of {rows.total:,} spans shown: the root, the failed spans, the aggregates, the "
                 "critical path and then the longest, to keep the page small. ")
    else:
        text += f"{rows.total:,} spans. "
    if rows.aggregated:
        text += (f"{rows.aggregated:,} of its {rows.compute.task_count:,} tasks have no span of their own: they "
                 f"are in {rows.aggregates:,} aggregate span{'s' if rows.aggregates > 1 else ''}. ")
    return f"<p>{text}Scroll with the mouse wheel; click a bar for its span's details.</p>"


_HINT = "<p><i>Click a bar: the span's times, status, attributes and exception show here.</i></p>"

# The details of the selected span, made from its data columns, every value escaped.
_DETAILS_JS = """
const i = source.selected.indices[0];
if (i == null) { details.text = hint; return; }
const d = source.data;
const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;",
                                                          "'": "&#39;"})[c]);
let html = `<h4 style="margin:4px 0">${esc(d.name[i])} <small>(${esc(d.what[i])})</small></h4>`;
html += `<p>Starts at ${esc(d.start[i])}, lasts ${esc(d.duration[i])}; status ${esc(d.status[i])}`;
html += (d.message[i] ? `: ${esc(d.message[i])}` : "") + "</p>";
if (d.note[i]) html += `<p>${esc(d.note[i])}</p>`;
if (d.where[i]) html += `<p>Ran on ${esc(d.where[i])}.</p>`;
const a = d.attrs[i];
if (a.length) {
  html += '<table style="border-collapse:collapse;font-size:12px">';
  for (let k = 0; k + 1 < a.length; k += 2)
    html += `<tr><th style="text-align:left;padding-right:12px">${esc(a[k])}</th><td>${esc(a[k + 1])}</td></tr>`;
  html += "</table>";
}
if (d.exc_type[i] || d.exc_message[i] || d.exc_stack[i]) {
  html += `<p style="color:#b00">Exception <b>${esc(d.exc_type[i])}</b>: ${esc(d.exc_message[i])}</p>`;
  html += `<pre style="max-height:300px;overflow:auto;background:#f6f6f6;padding:6px">${esc(d.exc_stack[i])}</pre>`;
}
details.text = html;
"""

# A compute chosen: its rows into the data source, its axis ranges, its summary.
_SWITCH_JS = """
if (computes[initial].data == null) computes[initial].data = source.data;
const c = computes[Number(select.value)];
source.selected.indices = [];
source.data = c.data;
ticker.ticks = c.data.row;
x_range.setv({start: c.x[0], end: c.x[1], reset_start: c.x[0], reset_end: c.x[1]});
y_range.setv({start: visible - 0.5, end: -0.5, bounds: [-0.5, Math.max(c.rows, visible) - 0.5]});
summary.text = c.summary;
"""


def trace_browser(loaded: Traced, *, colour_of: Mapping[str, str], where: Callable[[Span], str] | None = None,
                  max_rows: int = MAX_ROWS, max_computes: int = MAX_COMPUTES,
                  max_page_rows: int = MAX_PAGE_ROWS) -> Any:
    """The trace browser's Bokeh layout; its models are named ``trace-browser-*`` (select,
    spans, waterfall, bars, summary, details). ``where`` names a task's worker thread as the
    rest of the page does."""
    from bokeh import models
    from bokeh.layouts import column
    from bokeh.models.widgets import Div, Select
    from bokeh.plotting import figure

    listed, note = _listed(loaded.computes, max_computes)
    intro = ("<h3>Trace browser</h3><p>A compute's spans as a waterfall, as Jaeger draws them: one row per span, "
             "indented under its parent, failed spans in red, the critical path outlined in black, aggregate spans "
             f"labelled with the tasks they stand for.{escape(note)}</p>")
    if not listed:
        empty = Div(text=intro + "<p>No dask.compute spans in these files.</p>", name="trace-browser-title")
        return column(empty, name="trace-browser", sizing_mode="stretch_width")
    children: dict[str, dict[str, list[Span]]] = {}
    trees = []
    for _, compute in listed:
        trace_id = compute.root.trace_id
        if trace_id not in children:
            children[trace_id] = children_of(loaded.traces.get(trace_id) or [compute.root, *compute.tasks])
        trees.append(tree_of(compute.root, children[trace_id]))
    shares, budget = _shares([len(tree) for tree in trees], max_page_rows, max_rows), Budget()
    falls = [rows_of(compute, tree, colour_of=colour_of, max_rows=share, budget=budget, where=where)
             for (_, compute), tree, share in zip(listed, trees, shares, strict=True)]
    del children, trees
    aggregated = sum(rows.aggregated for rows in falls)
    if aggregated:
        intro = intro[:-4] + f" In these computes, {aggregated:,} tasks are in aggregate spans.</p>"
    initial = max(range(len(falls)), key=lambda i: falls[i].compute.wall_ns)  # the longest compute first
    first = falls[initial]
    visible = max(1, min(VISIBLE_ROWS, max(rows.shown for rows in falls)))
    source = models.ColumnDataSource(data=dict(first.columns), name="trace-browser-spans")
    options: list[str | tuple[Any, str]] = [(str(i), cut(_title(number, rows), 160))
                                             for i, ((number, _), rows) in enumerate(zip(listed, falls, strict=True))]
    select = Select(title="Compute", value=str(initial), name="trace-browser-select", options=options)
    summary = Div(text=_summary(listed[initial][0], first), name="trace-browser-summary",
                  sizing_mode="stretch_width")
    details = Div(text=_HINT, name="trace-browser-details", sizing_mode="stretch_width")
    x_range = models.Range1d(start=first.x_range[0], end=first.x_range[1])
    y_range = models.Range1d(start=visible - 0.5, end=-0.5, bounds=(-0.5, max(first.shown, visible) - 0.5))
    plot = figure(name="trace-browser-waterfall", x_range=x_range, y_range=y_range, height=22 * visible + 70,
                  sizing_mode="stretch_width", x_axis_label="seconds since the compute started", tools=[],
                  toolbar_location="right", min_border_left=320)
    bars = plot.hbar(y="row", left="left", right="right", height=0.72, fill_color="colour", fill_alpha="alpha",
                     line_color="line", line_width="line_width", source=source, name="trace-browser-bars",
                     selection_fill_alpha=1.0, nonselection_fill_alpha=0.3, nonselection_line_alpha=0.3)
    wheel = models.WheelPanTool(dimension="height")
    tooltips = [("span", "@name"), ("kind", "@what"), ("starts", "@start"), ("lasts", "@duration"),
                ("status", "@status")]
    plot.add_tools(models.PanTool(), wheel, models.WheelZoomTool(dimensions="width"),
                   models.BoxZoomTool(dimensions="width"), models.ResetTool(), models.TapTool(renderers=[bars]),
                   models.HoverTool(renderers=[bars], tooltips=tooltips))
    plot.toolbar.active_scroll = wheel
    ticker = models.FixedTicker(ticks=list(first.columns["row"]))
    plot.yaxis.ticker = ticker
    plot.yaxis.formatter = models.CustomJSTickFormatter(args={"source": source}, code=(
        "const labels = source.data.label;\n"
        "return Number.isInteger(tick) && tick >= 0 && tick < labels.length ? labels[tick] : '';"))
    plot.yaxis.major_label_text_font_size = "11px"
    plot.yaxis.major_tick_line_color = None
    plot.yaxis.minor_tick_line_color = None
    plot.ygrid.grid_line_color = None
    plot.xaxis.formatter = models.BasicTickFormatter(use_scientific=False)  # 0.002, not 2.000e-3
    source.selected.js_on_change("indices", models.CustomJS(
        args={"source": source, "details": details, "hint": _HINT}, code=_DETAILS_JS))
    computes = [None if i == initial else
                {"data": rows.columns, "x": list(rows.x_range), "rows": rows.shown, "summary": _summary(number, rows)}
                for i, ((number, _), rows) in enumerate(zip(listed, falls, strict=True))]
    computes[initial] = {"data": None, "x": list(first.x_range), "rows": first.shown, "summary": summary.text}
    select.js_on_change("value", models.CustomJS(code=_SWITCH_JS, args={
        "computes": computes, "initial": initial, "select": select, "source": source, "ticker": ticker,
        "x_range": x_range, "y_range": y_range, "visible": visible, "summary": summary}))
    title = Div(text=intro, name="trace-browser-title", sizing_mode="stretch_width")
    return column(title, select, summary, plot, details, name="trace-browser", sizing_mode="stretch_width")
