"""A demo of what otel_graph records: ``otel-graph demo`` (``make demo``).

It runs the example of dask's diagnostics documentation (a random 10000x1000 array,
its QR decomposition and the product rebuilt) and a small pipeline in which one task
fails on purpose, with a ProgressBar, all under ``instrument_scheduler()``; then, with
dask.distributed installed, the QR again on a LocalCluster of two worker processes.

* If an OTLP collector answers at the configured endpoint (``OTEL_EXPORTER_OTLP_ENDPOINT``,
  default ``localhost:4317``), the telemetry goes there.
* Otherwise the embedded default applies: telemetry is written to
  ``./otel-graph-out/`` as OTLP JSON lines (:mod:`otel_graph.export.otlp_json`), and the demo
  prints the report on it (:mod:`otel_graph.report.text`) and writes ``report.html``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from otel_graph.config import otlp_protocol
from otel_graph.export.endpoint import collector_address, listening


def _collector_answers(timeout_s: float = 0.5) -> str | None:
    """The collector's ``host:port``, if one listens where the span exporter would send.

    Asked the way exit asks it (:func:`otel_graph.export.endpoint.collector_address`: the
    protocol's default port, 443 for a bare ``https://``); an endpoint that is no TCP
    address, or cannot be read, is no collector here (configuration reports it, if bad).
    """
    address = collector_address(otlp_protocol("traces"))
    if address is None or not listening(address, timeout_s=timeout_s):
        return None
    return f"{address[0]}:{address[1]}"


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


def _cluster_workload() -> None:
    """The same QR on a LocalCluster of two worker processes, when dask.distributed is installed."""
    try:
        from distributed import Client, LocalCluster, progress
    except ImportError:
        return
    import dask.array as da

    print("\nthe same on a LocalCluster of 2 worker processes:")
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as cluster, Client(cluster) as client:
        x = da.random.random((4000, 1000), chunks=(500, 1000))
        q, r = da.linalg.qr(x)
        future = client.compute(abs(q.dot(r) - x).max())
        progress(future)
        print(f"\nQR rebuilt on the cluster to within {future.result():.2e}")


def sum_of(values: list) -> object:
    import dask

    return dask.delayed(sum)(values)


def run(*, out_dir: Path, html: bool = True) -> int:
    """The demo; returns the process exit code."""
    endpoint = _collector_answers()
    if not endpoint:
        # The embedded default: OTLP JSON files, which the report then reads.
        os.environ["OTEL_TRACES_EXPORTER"] = os.environ["OTEL_METRICS_EXPORTER"] = "otlp_file"
        os.environ["OTEL_GRAPH_FILE_DIR"] = str(out_dir)
        for name in ("traces.jsonl", "metrics.jsonl"):
            (out_dir / name).unlink(missing_ok=True)  # this run's telemetry only
    import otel_graph

    handle = otel_graph.instrument_scheduler()
    _workload()
    _cluster_workload()
    delivered = handle.flush(timeout_s=30)
    handle.uninstrument()
    if endpoint:
        print(f"\ntelemetry sent to the collector at {endpoint} "
              f"({'all delivered' if delivered else 'not all delivered'})")
        print("traces: http://localhost:16686 (Jaeger)   dashboards: http://localhost:3000 (Grafana)")
        return 0
    from otel_graph.report.text import load, render, write_html

    files = [out_dir / "traces.jsonl", out_dir / "metrics.jsonl"]
    print(f"\nno collector answers where OTEL_* points: telemetry was written to {out_dir}/ as OTLP JSON lines")
    loaded = load(files)
    print()
    render(loaded, sys.stdout)
    if html:
        page = out_dir / "report.html"
        write_html(loaded, page)
        print(f"\nHTML report: {page}")
    print(f"traces: {files[0]}\nmetrics: {files[1]}")
    print(f"again: otel-graph report {files[0]} {files[1]} --html report.html")
    return 0


def main() -> None:
    sys.exit(run(out_dir=Path("otel-graph-out")))


if __name__ == "__main__":
    main()
