"""``otel-graph report``: the text report over OTLP JSON files (and, with ``--html``, the HTML one).

Sections, each from :mod:`otel_graph.report.analysis`: the per-prefix bottleneck table (DASF's
columns), the slowest tasks, per-worker balance over time, and each compute's critical
path. :func:`load` streams the files once, showing progress on large inputs, and says
on stderr what it left out of them (unreadable lines, out-of-range values).

Text from the telemetry (keys, prefixes, worker ids) is untrusted: in the text report
its control and other non-printable characters are escaped (an ANSI or OSC sequence in
a key must not reach the terminal) and cells longer than :data:`MAX_CELL_CHARS` are cut
in the middle, with an ellipsis. The files the command writes (``report.html``, the
Chrome export) are readable by their owner only (:mod:`otel_graph.report.private_files`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from otel_graph.report.analysis import (
    Compute,
    CriticalPath,
    Step,
    critical_path,
    describe_tasks,
    group,
    prefix_table,
    slowest_tasks,
    worker_balance,
)
from otel_graph.report.labels import seconds, size
from otel_graph.report.otlp_read import Point, Span, TelemetryFile
from otel_graph.report.progress import Progress

#: Computes whose critical path is printed (the longest first).
PATHS_SHOWN = 3
PATH_STEPS_SHOWN = 12
#: Longest table cell: a 1 MB key must not pad every row of its table to its width.
MAX_CELL_CHARS = 60


@dataclass
class Loaded:
    computes: list[Compute]
    points: list[Point]
    duplicates: int = 0  # spans read twice (same trace and span id), counted once
    #: Every distinct span by trace id (:attr:`otel_graph.report.analysis.Grouped.traces`): what the
    #: HTML report's trace browser draws, progress, phase and users' own spans included.
    traces: dict[str, list[Span]] = field(default_factory=dict)


def write_html(loaded: Loaded, path: Path) -> None:
    from otel_graph.report.html import write_html as write

    write(loaded, path)


def read_files(paths: Sequence[str | os.PathLike[str]], *, point_names: tuple[str, ...],
               progress: bool | None = None) -> tuple[list[Span], list[Point]]:
    """Spans and points of every file; what was left out of each is said on stderr, once per file."""
    files = [TelemetryFile.open(path) for path in paths]  # every path checked before any is read
    meter = Progress(sum(f.path.stat().st_size for f in files), label="reading", enabled=progress)
    spans, points = [], []
    for file in files:
        file._progress = meter
        file_spans, file_points = file.read(point_names=point_names)
        spans.extend(file_spans)
        points.extend(file_points)
    meter.close()
    for file in files:
        for note in file.notes():
            print(f"otel-graph: {note}", file=sys.stderr)
    return spans, points


def load(paths: Sequence[str | os.PathLike[str]], *, progress: bool | None = None) -> Loaded:
    spans, points = read_files(paths, point_names=("hw.gpu.", "process.", "system.", "dask."), progress=progress)
    grouped = group(spans)
    return Loaded(grouped.computes, points, grouped.duplicates, grouped.traces)


def cell(value: object) -> str:
    """Untrusted text made safe to print: non-printable characters escaped, long text cut in the middle."""
    text = str(value)
    if not text.isprintable():  # ESC, BEL, C1 controls, bidi overrides, lone surrogates, ...
        text = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)
    if len(text) > MAX_CELL_CHARS:
        half = (MAX_CELL_CHARS - 1) // 2
        text = f"{text[:half]}…{text[len(text) - (MAX_CELL_CHARS - 1 - half):]}"
    return text


def table(out: TextIO, header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    rows = [[cell(value) for value in row] for row in rows]
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=False)]
    line = "  ".join(f"{{:<{w}}}" if i == 0 else f"{{:>{w}}}" for i, w in enumerate(widths))
    out.write(line.format(*header) + "\n")
    for row in rows:
        out.write(line.format(*row) + "\n")


def render(loaded: Loaded, out: TextIO, *, top: int = 10) -> None:
    computes = loaded.computes
    totals = describe_tasks(computes)
    out.write(f"{totals['computes']} computes, {totals['tasks']} tasks "
              f"({totals['task_spans']} with their own span), {totals['failed']} failed computes\n")
    if totals["incomplete"]:
        out.write(f"{totals['incomplete']} of the computes incomplete: {totals['incomplete_tasks']} tasks whose "
                  "dask.compute span is missing (killed, or still running when the file was cut), grouped by "
                  "the span they name as parent\n")
    if loaded.duplicates:
        out.write(f"{loaded.duplicates} spans read more than once (the same trace and span id: a file given "
                  "twice, or an export written twice), counted once\n")
    if totals["recovered"]:
        out.write(f"{totals['recovered']} tasks ran on workers lost before their spans left them: counted by the "
                  "scheduler (dask.task.recovered), without keys or per-task times\n")
    if not computes:
        out.write("no dask.compute spans found: were these files written by otel_graph?\n")
        return

    out.write("\nBottlenecks by task prefix\n")
    rows = prefix_table(computes, loaded.points)
    table(out, ["prefix", "duration", "% total", "tasks", "mean", "mean output", "MB/s", "GPU util",
                "GPU mem", "errors"],
          [[r.prefix, seconds(r.duration_s), f"{100 * r.share:.1f}", str(r.tasks), seconds(r.mean_s),
            size(r.mean_bytes), f"{r.throughput_mb_s:.1f}",
            "-" if r.gpu_utilization is None else f"{100 * r.gpu_utilization:.0f}%",
            "-" if r.gpu_memory_bytes is None else size(r.gpu_memory_bytes), str(r.errors)] for r in rows])

    hosts = _worker_hosts(computes)
    out.write("\nSlowest tasks\n")
    table(out, ["key", "prefix", "worker", "duration", "output"],
          [[str(s.attributes.get("dask.task.key", "")), str(s.attributes.get("dask.task.prefix", s.name)),
            _where(s, hosts), seconds(s.duration_ns / 1e9),
            size(s.attributes["dask.task.nbytes"]) if isinstance(s.attributes.get("dask.task.nbytes"), int)
            else "-"] for s in slowest_tasks(computes, top=top)])

    workers, begin, end = worker_balance(computes)
    if workers:
        out.write(f"\nWorker balance: tasks running at once, in 10 slices of {seconds((end - begin) / 10 / 1e9)}\n")
        table(out, ["worker", "tasks", "busy", *[f"t{i}" for i in range(10)]],
              [[_on_host(w.worker, hosts), str(w.tasks), seconds(w.busy_s), *[f"{c:.1f}" for c in w.concurrency]]
               for w in workers])

    for path in sorted((critical_path(c) for c in computes), key=lambda p: p.compute.wall_ns,
                       reverse=True)[:PATHS_SHOWN]:
        _render_path(path, out, hosts)


def _worker_hosts(computes: Sequence[Compute]) -> dict[str, str]:
    """Each worker's host, where the tasks ran on more than one host (else none is named)."""
    hosts = {str(span.attributes.get("dask.worker.id", "")): str(span.resource["host.name"])
             for compute in computes for span in compute.tasks if span.resource.get("host.name")}
    return hosts if len(set(hosts.values())) > 1 else {}


