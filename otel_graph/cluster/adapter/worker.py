"""A worker's internals: the run of a task it just finished, its spill, its stream to the scheduler.

Read from the worker plugin (:mod:`otel_graph.cluster.worker`) and what it starts, on the
worker's event loop or the thread that runs a task. What is read, as of distributed 2026.8:

* ``WorkerPlugin.transition`` gets only ``(key, start, finish)``; the task's record is
  ``worker.state.tasks[key]``: ``startstops``, ``nbytes``, ``type``, ``annotations``,
  ``dependencies``/``dependents``, ``exception``/``traceback_text``, ``run_spec``;
  the thread that ran it is ``worker.state.threads[key]``.
* ``compute`` and ``transfer`` start/stops are on the *scheduler's* clock (the
  worker adds ``worker.scheduler_delay``, for a compute the value it passed to the task's
  runner as ``time_delay``); ``disk-read``/``disk-write`` are on the worker's own.
  :func:`task_run` puts them all back on the worker's clock.
* transfers are logged with their bytes in ``worker.transfer_incoming_log``; spilling is
  counted in ``worker.digests_total``.
* the worker's stream to the scheduler is ``worker.batched_stream`` (a ``BatchedSend``:
  ``comm`` while connected, ``close()`` sends what it holds first); ``worker.batched_send``
  drops a message while it is not connected. What otel_graph says on it rides in a
  ``keep-alive`` message, which every scheduler takes and ignores
  (:func:`say_to_scheduler`; the scheduler's side: :func:`.scheduler.read_worker_says`).
* the task running on a thread: ``distributed.worker.thread_state.key`` and ``get_worker()``.
* where a task runs: ``distributed.worker._run_task(task, data, execution_state, key, ...)`` on
  the thread of a thread pool executor that runs it, and ``_run_task_async(task, data,
  time_delay)`` for an ``async def`` task, on the event loop; ``Worker.execute`` looks both up
  as module globals, and ``task.key`` is the task's key; the worker running a threaded task
  is ``execution_state["worker"]``, an ``async def`` one's ``get_worker()`` (distributed sets
  its context variable around the runner). :func:`run_tasks_within` wraps them.

:func:`task_run` runs once per task: it reads plain values and builds one flat record,
nothing more.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from itertools import islice
from typing import Any, NamedTuple, Protocol

from otel_graph.naming import MAX_DEPENDENCIES, safe_text
from otel_graph.telemetry.events import ErrorInfo, describe_exception

#: Entries of a worker's transfer log searched, newest first, for the transfer that fetched a
#: dependency: it is recent when its task's phases are read.
_TRANSFER_LOOKBACK = 64


class Phase(NamedTuple):
    """A non-compute part of a task's run: fetching its inputs, or spilling."""

    action: str  # transfer | disk-read | disk-write
    start_ns: int
    end_ns: int
    source: str | None  # the worker a transfer came from
    nbytes: int | None


class TaskRun(NamedTuple):
    """What a worker knows about one finished run of a task, as plain values.

    One flat record per run (TaskEvent's fields first, so the span budget and the task
    metrics take it as it is): a worker may hold thousands between two drains.
    """

    key: Any
    start_ns: int
    end_ns: int
    worker: str  # the worker's address
    thread: int
    nbytes: int
    type_name: str
    error: ErrorInfo | None
    note: Any  # the compute's note (:mod:`otel_graph.cluster.propagation`); None for an untraced task
    retries: int
    phases: tuple[Phase, ...]
    dependencies: tuple[Any, ...]
    dependency_count: int
    dependent_count: int
    run_spec: Any  # None once `functions` has been read from it
    functions: str | None = None
    attempt: int = 1  # 1 + earlier failed runs of this key in its compute here; set by the worker
    span_id: int = 0  # the span id code inside the run was given for its task (.inside_tasks); 0: none


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def worker_identity(worker: Any) -> tuple[str, str]:
    """(address, name) of a worker."""
    name = getattr(worker, "name", None)  # often the integer 0: falsy, but a name
    return safe_text(str(getattr(worker, "address", "") or "")), "" if name is None else safe_text(str(name))


