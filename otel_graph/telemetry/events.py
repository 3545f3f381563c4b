"""TaskEvent: the one record every capture path produces, and a failed task's error as text.

Capture (``otel_graph.capture.local`` for Dask's local schedulers) records a
:class:`TaskEvent` per task on the hot path: two ``time.time_ns()`` readings, the
worker and thread, the result's size and type name, and, for a failed task, an
:class:`ErrorInfo`. Nothing else happens per task there. Turning events into spans
and metric points happens later, in bulk, in ``otel_graph.telemetry.tracker``.

Events cross process boundaries (the processes scheduler sends them back with the
results), so they hold only picklable plain values, never the task's arguments or
result: those may hold secrets and are never recorded.

>>> ev = TaskEvent(("inc-1", 0), 10, 25, 7, 7, 28, "int", None)
>>> ev.duration_ns
15

The limits and names a record's fields are written under (keys, prefixes, sizes) are in
:mod:`otel_graph.naming`, which the offline report shares.
"""

from __future__ import annotations

import traceback
from typing import Any, NamedTuple

from otel_graph.naming import MAX_KEY_CHARS, MAX_MESSAGE_CHARS, MAX_STACK_CHARS, bounded_text, safe_text


class ErrorInfo(NamedTuple):
    """What a failed task raised, as text: the exception itself may not pickle."""

    type_name: str
    message: str
    stacktrace: str


class TaskEvent(NamedTuple):
    key: Any
    start_ns: int
    end_ns: int
    worker: int
    thread: int
    nbytes: int
    type_name: str
    error: ErrorInfo | None

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


#: A task record's fields by position, where a record (a plain tuple of TaskEvent's fields)
#: is read without being made a TaskEvent: on the hot path, making one per task costs a call
#: and an object.
AT_KEY, AT_START, AT_END, AT_WORKER, AT_THREAD, AT_NBYTES, AT_TYPE, AT_ERROR = (
    TaskEvent._fields.index(name)
    for name in ("key", "start_ns", "end_ns", "worker", "thread", "nbytes", "type_name", "error"))


def describe_exception(exc: BaseException) -> ErrorInfo:
    """The exception's type, message and stack trace, bounded in size; never raises."""
    kind = type(exc)
    module = kind.__module__
    name = kind.__qualname__ if module in ("builtins", None) else f"{module}.{kind.__qualname__}"
    name = bounded_text(str(name), MAX_KEY_CHARS)
    try:
        message = str(exc)
    except Exception:
        message = "<exception message could not be rendered>"
    try:
        stack = "".join(traceback.format_exception(kind, exc, exc.__traceback__))
    except Exception:
        stack = f"{name}: {message}"
    # Keep the end of the stack: the frame that raised is the one a user needs.
    if len(stack) > MAX_STACK_CHARS:
        stack = f"[{len(stack) - MAX_STACK_CHARS} characters cut]…{stack[-MAX_STACK_CHARS:]}"
    return ErrorInfo(name, bounded_text(message, MAX_MESSAGE_CHARS), safe_text(stack))