def _on_host(worker: str, hosts: dict[str, str]) -> str:
    host = hosts.get(worker)
    return f"{worker} on {host}" if host else worker


def _where(span: Span, hosts: dict[str, str]) -> str:
    return _on_host(str(span.attributes.get("dask.worker.id", "")), hosts)


def _render_path(path: CriticalPath, out: TextIO, hosts: dict[str, str]) -> None:
    compute = path.compute
    wall = compute.wall_ns / 1e9
    state = ", incomplete: its dask.compute span is missing" if compute.incomplete else ""
    out.write(f"\nCritical path of the compute at {cell(compute.root.span_id)} "
              f"({compute.task_count} tasks, wall {seconds(wall)}{state})\n")
    if not path.steps:
        out.write("  no task spans with keys under this compute\n")
        return
    share = path.on_path_ns / compute.wall_ns if compute.wall_ns else 0.0
    unseen = (f", and {seconds(path.unseen_ns / 1e9)} waiting on aggregated tasks (not known to be idle)"
              if path.unseen_ns else "")
    out.write(f"  {len(path.steps)} tasks; on the path {seconds(path.on_path_ns / 1e9)} "
              f"({100 * share:.0f}% of wall), idle gaps {seconds(path.gaps_ns / 1e9)}{unseen}\n")
    steps = path.steps
    half = PATH_STEPS_SHOWN // 2
    shown: list[Step | None] = [*steps] if len(steps) <= PATH_STEPS_SHOWN else [*steps[:half], None, *steps[-half:]]
    rows = []
    for step in shown:
        if step is None:
            rows.append(["…", "", "", "", "", ""])
            continue
        span = step.span
        rows.append([str(span.attributes.get("dask.task.key", "")), str(span.attributes.get("dask.task.prefix", "")),
                     _where(span, hosts),
                     seconds((span.start_ns - compute.root.start_ns) / 1e9), seconds(span.duration_ns / 1e9),
                     _waited(step)])
    table(out, ["key", "prefix", "worker", "starts at", "duration", "waited"], rows)
    if any(step.truncated for step in steps):
        out.write("  * more dependencies than were recorded: the path may miss the one it waited for\n")
    if any(step.unseen for step in steps):
        out.write("  via N aggregated P: N dependencies have no span of their own (folded into an aggregate "
                  "span of prefix P that ended later), so this wait may be their compute time rather than idle; "
                  "OTEL_GRAPH_MAX_TASK_SPANS=unlimited records the full path\n")


def _waited(step: Step) -> str:
    text = seconds(step.gap_ns / 1e9)
    if step.unseen:
        text += " via " + ", ".join(f"{count} aggregated {prefix}" for prefix, count in sorted(step.unseen.items()))
    return text + (" *" if step.truncated else "")
