"""The user's script :mod:`lifecycle` times: a short dask.distributed job, start to exit.

``python lifecycle_app.py plain|sdk|otel_graph`` imports dask and distributed, starts a
``LocalCluster`` of 2 worker processes with 1 thread each and a ``Client``, computes one
``submit``, closes client and cluster, and prints the ``time.monotonic()`` reading after
each phase as one JSON line (``MARKS {...}``). It imports nothing else, so that its
imports are the user's. The ways:

* ``plain``: nothing more;
* ``sdk``: the OpenTelemetry SDK set up as an application that does it by hand would, in
  every process (this file is the workers' preload): a tracer provider and a meter provider
  with the stock OTLP exporters for ``OTEL_EXPORTER_OTLP_PROTOCOL``, a batch span
  processor, a periodic metric reader at otel_graph's interval (1 s), one span ended.
  What any OpenTelemetry in these processes costs, whoever sets it up;
* ``otel_graph``: also ``import otel_graph`` and ``instrument_scheduler()``, the SDK built
  from the ``OTEL_*`` variables.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

#: The SDK this process set up (``sdk``), kept alive to the end as an application would.
_SDK: list[Any] = []


def set_up_sdk() -> None:
    """The ``sdk`` way's set-up, in this process (see the module docs)."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    if os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc") == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    meter_provider = MeterProvider(metric_readers=[
        PeriodicExportingMetricReader(OTLPMetricExporter(), export_interval_millis=1000)])
    tracer_provider.get_tracer("lifecycle").start_span("set-up").end()
    _SDK.append((tracer_provider, meter_provider))


async def dask_setup(worker: Any) -> None:
    """The ``sdk`` way's worker preload."""
    set_up_sdk()


def main(way: str) -> None:
    marks = {}
    import dask
    import distributed  # noqa: F401

    if way == "sdk":
        dask.config.set({"distributed.worker.preload": [os.path.abspath(__file__)]})
        set_up_sdk()
    elif way == "otel_graph":
        import otel_graph

        otel_graph.instrument_scheduler()
    marks["imports"] = time.monotonic()
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0")
    client = Client(cluster)
    marks["up"] = time.monotonic()
    assert client.submit(int, 1, pure=False).result() == 1
    marks["compute"] = time.monotonic()
    client.close()
    cluster.close()
    marks["closed"] = time.monotonic()
    print("MARKS", json.dumps(marks), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
