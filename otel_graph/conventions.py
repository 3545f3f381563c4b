"""Every name otel_graph's telemetry carries: spans, their attributes and events, metrics.

This is the one place they are defined. The instruments take their unit and description
from :data:`METRICS` (:func:`metric`), the docs' telemetry reference is generated from these
tables, and the tests fail on a span, attribute, event or metric that a real compute emits
and this module does not name, as on an entry here that nothing emits. Names follow
OpenTelemetry's semantic conventions where one exists (``code.function.name``,
``error.type``, ``thread.id``, ``process.*``, ``system.*``, ``hw.gpu.*``) and are
``dask.*`` otherwise.

>>> metric("dask.task.duration").unit
's'
>>> SPANS["task"].name
'the task prefix'
>>> sorted(set(SPANS["task"].attributes) - set(ATTRIBUTES))
[]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Attribute:
    """An attribute: its OTLP value type and what it says."""

    type: str  # string, int, double, boolean, string[]
    brief: str


@dataclass(frozen=True)
class Span:
    """A kind of span otel_graph makes."""

    name: str  # the span's name, or how it is named
    brief: str
    attributes: tuple[str, ...]
    events: tuple[str, ...] = ()
    where: str = "every scheduler"  # local schedulers, dask.distributed, or every scheduler


@dataclass(frozen=True)
class Event:
    """A span event otel_graph adds."""

    brief: str
    attributes: tuple[str, ...]


@dataclass(frozen=True)
class Metric:
    """An instrument: its kind, UCUM unit, description and the attributes of its points."""

    instrument: str  # histogram, counter, up-down counter, gauge (the last three observable)
    unit: str
    brief: str
    attributes: tuple[str, ...] = ()
    where: str = "every scheduler"


_S, _I, _D, _B, _L = "string", "int", "double", "boolean", "string[]"

ATTRIBUTES: dict[str, Attribute] = {
    # A compute
    "dask.scheduler": Attribute(_S, "`sync`, `threads`, `processes` or `distributed`."),
    "dask.graph.tasks": Attribute(_I, "Tasks the compute ran (dask.distributed: tasks in the graph it submitted)."),
    "dask.graph.tasks_lost": Attribute(_I, "Tasks a local scheduler submitted that never reported back."),
    "dask.compute.name": Attribute(_S, "The job the compute is a run of: the innermost `otel_graph.name()`, else "
                                   "the caller's current span's name, else the function that called compute "
                                   "(`module.qualname`); at most 128 characters. On the compute metrics, a "
                                   "process's first 200 names, the rest `(other jobs)`."),
    "dask.graph.fingerprint": Attribute(_S, "16 hex digits naming the graph's shape (its task prefixes and their "
                                        "counts, the prefix-to-prefix dependencies and theirs): the same for the "
                                        "same job on other data of the same shape, in any process. "
                                        "dask.distributed: of the tasks the scheduler took in."),
    "dask.compute.tasks_done": Attribute(_I, "Local schedulers: tasks finished by the progress span's end."),
    "dask.compute.tasks_running": Attribute(_I, "Local schedulers: tasks running at the progress span's end."),
    "dask.compute.tasks_waiting": Attribute(_I, "Local schedulers: tasks not yet started at the progress span's end."),
    "otel_graph.incomplete": Attribute(_B, "`true` on a compute still running when the process exited or "
                                       "otel_graph was uninstrumented: the span ends there."),
    "otel_graph.processing_error": Attribute(_B, "`true` when turning the compute's records into telemetry "
                                             "raised: its task spans may be missing (counted in `stats()`)."),
    # A task
    "dask.task.key": Attribute(_S, "The task's key as a readable string, at most 512 characters."),
    "dask.task.prefix": Attribute(_S, "The key's prefix (`dask.utils.key_split`), at most 128 characters; "
                                  "the span's name."),
    "dask.task.nbytes": Attribute(_I, "`dask.sizeof` of the result, in bytes. Left out where `__sizeof__` fails "
                                  "or claims more than int64; on an aggregate, their total, at most int64's largest."),
    "dask.task.type": Attribute(_S, "The result's type name."),
    "dask.task.dependencies": Attribute(_L, "The keys of the task's dependencies, at most 32."),
    "dask.task.dependency_count": Attribute(_I, "All of the task's dependencies."),
    "dask.task.dependent_count": Attribute(_I, "Tasks that consume the result."),
    "dask.task.retries": Attribute(_I, "dask.distributed: retries the task was allowed."),
    "dask.task.attempt": Attribute(_I, "dask.distributed: which run of the task on this worker this was, from 2 "
                                   "on: a retry after it failed there (a rerun on another worker is not numbered)."),
    "code.function.name": Attribute(_S, "The task's function; for fused tasks and `toolz.compose` the inner "
                                    "ones, innermost first, joined by `, `."),
    "error.type": Attribute(_S, "The exception's type, on a failed task or compute (with status ERROR and an "
                            "`exception` event); on metrics, `undelivered` for what was given up on."),
    "thread.id": Attribute(_I, "The thread that ran the task."),
    "dask.worker.id": Attribute(_S, "Where the task ran: the thread ident (sync, threads), the worker's pid "
                                "(processes) or the worker's address (dask.distributed)."),
    "dask.worker.name": Attribute(_S, "dask.distributed: the worker's name."),
    # Tasks without a span of their own
    "dask.task.aggregate": Attribute(_B, "`true`: the span stands for several tasks of one prefix."),
    "dask.task.count": Attribute(_I, "The tasks an aggregate span stands for."),
    "dask.task.duration.sum": Attribute(_D, "Their run time, in seconds, summed."),
    "dask.task.duration.min": Attribute(_D, "The shortest run, in seconds."),
    "dask.task.duration.max": Attribute(_D, "The longest run, in seconds."),
    "dask.task.duration.mean": Attribute(_D, "The mean run, in seconds."),
    "dask.task.recovered": Attribute("boolean; int on events", "`true`: tasks whose telemetry a lost worker took "
                                     "with it, rebuilt from the scheduler's records. On a `dask.worker.lost` or "
                                     "`dask.worker.retired` event: how many of the compute's tasks that was."),
    # A task's inputs and spills (dask.distributed)
    "dask.transfer.source": Attribute(_S, "The worker a `transfer` fetched inputs from."),
    "dask.transfer.bytes": Attribute(_I, "The bytes a `transfer` fetched."),
    # One timeline per trace (dask.distributed)
    "dask.clock.correction": Attribute(_D, "Seconds added to the worker's own clock to place the span on the "
                                       "timeline of the trace's caller (the process of its `dask.compute` span): "
                                       "the caller's clock minus the worker's, as measured. Absent with "
                                       "`OTEL_GRAPH_CLOCK=local`."),
    "dask.clock.uncertainty": Attribute(_D, "How far `dask.clock.correction` may be off, either way, in seconds."),
    # distributed's spans
    "dask.span.name": Attribute(_S, "The `distributed.span` tags from the outermost, joined by `/` (`etl/load`)."),
    "dask.span.id": Attribute(_S, "distributed's id of the span."),
    # Events
    "exception.type": Attribute(_S, "The exception's type."),
    "exception.message": Attribute(_S, "Its message, at most 4,096 characters."),
    "exception.stacktrace": Attribute(_S, "Its stack trace in the task, at most 16,384 characters (the end kept)."),
    "exception.escaped": Attribute(_S, "`True` or `False`, where your code called `record_exception()` on a "
                                   "compute span, as on the SDK's spans."),
    "dask.worker.removal": Attribute(_S, "Why the scheduler removed the worker (its stimulus id)."),
    # Metric points
    "dask.task.outcome": Attribute(_S, "`success` or `error`."),
    "otel.metric.overflow": Attribute(_B, "`true` in place of `dask.task.prefix` past the process's first 2,000 "
                                      "prefixes."),
    "dask.task.state": Attribute(_S, "A scheduler's task state: `waiting`, `processing`, `memory`, `erred`..."),
    "dask.scheduler.address": Attribute(_S, "The scheduler's address."),
    "dask.memory.state": Attribute(_S, "`managed`, `unmanaged` or `spilled`."),
    "dask.spill.direction": Attribute(_S, "`write` (to disk) or `read` (back)."),
    "dask.activity.context": Attribute(_S, "`execute` (running tasks), `gather-dep` (fetching inputs), `get-data` "
                                       "(sending data), `p2p` (shuffles) or `memory-monitor` (spilling)."),
    "dask.activity": Attribute(_S, "`thread-cpu`, `thread-noncpu`, `executor`, `disk-read`, `serialize`, "
                               "`network`..."),
    "dask.activity.phase": Attribute(_S, "Outside `execute`: the context's sub-part, where it has one."),
    "cpu.mode": Attribute(_S, "`user` or `system` (the machine's: also `nice`, `idle`, `iowait`...)."),
    "system.memory.state": Attribute(_S, "`used`, `free`, `buffers`, `cached`..."),
    "hw.id": Attribute(_S, "The GPU's UUID."),
    "hw.name": Attribute(_S, "The GPU's model name."),
    "hw.vendor": Attribute(_S, "`NVIDIA`."),
}

_TASK = ("dask.task.key", "dask.task.prefix", "dask.worker.id", "thread.id", "dask.task.nbytes", "dask.task.type",
         "dask.task.dependencies", "dask.task.dependency_count", "dask.task.dependent_count", "code.function.name",
         "error.type")
_DURATIONS = ("dask.task.duration.sum", "dask.task.duration.mean")
_CLOCK = ("dask.clock.correction", "dask.clock.uncertainty")

SPANS: dict[str, Span] = {
    "compute": Span(
        "dask.compute",
        "One per compute, the root of its trace, a child of the caller's current span. Status ERROR when "
        "the compute fails.",
        ("dask.scheduler", "dask.compute.name", "dask.graph.fingerprint", "dask.graph.tasks",
         "dask.graph.tasks_lost", "error.type", "dask.span.name",
         "dask.span.id", "otel_graph.incomplete", "otel_graph.processing_error"),
        ("exception", "dask.future.cancelled", "dask.future.released", "dask.worker.lost", "dask.worker.retired")),
    "task": Span(
        "the task prefix",
        "One per task within the span budget (`OTEL_GRAPH_MAX_TASK_SPANS` a compute; failed tasks always), timed "
        "where it ran. Named `(other prefixes)` past the process's first 2,000 prefixes (`dask.task.prefix` still "
        "exact). Status ERROR when the task failed.",
        (*_TASK, "dask.worker.name", "dask.task.retries", "dask.task.attempt", *_CLOCK), ("exception",)),
    "aggregate": Span(
        "the task prefix",
        "The tasks of one prefix past the span budget (`OTEL_GRAPH_MAX_TASK_SPANS`), from the first's start to "
        "the last's end. Past a compute's first 100 prefixes, one named `(other prefixes)` stands for the rest.",
        ("dask.task.aggregate", "dask.task.prefix", "dask.task.count", *_DURATIONS, "dask.task.duration.min",
         "dask.task.duration.max", "dask.task.nbytes", "dask.worker.id", *_CLOCK)),
    "recovered": Span(
        "the task prefix",
        "The tasks of one prefix whose spans a lost worker took with it, rebuilt from the scheduler's records.",
        ("dask.task.aggregate", "dask.task.recovered", "dask.task.prefix", "dask.task.count", *_DURATIONS,
         "dask.worker.id"),
        where="dask.distributed"),
    "phase": Span(
        "`transfer`, `disk-read` or `disk-write`",
        "A child of a task span: fetching its inputs from other workers, or spilling (where distributed timed "
        "one above 5 ms).",
        ("dask.task.key", "dask.worker.id", "dask.transfer.source", "dask.transfer.bytes"),
        where="dask.distributed"),
    "progress": Span(
        "dask.compute.progress",
        "A child of a compute still running after a second (made at the next drain, "
        "`OTEL_GRAPH_DRAIN_INTERVAL`), then one every `OTEL_GRAPH_PROGRESS_INTERVAL`: together they tile the "
        "run, and show a long compute before its root span ends.",
        ("dask.scheduler", "dask.graph.tasks", "dask.compute.tasks_done", "dask.compute.tasks_running",
         "dask.compute.tasks_waiting")),
    "distributed-span": Span(
        "the span's tag",
        "A `with distributed.span(...)` block, or a distributed span a compute was submitted in: the computes "
        "inside nest under it. Status ERROR when the block raised.",
        ("dask.span.name", "dask.span.id", "error.type"),
        where="dask.distributed"),
}

EVENTS: dict[str, Event] = {
    "exception": Event("On a failed task's or compute's span: the exception, as raised in the task.",
                       ("exception.type", "exception.message", "exception.stacktrace", "exception.escaped")),
    "dask.future.cancelled": Event("A future of the compute was cancelled (the span gets status ERROR).",
                                   ("dask.task.key",)),
    "dask.future.released": Event("Your code dropped a future of the compute before it finished.",
                                  ("dask.task.key",)),
    "dask.worker.lost": Event("The scheduler removed a worker while the compute ran.",
                              ("dask.worker.id", "dask.worker.removal", "dask.task.recovered")),
    "dask.worker.retired": Event("A worker was retired gracefully while the compute ran.",
                                 ("dask.worker.id", "dask.worker.removal", "dask.task.recovered")),
}

_BY_WORKER = ("dask.worker.id", "dask.worker.name")
_COMPUTE = ("dask.scheduler", "dask.task.outcome", "dask.compute.name")
_GPU = ("hw.id", "hw.name", "hw.vendor")
_DISTRIBUTED = "dask.distributed"
_FINE = ("dask.activity.context", "dask.activity", "dask.task.prefix", "dask.activity.phase", "dask.span.name",
         "dask.scheduler.address")

METRICS: dict[str, Metric] = {
    "dask.task.duration": Metric("histogram", "s", "Time a task's function ran.",
                                 ("dask.task.prefix", "dask.scheduler", "dask.task.outcome", "otel.metric.overflow",
                                  "dask.task.recovered")),
    "dask.task.output.size": Metric("histogram", "By", "dask.sizeof of a task's result.",
                                    ("dask.task.prefix", "otel.metric.overflow")),
    "dask.compute.duration": Metric("histogram", "s", "Wall time of a compute, end to end.", _COMPUTE),
    "dask.compute.tasks": Metric("histogram", "{task}", "Tasks a compute ran (dask.distributed: tasks in the "
                                 "graph it submitted).", _COMPUTE),
    "dask.compute.failed_tasks": Metric("histogram", "{task}", "Tasks of a compute that failed (dask.distributed: "
                                        "counted by the scheduler).", _COMPUTE),
    "dask.compute.output.size": Metric("histogram", "By", "dask.sizeof of all a compute's task results "
                                       "(dask.distributed: as its workers measured them).", _COMPUTE),
    "dask.memory.tasks": Metric("up-down counter", "{task}", "Task results held in memory by running computes.",
                                ("dask.scheduler",)),
    "dask.memory.usage": Metric("up-down counter", "By",
                                "dask.sizeof of the task results held in memory by running computes.",
                                ("dask.scheduler",)),
    "dask.task.aggregated": Metric("counter", "{task}", "Tasks past the span budget, in aggregate spans."),
    "dask.task.recovered": Metric("counter", "{task}",
                                  "Tasks whose spans a lost worker took with it, in recovered spans."),
    "otel.sdk.exporter.span.exported": Metric(
        "counter", "{span}", "Spans otel_graph exported; error.type=undelivered counts those it gave up on.",
        ("error.type",)),
    "otel.sdk.exporter.metric_data_point.exported": Metric(
        "counter", "{data_point}", "Metric points exported; error.type=undelivered counts those that failed.",
        ("error.type",)),
    "process.cpu.utilization": Metric(
        "gauge", "1", "Difference in process.cpu.time since the last measurement, divided by the elapsed time "
        "and number of CPUs available to the process.", ("cpu.mode",)),
    "process.memory.usage": Metric("up-down counter", "By", "The amount of physical memory in use."),
    "process.memory.virtual": Metric("up-down counter", "By", "The amount of committed virtual memory."),
    "system.cpu.utilization": Metric("gauge", "1",
                                     "Fraction of all CPUs' time spent in each mode since the last measurement.",
                                     ("cpu.mode",)),
    "system.memory.usage": Metric("up-down counter", "By", "Reports memory in use by state.",
                                  ("system.memory.state",)),
    "system.memory.utilization": Metric("gauge", "1", "Fraction of memory bytes in each state.",
                                        ("system.memory.state",)),
    "hw.gpu.utilization": Metric("gauge", "1", "Fraction of time the GPU was busy.", _GPU, "NVIDIA GPUs"),
    "hw.gpu.memory.usage": Metric("up-down counter", "By", "GPU memory used.", _GPU, "NVIDIA GPUs"),
    "hw.gpu.memory.limit": Metric("up-down counter", "By", "Size of the GPU memory.", _GPU, "NVIDIA GPUs"),
    "hw.gpu.memory.utilization": Metric("gauge", "1", "Fraction of GPU memory used.", _GPU, "NVIDIA GPUs"),
    "dask.scheduler.tasks": Metric("gauge", "{task}", "Tasks the scheduler holds, by state.",
                                   ("dask.task.state", "dask.scheduler.address"), _DISTRIBUTED),
    "dask.scheduler.workers": Metric("gauge", "{worker}", "Workers connected to the scheduler.",
                                     ("dask.scheduler.address",), _DISTRIBUTED),
    "dask.clock.offset": Metric("gauge", "s", "This process's clock minus its scheduler's, as measured: on a "
                                "worker, by distributed at each heartbeat; on a client, by otel_graph's exchanges "
                                "with the scheduler.", ("dask.scheduler.address",), _DISTRIBUTED),
    "dask.worker.memory.usage": Metric("gauge", "By",
                                       "Worker memory as the scheduler sees it: managed, unmanaged, spilled.",
                                       (*_BY_WORKER, "dask.memory.state"), _DISTRIBUTED),
    "dask.worker.memory.limit": Metric("gauge", "By", "Each worker's memory limit.", _BY_WORKER, _DISTRIBUTED),
    "dask.worker.spill.io": Metric("counter", "By", "Bytes this worker wrote to or read from its spill disk.",
                                   (*_BY_WORKER, "dask.spill.direction"), _DISTRIBUTED),
    "dask.worker.spill.operations": Metric("counter", "{operation}",
                                           "Keys this worker spilled to or read back from disk.",
                                           (*_BY_WORKER, "dask.spill.direction"), _DISTRIBUTED),
    "dask.worker.spill.time": Metric("counter", "s", "Time this worker spent spilling and unspilling.",
                                     (*_BY_WORKER, "dask.spill.direction"), _DISTRIBUTED),
    "dask.activity.time": Metric("counter", "s", "Time workers spent, by activity (fine performance metrics).",
                                 _FINE, _DISTRIBUTED),
    "dask.activity.size": Metric("counter", "By",
                                 "Bytes workers handled, by activity (fine performance metrics).", _FINE,
                                 _DISTRIBUTED),
    "dask.activity.count": Metric("counter", "{event}",
                                  "Events workers counted, by activity (fine performance metrics).", _FINE,
                                  _DISTRIBUTED),
}

#: Resource attributes otel_graph sets where it builds the SDK (``OTEL_RESOURCE_ATTRIBUTES`` adds yours).
RESOURCE: dict[str, str] = {
    "service.name": "`OTEL_SERVICE_NAME`, or `dask`.",
    "service.instance.id": "A UUID per process: a dask.distributed worker's process is an instance of its own.",
    "process.pid": "The process's id.",
    "host.name": "The machine's name.",
    "dask.worker.id": "A dask.distributed worker's process: the worker's address.",
    "dask.worker.name": "A dask.distributed worker's process: the worker's name.",
    "dask.scheduler.address": "A dask.distributed scheduler's process, with its own SDK: its address.",
}


_OBSERVABLE = {"gauge": "create_observable_gauge", "up-down counter": "create_observable_up_down_counter",
               "counter": "create_observable_counter"}


def metric(name: str) -> Metric:
    """The catalogue's entry for the instrument ``name``; a name it lacks is a bug here."""
    return METRICS[name]


def observe(meter: Any, name: str, callbacks: Sequence[Callable[..., Any]]) -> Any:
    """Create the observable instrument ``name`` on ``meter`` as catalogued: its kind, unit and description."""
    entry = METRICS[name]
    create = getattr(meter, _OBSERVABLE[entry.instrument])
    return create(name, callbacks=list(callbacks), unit=entry.unit, description=entry.brief)
