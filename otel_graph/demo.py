"""A demo of what otel_graph records: ``python -m otel_graph.demo`` (``make demo``).

It runs the example of dask's diagnostics documentation (a random 10000x1000 array,
its QR decomposition and the product rebuilt) and a small pipeline in which one task
fails on purpose, with a ProgressBar, all under ``instrument_scheduler()``.

* If an OTLP collector answers at the configured endpoint (``OTEL_EXPORTER_OTLP_ENDPOINT``,
  default ``localhost:4317``), the telemetry goes there.
* Otherwise it is kept in memory by the SDK and summarised here: per task prefix, the
  tasks, time, share of the total and output size, which is what a Jaeger search or
  the Grafana dashboards would show.
"""

from __future__ import annotations

import os
import socket
from collections import defaultdict
from urllib.parse import urlparse


def _collector_answers(timeout_s: float = 0.5) -> str | None:
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4317")
    parsed = urlparse(endpoint if "://" in endpoint else f"http://{endpoint}")
    host, port = parsed.hostname or "localhost", parsed.port or 4317
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return endpoint
    except OSError:
        return None


def _workload() -> None:
    import dask
    import dask.array as da
    from dask.diagnostics import ProgressBar

    def parse(line: str) -> int:
        if "corrupt" in line:
            raise ValueError(f"cannot parse record {line!r}")
        return len(line)

    with ProgressBar():
        x = da.random.random((10000, 1000), chunks=(1000, 1000))
        q, r = da.linalg.qr(x)
        rebuilt = q.dot(r)
        error = float(abs(rebuilt - x).max().compute())
    print(f"QR rebuilt the array to within {error:.2e}")
    records = [dask.delayed(parse)(line) for line in ("alpha", "beta", "corrupt gamma", "delta")]
    try:
        dask.compute(sum_of(records), scheduler="threads")
    except ValueError as exc:
        print(f"the pipeline failed as planned: {exc}")


def sum_of(values: list) -> object:
    import dask

    return dask.delayed(sum)(values)


def _summarise(spans: list) -> None:
    tasks: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0, 0])
    for span in spans:
        if span.name == "dask.compute":
            continue
        count = span.attributes.get("dask.task.count", 1)
        seconds = span.attributes.get("dask.task.duration.sum", (span.end_time - span.start_time) / 1e9)
        row = tasks[span.name]
        row[0] += count
        row[1] += seconds
        row[2] += span.attributes.get("dask.task.nbytes", 0)
        row[3] += 1 if span.status.status_code.name == "ERROR" else 0
    total = sum(row[1] for row in tasks.values()) or 1.0
    print(f"\n{'prefix':<28}{'tasks':>7}{'time s':>10}{'%':>7}{'output MB':>11}{'errors':>8}")
    for prefix, (count, seconds, nbytes, errors) in sorted(tasks.items(), key=lambda item: -item[1][1]):
        print(f"{prefix:<28}{count:>7}{seconds:>10.3f}{100 * seconds / total:>7.1f}{nbytes / 1e6:>11.1f}{errors:>8}")


def main() -> None:
    import otel_graph

    endpoint = _collector_answers()
    if endpoint:
        handle = otel_graph.instrument_scheduler()
        _workload()
        delivered = handle.flush(timeout_s=30)
        print(f"\ntelemetry sent to the collector at {endpoint} ({'all delivered' if delivered else 'not all delivered'})")
        print("traces: http://localhost:16686 (Jaeger)   dashboards: http://localhost:3000 (Grafana)")
        return
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    print("no collector answers; keeping telemetry in memory for this demo")
    exporter, provider = InMemorySpanExporter(), TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with otel_graph.instrument_scheduler(tracer_provider=provider,
                                         meter_provider=MeterProvider(metric_readers=[InMemoryMetricReader()])):
        _workload()
    spans = list(exporter.get_finished_spans())
    computes = [s for s in spans if s.name == "dask.compute"]
    print(f"\n{len(computes)} computes traced, {len(spans) - len(computes)} task and aggregate spans")
    _summarise(spans)


if __name__ == "__main__":
    main()
