"""otel_graph: OpenTelemetry for Dask task graphs.

Usage
-----
One call at start-up::

    import otel_graph
    otel_graph.instrument_scheduler()

From then on every ``compute()``, ``persist()`` and ``dask.get`` on Dask's local
schedulers (sync, threads, processes) produces one trace: a ``dask.compute`` root
span, a child of your current span if you have one, and a span per task under it,
named after the task's prefix and timed by when the task really ran; a compute still
running after a second also gets ``dask.compute.progress`` spans, so its trace is in the
collector long before its root span ends. Task metrics
(``dask.task.duration``, ``dask.task.output.size``, ``dask.compute.duration``, results
held in memory) and CPU, memory and GPU readings go out as OpenTelemetry metrics.

Where it goes: wherever the standard ``OTEL_*`` variables say (OTLP over gRPC to
``localhost:4317`` by default). If the application already configured
OpenTelemetry, its providers are used; or pass your own::

    handle = otel_graph.instrument_scheduler(tracer_provider=tp, meter_provider=mp)

Under ``opentelemetry-instrument`` nothing needs to change in the code: the
``dask`` instrumentor entry point (:class:`DaskInstrumentor`) is picked up.

API
---
``instrument_scheduler(*, tracer_provider=None, meter_provider=None, **options)``
    Idempotent: a second call returns the live handle. Options (keyword-only) override
    the ``OTEL_GRAPH_*`` variables: ``max_task_spans``, ``max_queued_spans``,
    ``exit_timeout_s``, ``drain_interval_s``, ``early_drain_tasks``, ``progress_interval_s``,
    ``resources``, ``gpu``, ``nvtx``. A bad value raises
    :class:`ConfigurationError` naming the variable and what it accepts.
``name(job)``
    A context manager and decorator naming the computes inside it (``dask.compute.name``:
    ``with otel_graph.name("nightly-etl"):``), which label the compute metrics: each job's
    history. Without one, a compute is named after the caller's current span, else the
    function that called it.
``handle.flush(timeout_s=None) -> bool``
    Blocks until everything recorded so far has been exported; True if it all went.
``handle.uninstrument()``
    Stops, flushes, and restores Dask exactly as it was. The handle is also a context
    manager that does this on exit.
``handle.stats(*, workers=False, timeout_s=10) -> dict``
    Spans and points exported and undelivered, tasks folded into aggregate spans; with
    ``workers=True`` the attached clusters' worker processes are counted in.

Configuration
-------------
Every variable is in :mod:`otel_graph.config` and on the docs' configuration page. At interpreter exit,
what is left is delivered within ``OTEL_GRAPH_EXIT_TIMEOUT`` seconds of no progress,
and one warning says how many spans and points were not delivered.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from otel_graph._version import __version__
from otel_graph.errors import ConfigurationError

if TYPE_CHECKING:
    from otel_graph.instrumentation import Instrumentation
    from otel_graph.instrumentor import DaskInstrumentor
    from otel_graph.telemetry.job import name


def instrument_scheduler(*, tracer_provider: Any = None, meter_provider: Any = None, client: Any = None,
                         **options: Any) -> Instrumentation:
    """Trace and meter every task of Dask's schedulers from now on (see the module docs)."""
    from otel_graph.instrumentation import instrument_scheduler as instrument

    return instrument(tracer_provider=tracer_provider, meter_provider=meter_provider, client=client, **options)


def dask_setup(server: Any) -> Any:
    """``dask scheduler --preload otel_graph`` / ``dask worker --preload otel_graph``."""
    from otel_graph.cluster.preload import setup

    return setup(server)


def __getattr__(name: str) -> Any:
    # Worker processes import this package to run tasks: keep its import free of the
    # SDK, Dask and opentelemetry-instrumentation until they are asked for.
    if name == "DaskInstrumentor":
        from otel_graph.instrumentor import DaskInstrumentor

        return DaskInstrumentor
    if name == "Instrumentation":
        from otel_graph.instrumentation import Instrumentation

        return Instrumentation
    if name == "name":
        from otel_graph.telemetry.job import name as job_name

        return job_name
    raise AttributeError(name)


__all__ = ["ConfigurationError", "DaskInstrumentor", "Instrumentation", "__version__", "instrument_scheduler", "name"]
