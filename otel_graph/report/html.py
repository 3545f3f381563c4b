"""``otel-graph report --html FILE``: one self-contained, offline HTML page, drawn with Bokeh.

Bokeh is what dask's own diagnostics plot with; it is an optional dependency
(``pip install 'otel-graph[report]'``), imported only when a page is written. The page holds,
on one time axis (zoom one plot, all follow):

* the **task stream** and the **readings** (:mod:`.plots`): a lane per worker thread, a bar per
  task in its prefix's colour, the critical path outlined and on a track of its own; CPU,
  memory and GPU per process; results held in memory;
* the **bottleneck table**, one row per task prefix in the same colours, sortable by any column,
  times and sizes written for people (``12.3 ms``, ``16.0 MiB``) and sorted as numbers;
* the **trace browser** (:mod:`.waterfall`): pick a compute, see its spans as Jaeger shows a
  trace, click one for its attributes and exception.

Names are people's (:mod:`.labels`): ``worker 0 (127.0.0.1:35689) · thread 1``, ``pid 4242``,
never a thread ident or an instance UUID. Bokeh's JavaScript is inlined
(``resources=INLINE``), so the file opens with no network. The page is created readable by
its owner only, and a symlink at its path is replaced, not followed
(:func:`otel_graph.report.private_files.private_file`).
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from otel_graph.report.analysis import is_aggregate, prefix_table, tasks_in
from otel_graph.report.labels import Labeller, Palette, seconds, size
from otel_graph.report.plots import readings, task_stream
from otel_graph.report.private_files import private_file
from otel_graph.report.waterfall import trace_browser


def _bokeh() -> Any:
    try:
        import bokeh  # noqa: F401
    except ImportError:
        raise SystemExit("otel-graph: --html needs Bokeh: pip install 'otel-graph[report]'") from None
    import bokeh.embed
    import bokeh.resources

    return bokeh


def write_html(loaded: Any, path: Path) -> None:
    bokeh = _bokeh()
    from bokeh.layouts import column

    computes = loaded.computes
    rows = prefix_table(computes, loaded.points)
    palette = Palette(row.prefix for row in rows)
    labeller = Labeller([*(s.resource for c in computes for s in c.tasks), *(p.resource for p in loaded.points)])
    origin = min([c.root.start_ns for c in computes] or [p.time_ns for p in loaded.points] or [0])
    stream, left_out = task_stream(computes, origin=origin, palette=palette, labeller=labeller)
    parts: list[Any] = [_summary(loaded, left_out), stream,
                        *readings(loaded.points, origin=origin, x_range=stream.x_range, labeller=labeller),
                        _table(rows, palette), trace_browser(loaded, colour_of=palette.as_dict(),
                                      where=lambda span: labeller.lane(span.attributes, span.resource))]
    page = bokeh.embed.file_html(column(*parts, sizing_mode="stretch_width"), resources=bokeh.resources.INLINE,
                                 title="otel-graph report")
    with private_file(path) as out:  # OSError: reported by the command as one line
        out.write(page)


def _table(rows: list[Any], palette: Palette) -> Any:
    """The bottleneck table: numbers sort as numbers, and show as text a person reads."""
    from bokeh.models import ColumnDataSource
    from bokeh.models.widgets import DataTable, TableColumn
    from bokeh.models.widgets.tables import HTMLTemplateFormatter, NumberFormatter

    def shown(text_field: str) -> HTMLTemplateFormatter:
        return HTMLTemplateFormatter(template=f"<%= {text_field} %>")

    source = ColumnDataSource({
        "prefix": [r.prefix for r in rows],
        # Keys are user data: escaped here, as the template inserts it as HTML.
        "prefix_html": [f'<span style="color:{palette[r.prefix]}">&#9632;</span> {html.escape(r.prefix)}'
                        for r in rows],
        "duration": [r.duration_s for r in rows], "duration_text": [seconds(r.duration_s) for r in rows],
        "share": [r.share for r in rows], "tasks": [r.tasks for r in rows],
        "mean": [r.mean_s for r in rows], "mean_text": [seconds(r.mean_s) for r in rows],
        "bytes": [r.mean_bytes for r in rows],
        "bytes_text": [size(r.mean_bytes) if r.mean_bytes else "-" for r in rows],
        "errors": [r.errors for r in rows],
    })
    columns = [
        TableColumn(field="prefix", title="task prefix", formatter=shown("prefix_html"), width=260),
        TableColumn(field="duration", title="time in tasks", formatter=shown("duration_text")),
        TableColumn(field="share", title="share", formatter=NumberFormatter(format="0.0%")),
        TableColumn(field="tasks", title="tasks", formatter=NumberFormatter(format="0,0")),
        TableColumn(field="mean", title="mean task", formatter=shown("mean_text")),
        TableColumn(field="bytes", title="mean output", formatter=shown("bytes_text")),
        TableColumn(field="errors", title="errors", formatter=NumberFormatter(format="0,0")),
    ]
    return DataTable(source=source, columns=columns, sortable=True, index_position=None,
                     sizing_mode="stretch_width", height=30 + 26 * min(len(rows), 20))


def _summary(loaded: Any, left_out: int) -> Any:
    from bokeh.models.widgets import Div

    computes = loaded.computes
    tasks = sum(c.task_count for c in computes)
    aggregated = sum(tasks_in(s) for c in computes for s in c.tasks if is_aggregate(s))
    failed = sum(1 for c in computes if c.root.failed)
    wall = sum(c.wall_ns for c in computes) / 1e9
    notes = []
    if aggregated:
        notes.append(f"{aggregated:,} tasks were folded into aggregate spans by the span budget "
                     f"(OTEL_GRAPH_MAX_TASK_SPANS): the table counts them, the task stream does not draw them")
    if left_out:
        notes.append(f"the task stream draws the {tasks - aggregated - left_out:,} longest tasks, not "
                     f"{left_out:,} shorter ones")
    text = (f"<h2>otel-graph report</h2><p>{len(computes):,} computes, {tasks:,} tasks, {failed:,} failed, "
            f"{seconds(wall)} of computing in all.</p>")
    if notes:
        text += "<p>" + "; ".join(notes) + ".</p>"
    return Div(text=text, sizing_mode="stretch_width")
