"""TaskEvent: the one record every capture path produces, and the helpers that make it safe.

Capture (``otel_graph.local`` for Dask's local schedulers) records a
:class:`TaskEvent` per task on the hot path: two ``time.time_ns()`` readings, the
worker and thread, the result's size and type name, and, for a failed task, an
:class:`ErrorInfo`. Nothing else happens per task there. Turning events into spans
and metric points happens later, in bulk, in ``otel_graph.tracker``.

Events cross process boundaries (the processes scheduler sends them back with the
results), so they hold only picklable plain values, never the task's arguments or
result: those may hold secrets and are never recorded.

>>> ev = TaskEvent(("inc-1", 0), 10, 25, 7, 7, 28, "int", None)
>>> ev.duration_ns
15
>>> key_to_str(("inc-1", 0))
"('inc-1', 0)"
"""

from __future__ import annotations

import functools
import traceback
from typing import Any, NamedTuple

from dask.utils import key_split

# Uncached, for keys that run once: see task_prefix.
_split = getattr(key_split, "__wrapped__", key_split)
# For the names of tuple keys, which many keys of a graph share. Not dask's own cache of
# 100,000: a name lives for one compute, and a loop of computes would fill that with ours
# (~0.4 kB a name; +8 MB every 20,000 computes, measured by bench_scale's loop-sync).
_split_name = functools.lru_cache(maxsize=4096)(_split)

#: Longest key string kept; longer keys are cut and marked, so a pathological key
#: cannot blow up every span and log line it appears in.
MAX_KEY_CHARS = 512
#: Longest task prefix: it names spans and labels metrics, and a key with no ``-`` in it
#: is its own prefix (a 10 MB string key once made 20 MB export requests).
MAX_PREFIX_CHARS = 128
#: Stands for the prefixes past a limit, in span names and aggregates: a key with no
#: ``-`` is its own prefix, and 10^5 of them must not become 10^5 names.
OTHER_PREFIXES = "(other prefixes)"
MAX_MESSAGE_CHARS = 4096
#: Largest integer OTLP carries (int64): a lying ``__sizeof__`` can claim more, and one
#: such value would fail its whole export.
INT64_MAX = (1 << 63) - 1
MAX_STACK_CHARS = 16384
#: Dependency keys a task span lists (``dask.task.dependencies``): a collection's tasks can
#: depend on 10^4 keys, and a span need not carry them all.
MAX_DEPENDENCIES = 32


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


def safe_text(text: str) -> str:
    """``text``, made encodable as UTF-8: lone surrogates (from ``os.fsdecode``, a
    ``surrogateescape`` decode, or a hostile ``__str__``) are shown escaped.

    Every string that leaves for an exporter passes here once: protobuf refuses to
    encode a surrogate, and one such attribute would fail its whole export batch.

    >>> safe_text("ok-" + chr(0xDCFF))
    'ok-\\\\udcff'
    >>> safe_text("ünïcødé")
    'ünïcødé'
    """
    if text.isascii():
        return text
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode()
    return text


def _cut(text: str, limit: int) -> str:
    if len(text) > limit:
        text = f"{text[:limit]}… [{len(text) - limit} more characters]"
    return safe_text(text)


def key_to_str(key: Any) -> str:
    """A readable string for a Dask key of any shape: str, bytes, nested tuples, unicode.

    Non-UTF-8 bytes are shown escaped rather than failing.

    >>> key_to_str(b"x-\\xff")
    'x-\\\\xff'
    >>> key_to_str(("a", ("b", 1), b"c"))
    "('a', ('b', 1), b'c')"
    """
    if type(key) is str:
        text = key
    elif isinstance(key, bytes):
        text = key.decode("utf-8", "backslashreplace")
    else:
        try:
            text = repr(key) if isinstance(key, tuple) else str(key)
        except Exception:  # a user key type with a broken __repr__/__str__
            text = f"<{type(key).__name__} key>"
    return _cut(text, MAX_KEY_CHARS)


def fold_prefix(prefix: str, seen: set[str], *, limit: int) -> str:
    """``prefix`` itself while ``seen`` holds it or fewer than ``limit`` others (it is added),
    else :data:`OTHER_PREFIXES`: the first ``limit`` prefixes keep their own label.

    >>> seen = set()
    >>> [fold_prefix(p, seen, limit=2) for p in ["a", "b", "c", "a"]]
    ['a', 'b', '(other prefixes)', 'a']
    """
    if prefix in seen:
        return prefix
    if len(seen) < limit:
        seen.add(prefix)
        return prefix
    return OTHER_PREFIXES


def task_prefix(key: Any) -> str:
    """``dask.utils.key_split``, but total: a key it cannot split (non-UTF-8 bytes) still gets a name.

    >>> task_prefix(("load-8a6f31c2", 3))
    'load'
    >>> task_prefix(b"\\xff-raw")
    'Other'

    A key as telemetry writes it (a tuple key as its repr; the report reads those) splits alike:

    >>> task_prefix("('rechunk-merge-9a8b7c6d', 0, 3)"), task_prefix("inc-5f3c"), task_prefix("x")
    ('rechunk-merge', 'inc', 'x')
    """
    # A collection's tuple keys share their name, which hits a cache (0.05 us); a string key
    # mostly runs once (delayed's 'inc-<uuid>'), and a miss costs twice an uncached split
    # (0.53 against 0.24 us), and 10^5 one-off keys held in a cache are ~18 MB a loop of
    # small computes grows by (tests/test_scale.py).
    split = _split
    while type(key) is tuple and key:
        key, split = key[0], _split_name
    if split is _split and type(key) is str:
        # key_split's answer for the usual one-off key, "name-<token>", in a few steps: a second
        # word that is not all letters ends the prefix at the first word (0.1 against 0.7 µs);
        # most tokens start with a digit, the rest (a uuid's 'd6770bcb') are read to their end.
        # Not for a 32-character head (key_split may call it "data"), nor one _cut would change.
        head, _, rest = key.partition("-")
        if head[:1].isalpha() and (not rest[:1].isalpha() or not rest.partition("-")[0].isalpha()) \
                and len(head) != 32 and len(head) <= MAX_PREFIX_CHARS and head.isascii():
            return head
    try:
        prefix = split(key)
    except Exception:
        return "Other"
    # Called per task in the tracker: the common short ASCII prefix skips _cut's calls.
    if len(prefix) > MAX_PREFIX_CHARS or not prefix.isascii():
        return _cut(prefix, MAX_PREFIX_CHARS)
    return prefix


def describe_exception(exc: BaseException) -> ErrorInfo:
    """The exception's type, message and stack trace, bounded in size; never raises."""
    kind = type(exc)
    module = kind.__module__
    name = kind.__qualname__ if module in ("builtins", None) else f"{module}.{kind.__qualname__}"
    name = _cut(str(name), MAX_KEY_CHARS)
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
    return ErrorInfo(name, _cut(message, MAX_MESSAGE_CHARS), safe_text(stack))
