"""Every read of dask.distributed internals, and every replacement of its methods, in one place.

distributed's docs say worker and scheduler state "change without deprecation", so
nothing else in otel_graph touches them: when a release moves a field, this package is
the one to fix. Checked against distributed 2026.8. One module per side of the cluster,
each listing what it reads:

* :mod:`.client`: the ``Client`` methods otel_graph replaces on the class, and how they are
  put back (:func:`patch_client`, :func:`restore_client`); a future's shared state; the
  scheduler's identity and the stream to it; an asynchronous client's start;
* :mod:`.scheduler`: task states by prefix, a graph update's dependencies, a finished
  run's compute times, a task's state and result size, the streams to workers and their
  unsent messages, events sent to subscribed clients without being kept, workers'
  memory, distributed's fine performance metrics;
* :mod:`.worker`: the run of a task that just finished (:func:`task_run`, once per task,
  timestamps put back on the worker's clock), transfers and spilling, the task running on
  a thread, the worker's stream to the scheduler and what otel_graph says on it, and the
  runners its tasks run in (wrapped for NVTX ranges).

The rest of :mod:`otel_graph.cluster` calls them through this package
(``from otel_graph.cluster import adapter``; ``adapter.task_run(...)``), which names them
all. Every function here tolerates a missing field by returning less, never by raising.

May import: only what it hands back (:mod:`otel_graph.telemetry.events`' error record) and
``naming``: the rest of the cluster code imports it, never the other way.
"""

from __future__ import annotations

from otel_graph.cluster.adapter.client import (
    TRACED_CALLS,
    chain_async_start,
    client_worker_count,
    patch_client,
    restore_client,
    scheduler_address,
    scheduler_id,
    scheduler_stream,
    watch_futures,
)
from otel_graph.cluster.adapter.scheduler import (
    FinishedRun,
    WorkerMemory,
    add_stream_handler,
    fine_metric_readings,
    finished_run,
    graph_dependencies,
    handles,
    is_scheduler,
    processing_on,
    publish,
    read_worker_says,
    result_nbytes,
    stolen,
    task_states,
    unsent,
    unsettled,
    worker_count,
    worker_memory,
    worker_state,
    worker_stream,
)
from otel_graph.cluster.adapter.worker import (
    WORKER_SAYS,
    Phase,
    TaskRun,
    close_stream,
    current_task,
    held_keys,
    is_closing,
    run_tasks_within,
    say_to_scheduler,
    scheduler_connection,
    spill_totals,
    stream_open,
    task_count,
    task_run,
    worker_identity,
    worker_scheduler,
)

__all__ = [
    # client
    "TRACED_CALLS", "chain_async_start", "client_worker_count", "patch_client", "restore_client",
    "scheduler_address", "scheduler_id", "scheduler_stream", "watch_futures",
    # scheduler
    "FinishedRun", "WorkerMemory", "add_stream_handler", "fine_metric_readings", "finished_run", "graph_dependencies",
    "handles", "is_scheduler", "processing_on", "publish", "read_worker_says", "result_nbytes", "stolen",
    "task_states", "unsent", "unsettled", "worker_count", "worker_memory", "worker_state", "worker_stream",
    # worker
    "WORKER_SAYS", "Phase", "TaskRun", "close_stream", "current_task", "held_keys", "is_closing",
    "run_tasks_within", "say_to_scheduler", "scheduler_connection", "spill_totals", "stream_open", "task_count",
    "task_run",
    "worker_identity", "worker_scheduler",
]
