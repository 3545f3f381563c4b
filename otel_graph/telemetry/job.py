"""Which job a compute is: its name, and the fingerprint of its graph's shape.

Platform engineers run the same Dask jobs every hour or night, and want to be told when one
got slower, processed less or did not run. That needs an identity for a compute that stays
the same from one run to the next:

* ``dask.compute.name``, the job's name: the innermost :func:`name` in effect (a context
  manager or decorator), else the name of the caller's current span, else the qualified name
  of the function that called ``compute()``: the first frame outside Dask, distributed,
  otel_graph, the libraries that compute for their users (xarray, dask-ml, Prefect, ...)
  and the standard library's thread and event-loop machinery. It labels the compute
  metrics, so each job has its own history in Prometheus; a process names at most
  :data:`MAX_NAMES` jobs, the rest :data:`OTHER_NAMES`.
* ``dask.graph.fingerprint``, the graph's shape: 16 hex digits of a BLAKE2b digest over its
  task prefixes with their counts and the prefix-to-prefix dependencies with theirs, in a
  canonical order. The same job on other data of the same shape has the same fingerprint, in
  any process, host or Python run: no ``hash()`` (salted per process) and no keys' tokens go in.

>>> len(fingerprint({"load": 4, "total": 1}, {("load", "total"): 4}))
16
>>> fingerprint({"load": 4, "total": 1}, {("load", "total"): 4}) == fingerprint(
...     {"total": 1, "load": 4}, {("load", "total"): 4})
True
>>> fingerprint({"load": 4, "total": 1}, {("load", "total"): 4}) == fingerprint({"load": 5, "total": 1}, {})
False
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import logging
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from typing import Any, TypeVar, cast

from otel_graph.naming import bounded_text, task_prefix

logger = logging.getLogger("otel_graph")

#: Job names a process labels its compute metrics with; past it, :data:`OTHER_NAMES`.
MAX_NAMES = 200
OTHER_NAMES = "(other jobs)"
#: Longest job name kept.
MAX_NAME_CHARS = 128

_NAME: ContextVar[str | None] = ContextVar("otel_graph_job_name", default=None)
#: The names each ``with otel_graph.name(...)`` replaced, innermost last, per context (thread,
#: asyncio task): one ``name`` object may be entered in many at once.
_REPLACED: ContextVar[tuple[str | None, ...]] = ContextVar("otel_graph_job_names_replaced", default=())
#: Modules whose frames are not the caller's: who called compute() is outside them. Libraries
#: that call compute() for their users are skipped too, as distributed skips them when it
#: records a computation's code (``distributed.diagnostics.computations.ignore-modules``).
_NOT_THE_CALLER = ("dask", "distributed", "otel_graph", "concurrent", "threading", "asyncio", "contextlib",
                   "functools", "runpy", "importlib", "tornado", "_pytest", "pluggy", "xarray", "cudf", "cuml",
                   "dask_cudf", "dask_ml", "dask_expr", "prefect", "xgboost", "rechunker", "zarr", "pint", "numpy",
                   "pandas")
F = TypeVar("F", bound=Callable[..., Any])
#: Code object -> the job name its frames give (None: not the caller's; look further out).
#: A compute is begun from a few call sites, so the walk out of Dask is a lookup a frame.
_WHERE: dict[Any, str | None] = {}
_MAX_WHERE = 4096
_UNSEEN = object()


class name:  # noqa: N801 (used as otel_graph.name("nightly-etl"), like contextlib's lowercase helpers)
    """Name the computes run inside: ``with otel_graph.name("nightly-etl"):`` or ``@otel_graph.name("etl")``
    (on a function or an ``async def``).

    It holds for the thread or asyncio task that entered it (and asyncio tasks started inside it).
    One object may be entered by many threads at once; leaving it never raises.
    """

    def __init__(self, job: str) -> None:
        if not isinstance(job, str) or not job.strip():
            raise TypeError(f"otel_graph.name() takes a non-empty string, not {job!r}")
        self.job = bounded_text(job.strip(), MAX_NAME_CHARS)

    def __enter__(self) -> name:
        _REPLACED.set((*_REPLACED.get(), _NAME.get()))
        _NAME.set(self.job)
        return self

    def __exit__(self, *exc_info: object) -> None:
        replaced = _REPLACED.get()
        if replaced:  # else entered in another context: nothing of this one's to put back
            _REPLACED.set(replaced[:-1])
            _NAME.set(replaced[-1])

    def __call__(self, function: F) -> F:
        if inspect.iscoroutinefunction(function):
            @functools.wraps(function)
            async def named_coroutine(*args: Any, **kwargs: Any) -> Any:
                with self:  # its body runs when awaited, not when called
                    return await function(*args, **kwargs)

            return named_coroutine  # type: ignore[return-value]

        @functools.wraps(function)
        def named(*args: Any, **kwargs: Any) -> Any:
            with self:
                return function(*args, **kwargs)

        return named  # type: ignore[return-value]


def current_name(span_name: str | None) -> str:
    """The running compute's job name: :func:`name`'s, else ``span_name`` (the caller's current
    span's, if any), else the calling function's qualified name, else ``__main__``."""
    named = _NAME.get()
    if named is not None:
        return named
    if span_name:
        return bounded_text(span_name, MAX_NAME_CHARS)
    return _caller()


def _caller() -> str:
    frame: Any = sys._getframe(2)
    while frame is not None:
        code = frame.f_code
        where = _WHERE.get(code, _UNSEEN)
        if where is _UNSEEN:
            where = _where(frame)
            if len(_WHERE) < _MAX_WHERE:  # code objects: bounded by the program, but lambdas in exec()...
                _WHERE[code] = where
        if where is not None:
            return cast(str, where)
        frame = frame.f_back
    return "__main__"


def _where(frame: Any) -> str | None:
    """``module.qualname`` of a frame's function; None in a module of :data:`_NOT_THE_CALLER`."""
    module = str(frame.f_globals.get("__name__", "") or "")
    if module.partition(".")[0] in _NOT_THE_CALLER:
        return None
    code = frame.f_code
    qualname = getattr(code, "co_qualname", code.co_name)  # 3.11 and later: with its class
    return bounded_text(module if qualname == "<module>" else f"{module}.{qualname}", MAX_NAME_CHARS)


class Names:
    """The job names one process labels metrics with: the first :data:`MAX_NAMES`, then one for the rest."""

    def __init__(self, limit: int = MAX_NAMES) -> None:
        self._seen: set[str] = set()
        self._limit = limit
        self.folded = 0

    def label(self, job: str) -> str:
        if job in self._seen:
            return job
        if len(self._seen) < self._limit:
            self._seen.add(job)
            return job
        self.folded += 1
        if self.folded == 1:
            logger.warning("otel_graph: computes of more than %d job names ran in this process; the compute metrics "
                           "of further names are labelled dask.compute.name=%r (their spans keep the name)",
                           self._limit, OTHER_NAMES)
        return OTHER_NAMES


def graph_shape(dependencies: Mapping[Any, Iterable[Any]]) -> tuple[dict[str, int], dict[tuple[str, str], int]]:
    """Prefix counts and prefix-to-prefix dependency counts of a graph given as key -> the keys it needs.

    About 1.7 µs a task: run off the user's thread, at the compute's end (a dependency that
    is not itself a key of ``dependencies`` still names its edge's source)."""
    prefix_of: dict[Any, str] = {}
    counts: dict[str, int] = {}
    edges: dict[tuple[str, str], int] = {}
    for key, needs in dependencies.items():
        own = prefix_of.get(key)
        if own is None:
            own = prefix_of[key] = task_prefix(key)
        counts[own] = counts.get(own, 0) + 1
        for dependency in needs:
            source = prefix_of.get(dependency)
            if source is None:
                source = prefix_of[dependency] = task_prefix(dependency)
            edge = (source, own)
            edges[edge] = edges.get(edge, 0) + 1
    return counts, edges


def graph_fingerprint(dependencies: Mapping[Any, Iterable[Any]]) -> str:
    """:func:`fingerprint` of :func:`graph_shape`."""
    return fingerprint(*graph_shape(dependencies))


def fingerprint(counts: Mapping[str, int], edges: Mapping[tuple[str, str], int]) -> str:
    """16 hex digits naming a graph's shape; see the module docs."""
    digest = hashlib.blake2b(digest_size=8)
    for line in _canonical(counts, edges):
        digest.update(line.encode("utf-8", "backslashreplace"))
        digest.update(b"\n")
    return digest.hexdigest()


def _canonical(counts: Mapping[str, int], edges: Mapping[tuple[str, str], int]) -> Iterator[str]:
    # Tab-separated and sorted: no prefix holds a newline that task_prefix keeps, and a
    # prefix's tabs cannot make two different shapes print alike, as counts follow the names.
    for prefix in sorted(counts):
        yield f"task\t{prefix!r}\t{counts[prefix]}"
    for (source, target) in sorted(edges):
        yield f"edge\t{source!r}\t{target!r}\t{edges[(source, target)]}"

