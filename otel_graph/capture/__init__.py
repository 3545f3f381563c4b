"""Capture: Dask's local schedulers (sync, threads, processes) -> task records.

``local`` wraps the scheduler's entry point (``dask.local.get_async``) for one compute at a
time, and ``task_runner`` runs each task and records it as a plain tuple of
:class:`~otel_graph.telemetry.events.TaskEvent`'s fields, in this process or in a process
pool's worker. Nothing else happens per task: the records go to
:mod:`otel_graph.telemetry`, which turns them into spans and metrics off the hot path.

May import: :mod:`otel_graph.telemetry` and what it may import. Dask is imported here, never
above in the package's import.
"""
