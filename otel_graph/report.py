"""``otel-graph report``: the text report over OTLP JSON files (and, with ``--html``, the HTML one).

Sections, each from :mod:`otel_graph.analysis`: the per-prefix bottleneck table (DASF's
columns), the slowest tasks, per-worker balance over time, and each compute's critical
path. :func:`load` streams the files once, showing progress on large inputs.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from otel_graph.analysis import (
    Compute,
    CriticalPath,
    critical_path,
    describe_tasks,
    group_computes,
    prefix_table,
    slowest_tasks,
    worker_balance,
)
from otel_graph.otlp_read import Point, Progress, TelemetryFile

#: Computes whose critical path is printed (the longest first).
PATHS_SHOWN = 3
PATH_STEPS_SHOWN = 12


@dataclass
class Loaded:
    computes: list[Compute]
    points: list[Point]


def write_html(loaded: Loaded, path: Path) -> None:
    from otel_graph.html_report import write_html as write

    write(loaded, path)


def load(paths: Sequence[str | os.PathLike[str]], *, progress: bool | None = None) -> Loaded:
    files = [TelemetryFile.open(path) for path in paths]  # every path checked before any is read
    total = sum(f.path.stat().st_size for f in files)
    meter = Progress(total, label="reading", enabled=progress)
    spans, points = [], []
    for file in files:
        file._progress = meter
        file_spans, file_points = file.read(point_names=("hw.gpu.", "process.", "system.", "dask."))
        spans.extend(file_spans)
        points.extend(file_points)
    meter.close()
    return Loaded(group_computes(spans), points)


def _seconds(value: float) -> str:
    if value >= 100:
        return f"{value:.0f} s"
    if value >= 1:
        return f"{value:.2f} s"
    if value >= 1e-3:
        return f"{value * 1e3:.1f} ms"
    return f"{value * 1e6:.0f} µs"


def _bytes(value: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(value) < 1000 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"


def _table(out: TextIO, header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    line = "  ".join("{:<%d}" % w if i == 0 else "{:>%d}" % w for i, w in enumerate(widths))
    out.write(line.format(*header) + "\n")
    for row in rows:
        out.write(line.format(*row) + "\n")


def render(loaded: Loaded, out: TextIO, *, top: int = 10) -> None:
    computes = loaded.computes
    totals = describe_tasks(computes)
    out.write(f"{totals['computes']} computes, {totals['tasks']} tasks "
              f"({totals['task_spans']} with their own span), {totals['failed']} failed computes\n")
    if totals["recovered"]:
        out.write(f"{totals['recovered']} tasks ran on workers lost before their spans left them: counted by the "
                  "scheduler (dask.task.recovered), without keys or per-task times\n")
    if not computes:
        out.write("no dask.compute spans found: were these files written by otel_graph?\n")
        return

    out.write("\nBottlenecks by task prefix\n")
    rows = prefix_table(computes, loaded.points)
    _table(out, ["prefix", "duration", "% total", "tasks", "mean", "mean output", "MB/s", "GPU util",
                 "GPU mem", "errors"],
           [[r.prefix, _seconds(r.duration_s), f"{100 * r.share:.1f}", str(r.tasks), _seconds(r.mean_s),
             _bytes(r.mean_bytes), f"{r.throughput_mb_s:.1f}",
             "-" if r.gpu_utilization is None else f"{100 * r.gpu_utilization:.0f}%",
             "-" if r.gpu_memory_bytes is None else _bytes(r.gpu_memory_bytes), str(r.errors)] for r in rows])

    out.write("\nSlowest tasks\n")
    _table(out, ["key", "prefix", "worker", "duration", "output"],
           [[str(s.attributes.get("dask.task.key", "")), str(s.attributes.get("dask.task.prefix", s.name)),
             str(s.attributes.get("dask.worker.id", "")), _seconds(s.duration_ns / 1e9),
             _bytes(s.attributes["dask.task.nbytes"]) if isinstance(s.attributes.get("dask.task.nbytes"), int)
             else "-"] for s in slowest_tasks(computes, top=top)])

    workers, begin, end = worker_balance(computes)
    if workers:
        out.write(f"\nWorker balance: tasks running at once, in 10 slices of {_seconds((end - begin) / 10 / 1e9)}\n")
        _table(out, ["worker", "tasks", "busy", *[f"t{i}" for i in range(10)]],
               [[w.worker, str(w.tasks), _seconds(w.busy_s), *[f"{c:.1f}" for c in w.concurrency]]
                for w in workers])

    for path in sorted((critical_path(c) for c in computes), key=lambda p: p.compute.wall_ns,
                       reverse=True)[:PATHS_SHOWN]:
        _render_path(path, out)


def _render_path(path: CriticalPath, out: TextIO) -> None:
    compute = path.compute
    wall = compute.wall_ns / 1e9
    out.write(f"\nCritical path of the compute at {compute.root.span_id} "
              f"({compute.task_count} tasks, wall {_seconds(wall)})\n")
    if not path.steps:
        out.write("  no task spans with keys under this compute\n")
        return
    share = path.on_path_ns / compute.wall_ns if compute.wall_ns else 0.0
    out.write(f"  {len(path.steps)} tasks; on the path {_seconds(path.on_path_ns / 1e9)} "
              f"({100 * share:.0f}% of wall), idle gaps {_seconds(path.gaps_ns / 1e9)}\n")
    steps = path.steps
    shown = steps if len(steps) <= PATH_STEPS_SHOWN else steps[: PATH_STEPS_SHOWN // 2] + [None] + steps[-(PATH_STEPS_SHOWN // 2):]
    rows = []
    for step in shown:
        if step is None:
            rows.append(["…", "", "", "", "", ""])
            continue
        span = step.span
        rows.append([str(span.attributes.get("dask.task.key", "")), str(span.attributes.get("dask.task.prefix", "")),
                     str(span.attributes.get("dask.worker.id", "")),
                     _seconds((span.start_ns - compute.root.start_ns) / 1e9), _seconds(span.duration_ns / 1e9),
                     _seconds(step.gap_ns / 1e9) + (" *" if step.truncated else "")])
    _table(out, ["key", "prefix", "worker", "starts at", "duration", "waited"], rows)
    if any(step.truncated for step in steps):
        out.write("  * more dependencies than were recorded: the path may miss the one it waited for\n")
