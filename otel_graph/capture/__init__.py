"""Capture: Dask's local schedulers (sync, threads, processes) -> task records.

``local`` wraps the scheduler's entry point (``dask.local.get_async``) for one compute at a
time, and ``task_runner`` runs each task and records it as a plain tuple of
:class:`~otel_graph.telemetry.events.TaskEvent`'s fields, in this process or in a process
pool's worker. Nothing else happens per task: the records go to
:mod:`otel_graph.telemetry`, which turns them into spans and metrics off the hot path.

May import: :mod:`otel_graph.telemetry`, :mod:`otel_graph.readings`, :mod:`otel_graph.export`
and the shared modules at the top. ``dask.local`` is imported at the first compute, not with
the package.
"""
