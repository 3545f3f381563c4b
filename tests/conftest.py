"""Shared fixtures: real SDK providers with in-memory readers, and an instrumented Dask."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
# The apps are users' scripts that the tests run as subprocesses; importing one for its
# doctests would run it (and needs what it imports, distributed included).
collect_ignore = ["apps", "skewed_clock"]  # the latter shifts the clock it is imported in

#: For tests that need dask.distributed, an extra: skipped where it is not installed (the
#: local schedulers are also tested on dask's floor without it, by `make test-oldest`).
needs_distributed = pytest.mark.skipif(importlib.util.find_spec("distributed") is None,
                                       reason="dask.distributed is not installed (the distributed extra)")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that share a module-scoped fixture of ours form an xdist group: under
    ``--dist loadgroup`` they run in one process, which makes the fixture once (a whole
    app run, a cluster) instead of once in every process that draws one of them."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        for name, definitions in (info.name2fixturedefs.items() if info is not None else ()):
            definition = definitions[-1] if definitions else None
            if definition is not None and definition.scope == "module" and definition.baseid:
                item.add_marker(pytest.mark.xdist_group(f"{definition.baseid}::{name}"))


@dataclass
class Telemetry:
    """What an instrumented test produced, read from real SDK in-memory exporters."""

    handle: Any
    exporter: InMemorySpanExporter
    reader: InMemoryMetricReader
    tracer_provider: TracerProvider

    def spans(self) -> list[ReadableSpan]:
        assert self.handle.flush(timeout_s=30), "flush did not complete"
        return list(self.exporter.get_finished_spans())

    def roots(self) -> list[ReadableSpan]:
        return [s for s in self.spans() if s.name == "dask.compute"]

    def children(self, root: ReadableSpan) -> list[ReadableSpan]:
        """Spans under ``root``, without the progress spans a compute gets past its first second."""
        return [s for s in self.spans() if s.parent is not None and s.parent.span_id == root.context.span_id
                and s.name != "dask.compute.progress"]

    def points(self, name: str) -> list[Any]:
        self.handle.flush(timeout_s=30)
        data = self.reader.get_metrics_data()
        found = []
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == name:
                        found.extend(metric.data.data_points)
        return found


@contextmanager
def instrumented(**options: Any) -> Iterator[Telemetry]:
    """otel_graph on providers of the test's own, with in-memory exporters; uninstrumented on leaving."""
    import otel_graph

    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    handle = otel_graph.instrument_scheduler(tracer_provider=tracer_provider, meter_provider=meter_provider,
                                             resources=False, **options)
    try:
        yield Telemetry(handle, exporter, reader, tracer_provider)
    finally:
        handle.uninstrument()
        meter_provider.shutdown()
        tracer_provider.shutdown()


@pytest.fixture
def telemetry(request: pytest.FixtureRequest) -> Iterator[Telemetry]:
    with instrumented(**(getattr(request, "param", {}) or {})) as running:
        yield running


def subprocess_env(**extra: str) -> dict[str, str]:
    """The environment for a child Python that imports otel_graph from this checkout, with
    none of the suite's own OpenTelemetry set-up (a CI that traces its steps sets ``TRACEPARENT``)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OTEL_", "PYTEST_")) and k not in ("TRACEPARENT", "TRACESTATE", "BAGGAGE")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests"), env.get("PYTHONPATH", "")])
    env.update(extra)
    return env
