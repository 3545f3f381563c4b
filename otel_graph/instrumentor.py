"""``DaskInstrumentor``: otel_graph under ``opentelemetry-instrument``, with no code change.

Registered under the ``opentelemetry_instrumentor`` entry point as ``dask``, so
``opentelemetry-instrument python app.py`` finds it after configuring the SDK from the
environment, and instruments with the providers that tool set globally::

    opentelemetry-instrument --service_name etl python app.py

In code it behaves like any contrib instrumentor::

    DaskInstrumentor().instrument(tracer_provider=tp, meter_provider=mp)
    DaskInstrumentor().uninstrument()
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

# mypy 2.4 finds no names in this module (it has them, and a py.typed): read as Any.
from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]

from otel_graph.instrumentation import Instrumentation, instrument_scheduler

_instruments = ("dask >= 2025.1",)


class DaskInstrumentor(BaseInstrumentor):
    _handle: Instrumentation | None = None

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _instrument(self, **kwargs: Any) -> None:
        options = {k: v for k, v in kwargs.items() if k not in ("tracer_provider", "meter_provider")}
        type(self)._handle = instrument_scheduler(
            tracer_provider=kwargs.get("tracer_provider"),
            meter_provider=kwargs.get("meter_provider"),
            **options,
        )

    def _uninstrument(self, **kwargs: Any) -> None:
        handle, type(self)._handle = type(self)._handle, None
        if handle is not None:
            handle.uninstrument()