def worker_scheduler(worker: Any) -> str:
    """The address of the worker's scheduler."""
    return safe_text(str(getattr(getattr(worker, "scheduler", None), "address", "") or ""))


def task_run(worker: Any, key: Any, *, note: Any, address: str) -> TaskRun | None:
    """Read a task that just left ``executing``; None if the worker no longer has it."""
    ts = worker.state.tasks.get(key)
    if ts is None:
        return None
    from distributed.metrics import time as worker_time  # the clock distributed stamps startstops with

    now = worker_time()
    stamped = _stamps.pop(key, None)
    delay = stamped if stamped is not None else getattr(worker, "scheduler_delay", 0.0) or 0.0
    # The last compute's; start None: it never ran here (end, set with it, then unread).
    start: float | None = None
    end = 0.0
    # startstops is one list across retries of the task: keep the phases that led up to
    # the last compute (since the one before it) and those after it (its disk-write).
    leading: list[Phase] = []
    since: list[Phase] = []
    for entry in ts.startstops or ():
        action = entry.get("action")
        on_worker_clock = action in ("disk-read", "disk-write")
        offset = 0.0 if on_worker_clock else delay
        began, ended = entry["start"] - offset, entry["stop"] - offset
        if action == "compute":
            start, end = began, ended
            leading, since = since, []
        elif action in ("transfer", "disk-read", "disk-write"):
            source = entry.get("source")
            nbytes = _transfer_bytes(worker, entry) if action == "transfer" else None
            since.append(Phase(action, _ns(began), _ns(ended), source, nbytes))
    phases = leading + since
    if start is None:
        return None  # it never ran here (cancelled before executing)
    # Without its stamp (a process pool's task), the compute is undone with the current
    # scheduler_delay, which a heartbeat may have changed since it began. Read as ending
    # after now, it ended that much earlier: else its span could end after the compute that
    # waited for it (the client's root of a persist).
    excess = end - now
    if excess > 0:
        start, end, shift = start - excess, end - excess, _ns(excess)
        phases = [p if p.action in ("disk-read", "disk-write") else
                  p._replace(start_ns=p.start_ns - shift, end_ns=p.end_ns - shift) for p in phases]
    annotations = ts.annotations or {}
    dependencies = ts.dependencies
    return TaskRun(
        key=key, start_ns=_ns(start), end_ns=_ns(end), worker=address,
        thread=int(worker.state.threads.get(key, 0) or 0),
        nbytes=int(ts.nbytes) if ts.nbytes is not None else -1,
        type_name=_type_name(ts.type),
        error=_error(ts) if ts.state == "error" else None,
        note=note,
        retries=int(annotations.get("retries") or 0),
        phases=tuple(phases),
        dependencies=tuple(dep.key for dep in islice(dependencies, MAX_DEPENDENCIES)),
        dependency_count=len(dependencies),
        dependent_count=len(ts.dependents),
        run_spec=ts.run_spec,
    )


def _type_name(kind: Any) -> str:
    if kind is None:
        return ""
    return getattr(kind, "__qualname__", None) or str(kind)


def _error(ts: Any) -> ErrorInfo:
    exception = getattr(ts.exception, "data", ts.exception)
    if isinstance(exception, (bytes, bytearray, memoryview)):
        # The worker keeps the exception pickled (distributed.core.error_message); it made
        # these bytes itself from the task's own exception and checked that they load.
        try:
            import pickle

            exception = pickle.loads(exception)
        except Exception:
            exception = None
    if isinstance(exception, BaseException):
        # The core's naming and bounds; the stack is the worker's text (this copy has none).
        described = describe_exception(exception)
        type_name, message = described.type_name, described.message
    else:
        text = ts.exception_text or ""
        type_name, message = text.split("(", 1)[0] or "Exception", text
    stack = ts.traceback_text or ""
    return ErrorInfo(type_name, message, f"{stack}{type_name}: {message}")


