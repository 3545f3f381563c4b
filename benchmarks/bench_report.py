"""How fast ``otel-graph report`` reads a large trace file, and how much memory it takes.

Writes an OTLP JSON lines file of ``--spans`` task spans (default 10^6) under one
``dask.compute`` span, 1,000 spans per line, shaped like otel_graph's own (the
attributes a task span carries), then times the report's load and render on it and
reads the process's peak RSS. With ``--html``, it also writes the HTML report and opens it
in headless Chromium (as the tests do), timing until the page has drawn its plots and its
trace browser; ``--html-of FILE...`` does that for existing files (``otel-graph demo``'s).
Usage::

    python benchmarks/bench_report.py [--spans 1000000] [--keep FILE] [--html]
    python benchmarks/bench_report.py --html-of otel-graph-out/traces.jsonl otel-graph-out/metrics.jsonl
"""

from __future__ import annotations

import argparse
import io
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from otel_graph.report.text import load, render, write_html  # noqa: E402

TRACE = "5b8efff798038103d269b633813fc60c"


def _value(value: object) -> dict:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, list):
        return {"arrayValue": {"values": [_value(v) for v in value]}}
    return {"stringValue": str(value)}


def _span(index: int, start: int) -> dict:
    prefix = ("load", "clean", "join", "write")[index % 4]
    attributes = {
        "dask.task.key": f"('{prefix}-9a8b7c', {index})", "dask.task.prefix": prefix,
        "dask.worker.id": f"tcp://10.0.0.{index % 16}:40000", "dask.worker.name": str(index % 16),
        "thread.id": 140000000000000 + index % 4, "dask.task.nbytes": 8000 + index % 977,
        "dask.task.type": "ndarray", "dask.task.dependencies": [f"('load-9a8b7c', {max(index - 1, 0)})"],
        "dask.task.dependency_count": 1, "dask.task.dependent_count": 1, "code.function.name": prefix,
    }
    return {"traceId": TRACE, "spanId": f"{index + 2:016x}", "parentSpanId": f"{1:016x}", "name": prefix,
            "kind": 1, "startTimeUnixNano": str(start), "endTimeUnixNano": str(start + 1_000_000 + index % 5000),
            "attributes": [{"key": k, "value": _value(v)} for k, v in attributes.items()], "status": {}}


def write(path: Path, spans: int) -> None:
    base = 1_700_000_000_000_000_000
    resource_ = {"attributes": [{"key": "service.name", "value": {"stringValue": "bench"}}]}
    root = {"traceId": TRACE, "spanId": f"{1:016x}", "name": "dask.compute", "kind": 1,
            "startTimeUnixNano": str(base), "endTimeUnixNano": str(base + spans * 1_000_000),
            "attributes": [{"key": "dask.graph.tasks", "value": {"intValue": str(spans)}}], "status": {}}
    with path.open("w") as out:
        for first in range(0, spans, 1000):
            batch = [_span(i, base + i * 1_000_000) for i in range(first, min(first + 1000, spans))]
            if first == 0:
                batch.append(root)
            out.write(json.dumps({"resourceSpans": [{"resource": resource_,
                                                     "scopeSpans": [{"spans": batch}]}]}) + "\n")


def html(paths: list[Path], label: str) -> None:
    """Write the HTML report of ``paths``, then time its opening in headless Chromium."""
    sys.path.insert(0, str(ROOT / "tests"))
    import browser

    page_path = Path(tempfile.mkdtemp()) / "report.html"
    started = time.perf_counter()
    write_html(load(paths, progress=False), page_path)
    written = time.perf_counter() - started
    with browser.page() as page:
        started = time.perf_counter()
        page.goto(page_path.as_uri())
        page.wait_for_function(f"() => ({browser.INKED_CANVASES})() >= 2 && "
                               "Bokeh.documents[0].get_model_by_name('trace-browser-waterfall')", timeout=600_000)
        opened = time.perf_counter() - started
        problems = page.problems
    print(f"html-{label}  page {page_path.stat().st_size / 1e6:.1f} MB  written in {written:.1f} s  "
          f"drawn in Chromium in {opened:.1f} s  console errors {len(problems)}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spans", type=int, default=1_000_000)
    parser.add_argument("--keep", type=Path)
    parser.add_argument("--html", action="store_true", help="also write and open the HTML report")
    parser.add_argument("--html-of", type=Path, nargs="+", help="only the HTML report of these files")
    args = parser.parse_args()
    if args.html_of:
        html(args.html_of, "files")
        return
    path = args.keep or Path(tempfile.mkdtemp()) / "traces.jsonl"
    write(path, args.spans)
    size = path.stat().st_size
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    loaded = load([path], progress=False)
    read = time.perf_counter() - started
    render(loaded, io.StringIO())
    total = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    print(f"report-{args.spans // 1000}k  file {size / 1e6:.0f} MB  read {read:.1f} s  read+analyse {total:.1f} s  "
          f"({total / args.spans * 1e6:.1f} s per 10^6 spans)  peak RSS {peak / 1024:.0f} MiB "
          f"(+{(peak - before) / 1024:.0f} MiB)")
    if args.html:
        html([path], f"{args.spans // 1000}k")


if __name__ == "__main__":
    main()
