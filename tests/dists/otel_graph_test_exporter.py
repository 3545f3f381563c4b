"""A third-party exporter, as another package would register it (``tests/dists``).

Each writes one line per span (its name) or per metric (``metric <name>``) to the file
``TEST_EXPORTER_FILE`` names, so a test in another process can read what arrived.
"""

from __future__ import annotations

import os
from typing import Any

from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult


def _write(lines: list[str]) -> None:
    with open(os.environ["TEST_EXPORTER_FILE"], "a", encoding="utf-8") as out:
        out.writelines(line + "\n" for line in lines)


class LineSpanExporter(SpanExporter):
    def export(self, spans: Any) -> SpanExportResult:
        _write([span.name for span in spans])
        return SpanExportResult.SUCCESS


class LineMetricExporter(MetricExporter):
    def __init__(self) -> None:
        super().__init__(preferred_temporality={}, preferred_aggregation={})

    def export(self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        _write([f"metric {metric.name}" for rm in metrics_data.resource_metrics
                for sm in rm.scope_metrics for metric in sm.metrics])
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        pass


class NotAnExporter:
    """Registered under the traces group by mistake."""
