"""What runs a task and records it, in this process or a process pool's worker.

The one part of capture (:mod:`otel_graph.capture.local`) that Dask's processes scheduler sends
to its pool: each worker process unpickles :func:`run_remote` and imports this module to
run its batches. Dask's processes scheduler starts a pool per compute (with ``spawn``, a
fresh interpreter each time), so this module imports nothing but the standard library,
Dask (loaded there already) and :mod:`otel_graph.telemetry.events`: no OpenTelemetry, whose
imports would cost each worker process 10-25 ms, every compute. With NVTX ranges on and a
tool attached, a pool process also imports :mod:`otel_graph.telemetry.nvtx_ranges` and the
``nvtx`` binding (which imports numpy where it is installed).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from otel_graph.telemetry.events import describe_exception

_time_ns = time.time_ns
_get_ident = threading.get_ident


def _sizeof() -> Callable[[Any], int]:
    from dask.sizeof import sizeof

    # sizeof(x) is sizeof.dispatch(type(x))(x); caching the dispatch per type halves its cost.
    by_type: dict[type, Callable[[Any], int]] = {}

    def nbytes(value: Any) -> int:
        try:
            kind = type(value)
            measure = by_type.get(kind)
            if measure is None:
                measure = by_type[kind] = sizeof.dispatch(kind)
            return int(measure(value))
        except Exception:  # a result whose __sizeof__ raises or lies must not fail the task
            return -1

    return nbytes


_nbytes = _sizeof()


def execute(key: Any, task_info: Any, dumps: Callable[[Any], Any], loads: Callable[[Any], Any],
            get_id: Callable[[], Any], pack_exception: Callable[[BaseException, Any], Any],
            emit: Callable[[tuple[Any, ...]], Any], parent: Any) -> tuple[Any, Any, bool]:
    """Dask's ``execute_task`` plus one event; hot path, so no allocation beyond the event.

    The event is a plain tuple of :class:`TaskEvent`'s fields, which the tracker makes one
    of. The garbage collector stops tracking a plain tuple of plain values at its first
    pass, and a tuple subclass never: every event awaiting the tracker would be traversed by
    every full collection.
    ``parent.key`` names the running task to spans its code starts (otel_graph.telemetry.task_context).
    """
    start = _time_ns()
    parent.key = key
    try:
        task, data = loads(task_info)
        result = task(data)
        end = _time_ns()
        parent.key = None
        worker = get_id()
        packed = dumps((result, worker))
        thread = _get_ident()
        emit((key, start, end, thread if worker is None else worker, thread,
              _nbytes(result), type(result).__name__, None))
        return key, packed, False
    except BaseException as exc:
        end = _time_ns()
        parent.key = None
        worker = get_id()
        emit((key, start, end, _get_ident() if worker is None else worker, _get_ident(),
              -1, "", describe_exception(exc)))
        # The sync scheduler's pack_exception re-raises: the event is already out.
        return key, pack_exception(exc, dumps), True


#: What Dask's pool sends per task: key, task_info, dumps, loads, get_id, pack_exception.
TaskArgs = tuple[Any, Any, Any, Any, Any, Any]


def in_ranges(started: Callable[[Any], bool], ended: Callable[[], None]) -> Callable[..., tuple[Any, Any, bool]]:
    """:func:`execute` inside an NVTX range (:mod:`otel_graph.telemetry.nvtx_ranges`):
    ``started(key)`` before, ``ended()`` after if it started one, in the thread that runs the task."""

    def execute_in_range(key: Any, task_info: Any, dumps: Callable[[Any], Any], loads: Callable[[Any], Any],
                         get_id: Callable[[], Any], pack_exception: Callable[[BaseException, Any], Any],
                         emit: Callable[[tuple[Any, ...]], Any], parent: Any) -> tuple[Any, Any, bool]:
        pushed = started(key)
        try:
            return execute(key, task_info, dumps, loads, get_id, pack_exception, emit, parent)
        finally:  # the sync scheduler's pack_exception raises
            if pushed:
                ended()

    return execute_in_range


def run_remote(batch: list[TaskArgs], run: Callable[..., tuple[Any, Any, bool]] = execute) -> Batch:
    events: list[tuple[Any, ...]] = []  # TaskEvent's fields
    nobody = NoTask()  # another process: its spans have no parent here to join
    out = Batch(run(*args, events.append, nobody) for args in batch)
    out.events = events
    return out


def run_remote_in_ranges(batch: list[TaskArgs]) -> Batch:
    """:func:`run_remote` with each task in an NVTX range, where a tool is attached to this process."""
    from otel_graph.telemetry.nvtx_ranges import process_ranges

    try:
        ranges = process_ranges()
    except Exception:  # checked where the compute began: a pool process must not fail the batch
        ranges = None
    if ranges is None:
        return run_remote(batch)
    return run_remote(batch, in_ranges(ranges.task_started, ranges.task_ended))


class Batch(list):
    """A batch's results as Dask expects them, carrying the batch's events across processes."""

    events: list[tuple[Any, ...]]


class NoTask:
    """What capture sets keys on where no span can be parented (tasks in other processes)."""

    __slots__ = ("key",)

    def __init__(self) -> None:
        self.key: Any = None
