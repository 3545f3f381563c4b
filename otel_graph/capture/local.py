"""Capture from Dask's local schedulers: sync, threads and processes.

This module is the only reader of ``dask.local`` internals. Every local scheduler
ends in ``dask.local.get_async``, which hands batches of ready tasks to an executor
as ``submit(batch_execute_tasks, batch)``. We wrap ``get_async`` in the three modules
that call it and, per compute, wrap its ``submit`` so that each batch runs through
:func:`otel_graph.capture.task_runner.execute` instead of Dask's ``execute_task``. That gives us, per task and on
the worker itself:

* the real start and end of the task, read with ``time.time_ns()`` in the thread or
  process that ran it. The processes scheduler batches tasks and reports them late,
  so times taken on the scheduler side would be off by up to a second;
* the worker and thread, the result's ``dask.sizeof`` and type name;
* the exception a failed task raised, as text.

Per compute we also keep a reference to the converted graph and Dask's own
scheduler ``state`` (dependencies, dependents, cache) by wrapping
``start_state_from_dask``; they are read later, off the hot path.

Why not ``dask.callbacks.Callback``: its registry is one process-global set that
``get_async`` swaps out while it runs, so two threads computing at once lose
callbacks for good. Wrapping per call keeps every compute, from any thread, traced.

In-process executors (sync, threads) append events straight to the compute's list;
process pools send them back attached to the batch's result list. On a pool (threads or
processes), once ``OTEL_GRAPH_EARLY_DRAIN`` events wait (``record.early_at``), capture asks the
tracker to drain them while the compute runs (``record.drain_soon``).
"""

from __future__ import annotations

import importlib
import inspect
import threading
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from functools import partial, wraps
from multiprocessing.pool import ThreadPool
from typing import TYPE_CHECKING, Any, Protocol

from otel_graph.capture.task_runner import execute, in_ranges, run_remote, run_remote_in_ranges
from otel_graph.telemetry.task_context import attach_context, detach_context

if TYPE_CHECKING:
    from dask.local import MultiprocessingPoolExecutor, SynchronousExecutor

    from otel_graph.capture.task_runner import TaskArgs
    from otel_graph.telemetry.compute_record import ComputeRecord
    from otel_graph.telemetry.nvtx_ranges import Ranges

_get_ident = threading.get_ident

#: Modules whose ``get_async`` global we wrap: each scheduler calls the name in its own module.
_GET_ASYNC_MODULES = ("dask.local", "dask.threaded", "dask.multiprocessing")
_EXECUTE_TASK_PARAMS = ["key", "task_info", "dumps", "loads", "get_id", "pack_exception"]


class Tracker(Protocol):
    def begin(self, scheduler: str) -> ComputeRecord | None: ...

    def failed_to_begin(self) -> None: ...

    def end(self, record: ComputeRecord, error: BaseException | None) -> None: ...

    def keep_up(self) -> None: ...


def _run_local(record: ComputeRecord, run: Callable[..., tuple[Any, Any, bool]],
               batch: list[TaskArgs]) -> list[tuple[Any, Any, bool]]:
    emit = record.sink.append
    out = []
    thread = _get_ident()
    token = None
    parent, current = record.parent_for(thread)
    if thread != record.caller:  # a pool thread: its parent in context for this batch only
        token = attach_context(current)
    try:
        for args in batch:
            out.append(run(*args, emit, parent))
    except BaseException:
        # The sync scheduler re-raises a task's exception here: the tasks after it in the
        # batch never run. The one that raised has its event; the rest are accounted lost.
        record.lost += len(batch) - len(out) - 1
        raise
    finally:
        if token is not None:
            detach_context(token)
            # A pool's thread: the tracker drains the compute while it runs (OTEL_GRAPH_EARLY_DRAIN).
            if record.early_at is not None and len(record.sink) >= record.early_at:
                record.drain_soon(record)
    return out


