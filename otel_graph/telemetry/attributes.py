"""What a task's span says: its attributes, made from a task record and the graph.

A task span is named after the task prefix (``dask.utils.key_split``), never the key,
so span names stay few: a key with no ``-`` is a prefix of its own, so past the
process's first ``metrics.MAX_METRIC_PREFIXES`` prefixes, spans are named
``(other prefixes)`` (``dask.task.prefix`` still says which). It carries:

=============================  =====================================================
``dask.task.key``              the key as a readable string
``dask.task.prefix``           the prefix (also the span name)
``dask.worker.id``             thread ident (sync, threads) or worker pid (processes)
``thread.id``                  the thread that ran the task
``dask.task.nbytes``           ``dask.sizeof`` of the result
``dask.task.type``             the result's type name
``dask.task.dependencies``     dependency keys, at most :data:`~otel_graph.naming.MAX_DEPENDENCIES`
``dask.task.dependency_count`` all dependencies, even past that bound
``dask.task.dependent_count``  tasks that consume this one's result
``code.function.name``         the function; for fused tasks and ``toolz.compose`` the inner ones,
                               innermost first, ``, ``-joined
``error.type``                 failed tasks only, with an ``exception`` event and ERROR status
=============================  =====================================================

:func:`task_attributes` makes that dict from a record (:class:`~otel_graph.telemetry.events.TaskEvent`),
the graph and Dask's state, in two steps a caller may take apart: :func:`task_facts` (what the
graph says, which may be read before the graph is gone) then :func:`attributes_of`. The spans
that stand for tasks without one of their own have theirs too (:func:`aggregate_attributes`,
:func:`recovered_attributes`), as does a failed task's ``exception`` event.
:mod:`otel_graph.telemetry.task_encoding` writes the same attributes straight to OTLP bytes.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from functools import lru_cache
from itertools import islice
from typing import Any

from otel_graph.naming import INT64_MAX, MAX_DEPENDENCIES, MAX_KEY_CHARS, key_to_str, safe_text
from otel_graph.telemetry.events import ErrorInfo, TaskEvent
from otel_graph.telemetry.function_names import function_names
from otel_graph.telemetry.policy import Aggregate


@lru_cache(maxsize=4096)
def worker_text(worker: int | str) -> str:
    return str(worker)


# Distributed reports a result type's __qualname__, which may be set to any string, a
# lone surrogate included; there are few distinct types.
type_text = lru_cache(maxsize=1024)(safe_text)

# A key is rendered once as its own span's key and again in each dependent's list.
_rendered = lru_cache(maxsize=1 << 14)(key_to_str)


def key_text(key: Any) -> str:
    """:func:`otel_graph.naming.key_to_str`, remembered; a short ASCII string is its own text,
    with nothing remembered: most keys are, and many are seen once (a delayed call's)."""
    if type(key) is str and len(key) <= MAX_KEY_CHARS and key.isascii():
        return key
    return _rendered(key)


def run_attributes(ev: Any, prefix: str) -> dict[str, Any]:
    """What every task span says of its run, on any scheduler: key, prefix, where, and its outcome."""
    attributes: dict[str, Any] = {
        "dask.task.key": key_text(ev.key),
        "dask.task.prefix": prefix,
        "dask.worker.id": worker_text(ev.worker),
        "thread.id": ev.thread,
    }
    if ev.error is None:
        attributes["dask.task.type"] = type_text(ev.type_name)
        if 0 <= ev.nbytes <= INT64_MAX:
            attributes["dask.task.nbytes"] = ev.nbytes
    else:
        attributes["error.type"] = ev.error.type_name
    return attributes


def dependency_keys(deps: Collection[Any]) -> tuple[str, ...]:
    """``dask.task.dependencies``: the keys as text, sorted; past :data:`~otel_graph.naming.MAX_DEPENDENCIES`, a
    bounded sample of them rather than 10^4 keys rendered per span."""
    shown = deps if len(deps) <= MAX_DEPENDENCIES else islice(deps, MAX_DEPENDENCIES)
    return tuple(sorted(map(key_text, shown)))


#: What the graph and Dask's state say of a task, for its span: its dependencies (a collection
#: of keys), how many tasks depend on it (None: no state to say), its functions' names.
TaskFacts = tuple[Collection[Any], "int | None", "str | None"]


def task_facts(key: Any, graph: Mapping | None, state: Mapping | None, *, keep: bool = False,
               known: dict[int, str] | None = None) -> TaskFacts:
    """The task's :data:`TaskFacts`. With ``keep``, in plain values, which keep neither the graph
    nor Dask's state alive (its dependencies as a tuple, not Dask's own set). ``known``: a dict
    shared by the calls for one graph's tasks, while it is alive (:class:`_FunctionNames`)."""
    if state is None:
        deps: Collection[Any] = ()
        dependents = None
    else:
        deps = state["dependencies"].get(key, ())
        dependents = len(state["dependents"].get(key, ()))
        if keep:
            deps = tuple(deps) if deps else ()
    return deps, dependents, None if graph is None else function_names(graph.get(key), known=known)


def task_attributes(ev: TaskEvent, prefix: str, graph: Mapping | None, state: Mapping | None) -> dict[str, Any]:
    return attributes_of(ev, prefix, task_facts(ev.key, graph, state))


def attributes_of(ev: TaskEvent, prefix: str, facts: TaskFacts) -> dict[str, Any]:
    """:func:`task_attributes`, given the task's :data:`TaskFacts`."""
    attributes = run_attributes(ev, prefix)
    deps, dependents, functions = facts
    if dependents is not None:
        attributes["dask.task.dependency_count"] = len(deps)
        attributes["dask.task.dependent_count"] = dependents
        if deps:
            attributes["dask.task.dependencies"] = dependency_keys(deps)
    if functions:
        attributes["code.function.name"] = functions
    return attributes


def aggregate_attributes(agg: Aggregate) -> dict[str, Any]:
    return {
        "dask.task.prefix": agg.prefix,
        "dask.task.count": agg.count,
        "dask.task.aggregate": True,
        "dask.task.duration.sum": agg.duration_sum_ns / 1e9,
        "dask.task.duration.min": agg.duration_min_ns / 1e9,
        "dask.task.duration.max": agg.duration_max_ns / 1e9,
        "dask.task.duration.mean": agg.duration_sum_ns / agg.count / 1e9,
        "dask.task.nbytes": min(agg.nbytes, INT64_MAX),
    }


def recovered_attributes(*, prefix: str, count: int, duration_s: float, worker: str) -> dict[str, Any]:
    """Tasks whose telemetry their worker took with it, as the scheduler counted them."""
    return {
        "dask.task.prefix": prefix,
        "dask.task.count": count,
        "dask.task.aggregate": True,
        "dask.task.recovered": True,
        "dask.task.duration.sum": duration_s,
        "dask.task.duration.mean": duration_s / count,
        "dask.worker.id": worker,
    }


def exception_event_attributes(error: ErrorInfo) -> dict[str, str]:
    return {
        "exception.type": error.type_name,
        "exception.message": error.message,
        "exception.stacktrace": error.stacktrace,
    }
