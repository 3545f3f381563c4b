"""The report's time plots, drawn with Bokeh: the task stream and the readings under it.

Every plot shares one time axis, in seconds since the first compute started: zoom or pan
one and all follow. Legends sit outside the plots, to their right, so that they never
cover a bar or a line; every axis says its unit.

* :func:`task_stream`: a lane per worker thread (named by :class:`~.labels.Labeller`), a
  bar per task in its prefix's colour (:class:`~.labels.Palette`), failed tasks red. The
  critical path of the longest compute is drawn twice so that it stands out on any
  palette: outlined in black in its lanes, and alone on a track of its own at the top.
  At most :data:`MAX_BARS` bars (the longest tasks), so a huge trace stays a page a
  browser opens.
* :func:`readings`: CPU, memory and GPU readings per process, and the results held in
  memory, as steps (a reading holds until the next one: a line between two readings a
  second apart would draw a slope that nothing measured).

Bokeh is imported inside the functions: it is the ``report`` extra's.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from otel_graph.report.analysis import Compute, critical_path, is_aggregate
from otel_graph.report.labels import COLOURS, CRITICAL, FAILED, Labeller, Palette, seconds, size
from otel_graph.report.otlp_read import Point, Span

MAX_BARS = 50_000
#: Prefixes named in the task stream's legend (most time first): one per colour; the table lists them all.
LEGEND_PREFIXES = len(COLOURS)
CRITICAL_TRACK = "critical path (longest compute)"
TIME_AXIS = "seconds since the first compute started"
_TOOLS = "xpan,xwheel_zoom,box_zoom,reset,save"


def prefix_of(span: Span) -> str:
    return str(span.attributes.get("dask.task.prefix", span.name))


def task_stream(computes: Sequence[Compute], *, origin: int, palette: Palette, labeller: Labeller) -> tuple[Any, int]:
    """The task stream figure, and how many task spans it leaves out past :data:`MAX_BARS`."""
    from bokeh.models import ColumnDataSource, FactorRange, HoverTool
    from bokeh.models.annotations.legends import Legend, LegendItem
    from bokeh.plotting import figure

    spans = [s for c in computes for s in c.tasks if not is_aggregate(s)]
    longest = max(computes, key=lambda c: c.wall_ns, default=None)
    on_path = {step.span.span_id for step in critical_path(longest).steps} if longest else set()
    # The critical path is always drawn, short tasks and all; the longest of the rest fill the bars.
    rest = sorted((s for s in spans if s.span_id not in on_path), key=lambda s: s.duration_ns, reverse=True)
    shown = [s for s in spans if s.span_id in on_path] + rest[:max(MAX_BARS - len(on_path), 0)]
    shown.sort(key=lambda s: s.start_ns)  # lanes numbered in the order threads first ran

    data: dict[str, list[Any]] = defaultdict(list)
    first_row: dict[str, int] = {}  # a row per prefix whose glyph the legend shows: a plain one where there is
    plain_row: dict[str, int] = {}

    def bar(span: Span, lane: str, *, critical: bool) -> None:
        prefix = prefix_of(span)
        first_row.setdefault(prefix, len(data["lane"]))
        if not (critical or span.failed):
            plain_row.setdefault(prefix, len(data["lane"]))
        nbytes = span.attributes.get("dask.task.nbytes")
        data["left"].append((span.start_ns - origin) / 1e9)
        data["right"].append((span.end_ns - origin) / 1e9)
        data["lane"].append(lane)
        data["prefix"].append(prefix)
        data["key"].append(str(span.attributes.get("dask.task.key", "")))
        data["duration"].append(seconds(span.duration_ns / 1e9))
        data["nbytes"].append(size(nbytes) if isinstance(nbytes, int) else "-")
        data["fill"].append(FAILED if span.failed else palette[prefix])
        data["line"].append(CRITICAL if critical else "#ffffff")
        data["width"].append(2.5 if critical else 0.5)

    lanes: set[str] = set()
    for span in shown:
        lane = labeller.lane(span.attributes, span.resource)
        lanes.add(lane)
        bar(span, lane, critical=span.span_id in on_path)
    for span in shown:
        if span.span_id in on_path:
            bar(span, CRITICAL_TRACK, critical=True)
    # A categorical axis stacks its factors from the bottom: the critical track goes on top,
    # then each process's threads in order, read downwards.
    factors = sorted(lanes, key=_lane_order, reverse=True) + ([CRITICAL_TRACK] if on_path else [])
    legend_rows = min(len(first_row), LEGEND_PREFIXES + 1)
    plot = figure(title="Task stream: a lane per worker thread; black outline and top track: the critical path",
                  y_range=FactorRange(factors=factors or ["-"]), x_axis_label=TIME_AXIS,
                  height=max(260, 24 * len(factors) + 130, _legend_height(legend_rows)), sizing_mode="stretch_width",
                  tools=_TOOLS)
    if not data:  # an empty source would make Bokeh log errors in the browser
        data = {name: [] for name in ("left", "right", "lane", "prefix", "key", "duration", "nbytes", "fill",
                                      "line", "width")}
    bars: Any = plot.hbar(y="lane", left="left", right="right", height=0.8, fill_color="fill", line_color="line",
                     line_width="width", source=ColumnDataSource(data))
    plot.add_tools(HoverTool(renderers=[bars], tooltips=[("key", "@key"), ("prefix", "@prefix"),
                                                         ("duration", "@duration"), ("output", "@nbytes")]))
    named = sorted(first_row, key=palette.rank)[:LEGEND_PREFIXES]
    items = [LegendItem(label=p, renderers=[bars], index=plain_row.get(p, first_row[p])) for p in named]
    if len(first_row) > len(named):
        items.append(LegendItem(label=f"(+{len(first_row) - len(named)} more in the table)", renderers=[]))
    plot.add_layout(Legend(items=items, label_text_font_size="9pt"), "right")
    return plot, len(spans) - len(shown)


def _legend_height(items: int) -> int:
    """A plot tall enough that its legend, beside it, is not cut off."""
    return 22 * items + 70


def _lane_order(lane: str) -> tuple[list[tuple[int, Any]], int]:
    """Processes in natural order (worker 2 before worker 10), then their threads 0, 1, …"""
    process, _, thread = lane.rpartition(" · thread ")
    natural = [(0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", process) if part]
    return natural, int(thread) if thread.isdigit() else -1


#: (title, y axis label, tick format, metric names)
_READINGS = (
    ("CPU", "busy share of all CPUs", "0%", ("process.cpu.utilization", "system.cpu.utilization")),
    ("Memory (resident)", "bytes", "0.0 d", ("process.memory.usage",)),
    ("GPU utilization", "busy share of the GPU", "0%", ("hw.gpu.utilization",)),
    ("GPU memory", "bytes", "0.0 d", ("hw.gpu.memory.usage",)),
    ("Results held in memory", "bytes", "0.0 d", ("dask.memory.usage", "dask.worker.memory.usage")),
)


def readings(points: Sequence[Point], *, origin: int, x_range: Any, labeller: Labeller) -> list[Any]:
    """A plot per kind of reading there is data for, on ``x_range``."""
    plots = []
    for title, unit, ticks, names in _READINGS:
        series = _series(points, names, origin, labeller)
        if series:
            plots.append(_steps(series, title=title, unit=unit, ticks=ticks, x_range=x_range))
    return plots


def _series(points: Sequence[Point], names: tuple[str, ...], origin: int,
            labeller: Labeller) -> dict[str, dict[float, float]]:
    """label -> {seconds: value}; values of one series at one time (CPU modes) are summed."""
    series: dict[str, dict[float, float]] = defaultdict(lambda: defaultdict(float))
    for point in points:
        if point.name not in names:
            continue
        attributes = point.attributes
        if point.name == "system.cpu.utilization":
            if attributes.get("cpu.mode") in ("idle", "iowait", "steal"):
                continue
            host = point.resource.get("host.name")
            label = f"machine {host}" if labeller.with_host and host else "machine"
        elif point.name == "hw.gpu.utilization" or point.name == "hw.gpu.memory.usage":
            label = labeller.gpu(attributes, point.resource)
        elif point.name == "dask.worker.memory.usage":
            if attributes.get("dask.memory.state") != "managed":  # unmanaged is not results; spilled, not memory
                continue
            label = labeller.process(attributes, {})
        else:
            label = labeller.process({}, point.resource)
        series[label][(point.time_ns - origin) / 1e9] += point.value
    # A series of zeros says nothing and takes a legend row: a worker's own local-scheduler
    # gauges, say, where its tasks ran on the cluster.
    return {label: values for label, values in series.items() if any(values.values())}


def _steps(series: dict[str, dict[float, float]], *, title: str, unit: str, ticks: str, x_range: Any) -> Any:
    from bokeh.models import NumeralTickFormatter
    from bokeh.models.annotations.legends import Legend, LegendItem
    from bokeh.plotting import figure

    plot = figure(title=title, height=max(220, _legend_height(len(series))), sizing_mode="stretch_width",
                  x_range=x_range, x_axis_label=TIME_AXIS, y_axis_label=unit, tools=_TOOLS)
    plot.yaxis.formatter = NumeralTickFormatter(format=ticks)
    items = []
    for index, (label, values) in enumerate(sorted(series.items())):
        times = sorted(values)
        colour = COLOURS[index % len(COLOURS)]
        line: Any = plot.step(times, [values[t] for t in times], mode="after", color=colour, line_width=2)
        items.append(LegendItem(label=label[:60], renderers=[line]))
    legend = Legend(items=items, click_policy="hide", label_text_font_size="9pt")
    plot.add_layout(legend, "right")
    return plot
