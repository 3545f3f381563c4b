"""``otel-graph report --html FILE``: one self-contained, offline HTML page, drawn with Bokeh.

Bokeh is what dask's own diagnostics plot with; it is an optional dependency
(``pip install 'otel-graph[report]'``), imported only here. The page holds:

* a **task stream**: one lane per worker thread, a bar per task coloured by prefix,
  hover showing key, prefix, duration and output size, the critical path of the
  longest compute outlined in red;
* **CPU, memory and GPU** readings over time, per process;
* **tasks and bytes held in memory** over time (the CacheProfiler view; on a cluster,
  the memory each worker manages);
* the bottleneck table.

Bokeh's JavaScript is inlined (``resources=INLINE``), so the file opens with no network.
At most :data:`MAX_BARS` task bars are drawn (the longest), so a huge trace still
makes a page a browser can open. The page is created readable by its owner only, and
a symlink at its path is replaced, not followed (:func:`otel_graph.report.private_files.private_file`).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from otel_graph.report.analysis import critical_path, prefix_table
from otel_graph.report.otlp_read import Point
from otel_graph.report.private_files import private_file

MAX_BARS = 50_000


def _bokeh() -> Any:
    try:
        import bokeh  # noqa: F401
    except ImportError:
        raise SystemExit("otel-graph: --html needs Bokeh: pip install 'otel-graph[report]'") from None
    import bokeh.embed
    import bokeh.layouts
    import bokeh.models
    import bokeh.palettes
    import bokeh.plotting
    import bokeh.resources

    return bokeh


def write_html(loaded: Any, path: Path) -> None:
    bokeh = _bokeh()
    from bokeh.layouts import column
    from bokeh.models import ColumnDataSource, FactorRange, HoverTool
    from bokeh.models.widgets import DataTable, Div, TableColumn
    from bokeh.plotting import figure

    computes = loaded.computes
    spans = [s for c in computes for s in c.tasks if "dask.task.count" not in s.attributes]
    spans.sort(key=lambda s: s.duration_ns, reverse=True)
    shown = spans[:MAX_BARS]
    origin = min([c.root.start_ns for c in computes] or [p.time_ns for p in loaded.points] or [0])
    longest = max(computes, key=lambda c: c.wall_ns, default=None)
    on_path = {step.span.span_id for step in critical_path(longest).steps} if longest else set()

    prefixes = sorted({str(s.attributes.get("dask.task.prefix", s.name)) for s in shown})
    palette = bokeh.palettes.Category20[20]
    colour = {p: palette[i % len(palette)] for i, p in enumerate(prefixes)}
    lanes = sorted({_lane(s) for s in shown})
    data: dict[str, list[Any]] = defaultdict(list)
    for span in shown:
        prefix = str(span.attributes.get("dask.task.prefix", span.name))
        data["left"].append((span.start_ns - origin) / 1e9)
        data["right"].append((span.end_ns - origin) / 1e9)
        data["lane"].append(_lane(span))
        data["prefix"].append(prefix)
        data["key"].append(str(span.attributes.get("dask.task.key", "")))
        data["duration"].append(f"{span.duration_ns / 1e6:.3f} ms")
        nbytes = span.attributes.get("dask.task.nbytes")
        data["nbytes"].append(f"{nbytes} B" if isinstance(nbytes, int) else "-")
        data["colour"].append("#d62728" if span.failed else colour[prefix])
        critical = span.span_id in on_path
        data["line"].append("red" if critical else None)
        data["width"].append(3 if critical else 0)
    if not shown:  # an empty source would make Bokeh log errors in the browser
        data = {name: [] for name in ("left", "right", "lane", "prefix", "key", "duration", "nbytes", "colour",
                                      "line", "width")}
    stream = figure(title="Task stream (bars outlined in red: critical path of the longest compute)",
                    y_range=FactorRange(factors=lanes or ["-"]), x_axis_label="seconds since the first compute started",
                    height=max(250, 22 * len(lanes) + 120), sizing_mode="stretch_width",
                    tools="xpan,xwheel_zoom,box_zoom,reset,save")
    stream.hbar(y="lane", left="left", right="right", height=0.8, fill_color="colour", line_color="line",
                line_width="width", source=ColumnDataSource(data), legend_field="prefix")
    stream.add_tools(HoverTool(tooltips=[("key", "@key"), ("prefix", "@prefix"), ("duration", "@duration"),
                                         ("output", "@nbytes")]))
    stream.legend.click_policy = "hide"
    stream.legend.location = "top_right"

    parts: list[Any] = [Div(text=_summary(loaded, len(spans), len(shown))), stream]
    for title, names, unit in (
        ("CPU", ("process.cpu.utilization", "system.cpu.utilization"), "fraction of CPUs"),
        ("Memory", ("process.memory.usage",), "bytes"),
        ("GPU", ("hw.gpu.utilization", "hw.gpu.memory.usage"), "fraction / bytes"),
        ("Held in memory", ("dask.memory.tasks", "dask.memory.usage", "dask.worker.memory.usage"),
         "tasks / bytes"),
    ):
        plot = _lines(figure, loaded.points, names, origin, title=title, unit=unit, x_range=stream.x_range)
        if plot is not None:
            parts.append(plot)
    rows = prefix_table(computes, loaded.points)
    table = ColumnDataSource({
        "prefix": [r.prefix for r in rows], "duration": [round(r.duration_s, 6) for r in rows],
        "share": [round(100 * r.share, 1) for r in rows], "tasks": [r.tasks for r in rows],
        "mean": [round(r.mean_s, 6) for r in rows], "bytes": [round(r.mean_bytes) for r in rows],
        "errors": [r.errors for r in rows],
    })
    parts.append(DataTable(source=table, sizing_mode="stretch_width", height=30 + 25 * min(len(rows), 20), columns=[
        TableColumn(field="prefix", title="prefix"), TableColumn(field="duration", title="duration (s)"),
        TableColumn(field="share", title="% of total"), TableColumn(field="tasks", title="tasks"),
        TableColumn(field="mean", title="mean (s)"), TableColumn(field="bytes", title="mean output (B)"),
        TableColumn(field="errors", title="errors")]))
    html = bokeh.embed.file_html(column(*parts, sizing_mode="stretch_width"), resources=bokeh.resources.INLINE,
                                 title="otel-graph report")
    with private_file(path) as out:  # OSError: reported by the command as one line
        out.write(html)


def _lane(span: Any) -> str:
    worker = span.attributes.get("dask.worker.id", "?")
    thread = span.attributes.get("thread.id")
    return f"{worker} / {thread}" if thread is not None and str(thread) != str(worker) else str(worker)


def _lines(figure: Any, points: list[Point], names: tuple[str, ...], origin: int, *, title: str, unit: str,
           x_range: Any) -> Any:
    series: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for point in points:
        if point.name not in names:
            continue
        who = point.resource.get("dask.worker.id") or point.resource.get("service.instance.id", "")[:8]
        detail = ",".join(f"{v}" for k, v in sorted(point.attributes.items())
                          if k in ("cpu.mode", "hw.id", "dask.memory.state", "dask.worker.id"))
        series[f"{point.name} {who} {detail}".strip()].append(((point.time_ns - origin) / 1e9, point.value))
    if not series:
        return None
    import bokeh.palettes

    plot = figure(title=title, height=220, sizing_mode="stretch_width", x_range=x_range,
                  y_axis_label=unit, tools="xpan,xwheel_zoom,box_zoom,reset,save")
    palette = bokeh.palettes.Category10[10]
    for index, (label, values) in enumerate(sorted(series.items())):
        values.sort()
        plot.line([x for x, _ in values], [y for _, y in values], legend_label=label[:60],
                  color=palette[index % len(palette)], line_width=2)
    plot.legend.click_policy = "hide"
    plot.legend.label_text_font_size = "8pt"
    return plot


def _summary(loaded: Any, tasks: int, shown: int) -> str:
    computes = loaded.computes
    count = sum(c.task_count for c in computes)
    note = f" (the {shown} longest of {tasks} task spans drawn)" if shown < tasks else ""
    return (f"<h2>otel-graph report</h2><p>{len(computes)} computes, {count} tasks, "
            f"{sum(1 for c in computes if c.root.failed)} failed{note}.</p>")