def _transfer_bytes(worker: Any, entry: dict) -> int | None:
    log = getattr(worker, "transfer_incoming_log", None)
    if not log:
        return None
    # The log holds the same (scheduler-clock) start; the transfer is recent, so look back a little.
    for record in islice(reversed(log), _TRANSFER_LOOKBACK):
        if record.get("start") == entry["start"] and record.get("who") == entry.get("source"):
            return int(record.get("total", 0))
    return None


def spill_totals(worker: Any) -> dict[tuple[str, str], float]:
    """Spilling since the worker started: {(disk-write|disk-read, bytes|count|seconds): total}.

    From ``worker.digests_total``, whose keys end in ``(..., activity, unit)``; summed
    over what caused it (executing a task, gathering dependencies, ...).
    """
    totals: dict[tuple[str, str], float] = {}
    for key, value in dict(worker.digests_total).items():
        if isinstance(key, tuple) and len(key) >= 2 and key[-2] in ("disk-write", "disk-read"):
            pair = (key[-2], key[-1])
            totals[pair] = totals.get(pair, 0.0) + float(value)
    return totals


def current_task(*, default: Any = None) -> tuple[Any, Any] | Any:
    """(worker, key) of the task running on this thread, when called from inside a task."""
    try:
        from distributed.worker import get_worker, thread_state

        key = getattr(thread_state, "key", None)
        return (get_worker(), key) if key is not None else default
    except Exception:
        return default


#: The ``scheduler_delay`` each task's compute times were stamped with, by key: set by the
#: runners :func:`run_tasks_within` installs, taken by :func:`task_run`. The worker's
#: estimate moves at every heartbeat, so today's would misplace a run stamped with
#: yesterday's. Two workers of one process running one key at once share an entry (the
#: later wins; the other falls back to the current estimate). Runs never read (cancelled
#: while executing) are forgotten in bulk past _STAMPS_KEPT.
_stamps: dict[Any, float] = {}
_STAMPS_KEPT = 4096


def _stamp(key: Any, time_delay: float) -> None:
    if len(_stamps) >= _STAMPS_KEPT:
        _stamps.clear()
    _stamps[key] = time_delay


class TaskContexts(Protocol):
    """What makes a task's context current while it runs (:class:`otel_graph.cluster.inside_tasks.TaskContexts`)."""

    def entered(self, worker: Any, key: Any) -> Any:
        """Called as the task starts, in the thread (or coroutine) that runs it: a token for
        :meth:`left`, or None for nothing to leave. Never raises."""
        ...

    def left(self, token: Any) -> None: ...


class TaskRanges(Protocol):
    """What runs a worker's tasks in ranges (:class:`otel_graph.telemetry.nvtx_ranges.Ranges`)."""

    def task_started(self, key: Any) -> bool: ...
    def task_ended(self) -> None: ...
    def task_range_started(self, key: Any) -> Any: ...
    def range_ended(self, handle: Any) -> None: ...


class _NoRanges:
    def task_started(self, key: Any) -> bool:
        return False

    def task_ended(self) -> None:
        return None

    def task_range_started(self, key: Any) -> Any:
        return None

    def range_ended(self, handle: Any) -> None:
        return None


