"""How fast ``otel-graph report`` reads a large trace file, and how much memory it takes.

Writes an OTLP JSON lines file of ``--spans`` task spans (default 10^6) under one
``dask.compute`` span, 1,000 spans per line, shaped like otel_graph's own (the
attributes a task span carries), then times the report's load and render on it and
reads the process's peak RSS. Usage::

    python benchmarks/bench_report.py [--spans 1000000] [--keep FILE]
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from otel_graph.report.text import load, render  # noqa: E402

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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spans", type=int, default=1_000_000)
    parser.add_argument("--keep", type=Path)
    args = parser.parse_args()
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


if __name__ == "__main__":
    main()