#: dask.local's executor classes, imported at the first compute (an import statement costs
#: every compute a microsecond).
_dask_executors: tuple[type[SynchronousExecutor], type[MultiprocessingPoolExecutor]] | None = None


def _kind_of_executor(submit: Callable) -> tuple[str | None, bool]:
    """(scheduler name or None when unknown, whether tasks run in this process)."""
    global _dask_executors
    if _dask_executors is None:
        import dask.local

        _dask_executors = (dask.local.SynchronousExecutor, dask.local.MultiprocessingPoolExecutor)
    sync_executor, pool_executor = _dask_executors
    owner = getattr(submit, "__self__", None)
    if isinstance(owner, sync_executor):
        return "sync", True
    if isinstance(owner, ThreadPoolExecutor):
        return "threads", True
    if isinstance(owner, pool_executor) and isinstance(owner.pool, ThreadPool):
        return "threads", True
    if isinstance(owner, (ProcessPoolExecutor, pool_executor)):
        return "processes", False
    return None, False


def _scheduler_from_get_id(get_id: Callable | None) -> str:
    module = getattr(get_id, "__module__", "") or ""
    if module.endswith("threaded"):
        return "threads"
    if module.endswith("multiprocessing"):
        return "processes"
    return "sync"


class LocalCapture:
    """Installs and removes the wrappers; one instance per instrumentation.

    ``ranges`` (this process has an NVTX tool attached): each task also runs inside an NVTX
    range (:mod:`otel_graph.telemetry.nvtx_ranges`), here or in a pool's processes, which a
    tool attaches to as it does to this one.
    """

    def __init__(self, tracker: Tracker, *, ranges: Ranges | None = None) -> None:
        self._tracker = tracker
        self._execute = execute if ranges is None else in_ranges(ranges.task_started, ranges.task_ended)
        self._run_remote = run_remote if ranges is None else run_remote_in_ranges
        self._originals: dict[tuple[str, str], Any] = {}
        self._starting = threading.local()

    @staticmethod
    def check_supported() -> None:
        """Fail with a clear message if this Dask's internals are not the ones we adapt."""
        import dask.local

        missing = [n for n in ("get_async", "batch_execute_tasks", "start_state_from_dask", "execute_task")
                   if not hasattr(dask.local, n)]
        if missing:
            raise RuntimeError(f"otel_graph does not support this dask version: dask.local lacks {missing}")
        params = list(inspect.signature(dask.local.execute_task).parameters)
        if params != _EXECUTE_TASK_PARAMS:
            raise RuntimeError(
                f"otel_graph does not support this dask version: execute_task takes {params}"
            )

    def install(self) -> None:
        self.check_supported()
        import dask.local

        self._batch_execute = dask.local.batch_execute_tasks
        attr = "get_async"  # a name ModuleType does not declare: set with setattr
        for name in _GET_ASYNC_MODULES:
            module = importlib.import_module(name)
            original = getattr(module, attr)
            self._originals[(name, attr)] = original
            setattr(module, attr, self._wrap_get_async(original))
        original_start = dask.local.start_state_from_dask
        self._originals[("dask.local", "start_state_from_dask")] = original_start
        dask.local.start_state_from_dask = self._wrap_start_state(original_start)

    def uninstall(self) -> None:
        for (name, attr), original in self._originals.items():
            setattr(importlib.import_module(name), attr, original)
        self._originals.clear()

    def _wrap_start_state(self, original: Callable) -> Callable:
        starting = self._starting

        @wraps(original)
        def start_state_from_dask(dsk: Any, *args: Any, **kwargs: Any) -> Any:
            state = original(dsk, *args, **kwargs)
            record = getattr(starting, "record", None)
            if record is not None:
                starting.record = None
                record.graph = dsk
                record.state = state
            return state

        return start_state_from_dask

    def _wrap_get_async(self, original: Callable) -> Callable:
        tracker = self._tracker
        starting = self._starting
        wrap_submit = self._wrap_submit

        @wraps(original)
        def get_async(submit: Callable[..., Any], num_workers: int, dsk: Any, result: Any,
                      *args: Any, **kwargs: Any) -> Any:
            kind, in_process = _kind_of_executor(submit)
            if kind is None:
                get_id = kwargs.get("get_id", args[1] if len(args) > 1 else None)
                kind = _scheduler_from_get_id(get_id)
            try:
                record = tracker.begin(kind)
            except Exception:  # e.g. an application's span processor raising in on_start
                tracker.failed_to_begin()
                record = None
            if record is None:
                return original(submit, num_workers, dsk, result, *args, **kwargs)
            token = attach_context(record.context)
            previous, starting.record = getattr(starting, "record", None), record
            try:
                value = original(wrap_submit(submit, record, in_process), num_workers, dsk, result,
                                 *args, **kwargs)
            except BaseException as exc:
                _drop_own_frames(exc)  # first: the compute span's stack trace is the user's too
                tracker.end(record, exc)
                if isinstance(exc, Exception):  # not on Ctrl-C: that must stop at once
                    tracker.keep_up()
                raise  # bare: Python 3.11 and later add no frame of ours back (3.10: this one stays)
            else:
                tracker.end(record, None)
                tracker.keep_up()
                return value
            finally:
                starting.record = previous
                detach_context(token)

        return get_async

    def _wrap_submit(self, submit: Callable, record: ComputeRecord, in_process: bool) -> Callable:
        batch_execute = self._batch_execute
        runner = partial(_run_local, record, self._execute) if in_process else self._run_remote

        def traced_submit(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            if fn is not batch_execute or kwargs or len(args) != 1:
                return submit(fn, *args, **kwargs)
            batch = args[0]
            record.submitted += len(batch)
            try:
                future = submit(runner, batch)
            except BaseException:  # e.g. a pool already shut down: those tasks never ran
                record.submitted -= len(batch)
                raise
            if not in_process:
                future.add_done_callback(partial(_deliver_remote, record, len(batch)))
            return future

        return traced_submit


def _drop_own_frames(exc: BaseException) -> None:
    """Unlink capture's frames (this module's and the task runner's) from a failed compute's
    traceback, wherever they ran.

    The user's traceback must be the one they would see without otel_graph: Dask's
    ``shorten_traceback`` drops its own scheduler frames (``admin.traceback.shorten``),
    and ours stand in for some of them (``execute`` for ``execute_task``). A task's
    traceback comes back from a pool thread or, through tblib, from another process, so
    frames are known by their file, not their code object. The last frame is always kept,
    as Dask keeps it: were the error ours, that is where it was raised. On Python 3.10 a
    bare ``raise`` restores the frame of the wrapper re-raising, so one frame of ours
    (``get_async``) stays there.
    """
    own = _OWN_FILES
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None and tb.tb_frame.f_code.co_filename in own:
        tb = tb.tb_next
    exc.__traceback__ = tb
    while tb is not None and tb.tb_next is not None:
        following = tb.tb_next
        if following.tb_next is not None and following.tb_frame.f_code.co_filename in own:
            tb.tb_next = following.tb_next
        else:
            tb = following


#: Where capture's frames come from: this module, and the task runner it sends to pools.
_OWN_FILES = frozenset({_drop_own_frames.__code__.co_filename, execute.__code__.co_filename})


def _deliver_remote(record: ComputeRecord, count: int, future: Future) -> None:
    # Runs on the pool's result thread, before Dask's own callback sees the batch.
    if future.cancelled() or future.exception() is not None:
        record.lost += count
        return
    events = getattr(future.result(), "events", None)
    if events is None:
        record.lost += count
    else:
        record.sink.extend(events)
        if record.early_at is not None and len(record.sink) >= record.early_at:
            record.drain_soon(record)
