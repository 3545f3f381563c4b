"""``dask scheduler --preload otel_graph`` and ``dask worker --preload otel_graph``.

For clusters started outside Python. Each process exports with its own ``OTEL_*``
variables (set them, or ``DASK_DISTRIBUTED__SCHEDULER__PRELOAD=otel_graph`` and the
worker equivalent, in the job script). A worker preloaded this way keeps its own
settings even when an instrumented client registers the plugin again.
"""

from __future__ import annotations

from typing import Any

from otel_graph.cluster import adapter


async def setup(server: Any) -> None:
    if adapter.is_scheduler(server):
        from otel_graph.cluster.scheduler import PLUGIN_NAME, SchedulerTelemetryPlugin

        server.add_plugin(SchedulerTelemetryPlugin(preloaded=True), name=PLUGIN_NAME)
        return
    from otel_graph.cluster.client import ClusterCapture
    from otel_graph.cluster.worker import PLUGIN_NAME, WorkerTelemetryPlugin

    await server.plugin_add(WorkerTelemetryPlugin(nested_capture=ClusterCapture), name=PLUGIN_NAME)