def run_tasks_within(ranges: TaskRanges | None = None, *, contexts: TaskContexts | None = None) -> Callable[[], None]:
    """Wrap the runners of this process's workers' tasks; returns what puts distributed back
    as it was.

    Each run's ``time_delay`` is kept for :func:`task_run`. With ``contexts``, a task runs
    between ``entered(worker, key)`` and ``left(its token)``. With ``ranges``, a task on a
    thread runs between ``task_started(key)`` and ``task_ended()`` (if it started), in the
    thread that runs it, and an ``async def`` task between ``task_range_started(key)`` and
    ``range_ended(its result)``.

    Tasks on a thread pool executor only: distributed sends another executor (a process pool)
    ``_run_task_simple`` by name, pickled when the pool gets to it, and a wrapper put back in
    between would no longer pickle. A task's error is caught inside the runner, so its
    traceback holds no frame of ours.
    """
    import distributed.worker as module

    run_threaded, run_async, running_worker = module._run_task, module._run_task_async, module.get_worker
    hooks: TaskRanges = ranges if ranges is not None else _NoRanges()
    started, ended, range_started, range_ended = (hooks.task_started, hooks.task_ended, hooks.task_range_started,
                                                  hooks.range_ended)
    enter, leave = (contexts.entered, contexts.left) if contexts is not None else (_no_context, _no_context)

    @functools.wraps(run_threaded)
    def _run_task(task: Any, data: Any, execution_state: Any, key: Any, active_threads: Any,
                  active_threads_lock: Any, time_delay: float) -> Any:
        _stamp(key, time_delay)
        token = enter(execution_state.get("worker") if type(execution_state) is dict else None, key)
        pushed = False
        try:
            pushed = started(key)
            return run_threaded(task, data, execution_state, key, active_threads, active_threads_lock, time_delay)
        finally:
            if pushed:
                ended()
            if token is not None:
                leave(token)

    @functools.wraps(run_async)
    async def _run_task_async(task: Any, data: Any, time_delay: float) -> Any:
        key = task.key
        _stamp(key, time_delay)
        try:
            worker = running_worker()
        except Exception:  # not set: a runner called some other way
            worker = None
        token = enter(worker, key)
        handle = None
        try:
            handle = range_started(key)
            return await run_async(task, data, time_delay)
        finally:
            range_ended(handle)
            if token is not None:
                leave(token)

    module._run_task, module._run_task_async = _run_task, _run_task_async

    def restore() -> None:
        if module._run_task is _run_task:
            module._run_task = run_threaded
        if module._run_task_async is _run_task_async:
            module._run_task_async = run_async

    return restore


def _no_context(*_: Any) -> None:
    return None


def task_count(worker: Any) -> int:
    return len(worker.state.tasks)


def held_keys(worker: Any) -> Any:
    """The keys of the tasks a worker holds (a live view: test membership, do not keep)."""
    return worker.state.tasks


def is_closing(worker: Any) -> bool:
    """True while a worker shuts down (not when a plugin is merely replaced or removed)."""
    status = getattr(getattr(worker, "status", None), "name", "")
    return status in ("closing", "closed", "closing_gracefully", "failed")


def stream_open(worker: Any) -> bool:
    """Whether the worker's stream to the scheduler is up (``Worker.batched_send`` drops
    messages silently while it is not)."""
    comm = getattr(getattr(worker, "batched_stream", None), "comm", None)
    return comm is not None and not comm.closed()


def scheduler_connection(worker: Any) -> Any:
    """The connection under the worker's stream to its scheduler (a new one at every
    reconnect); None while there is none."""
    return getattr(getattr(worker, "batched_stream", None), "comm", None)


#: The keyword a worker's ``keep-alive`` message carries otel_graph's payload in.
WORKER_SAYS = "otel_graph"


def say_to_scheduler(worker: Any, payload: dict[str, Any]) -> None:
    """Send ``payload`` to the worker's scheduler, from any thread, in order with the
    worker's own messages (as ``Worker.log_event`` does), as a ``keep-alive`` message
    (``{"op": "keep-alive", "otel_graph": payload}``): every scheduler handles that op,
    and ignores what it carries unless otel_graph's plugin reads it
    (:func:`.scheduler.read_worker_says`). Dropped while the worker is not connected.
    The payload gets ``sent``: the worker's clock as it goes on the stream."""

    def send() -> None:
        worker.batched_send({"op": "keep-alive", WORKER_SAYS: {**payload, "sent": time.time()}})

    if getattr(worker, "thread_id", None) == threading.get_ident():
        send()
    else:
        worker.loop.add_callback(send)


def close_stream(worker: Any, *, timeout_s: float) -> Any:
    """An awaitable that sends what the worker's stream to the scheduler holds, then closes
    it (``BatchedSend.close``); None when there is no stream."""
    stream = getattr(worker, "batched_stream", None)
    if stream is None or getattr(stream, "comm", None) is None:
        return None
    return stream.close(timeout=timeout_s)
