"""A successful task's span attributes, encoded straight from its record.

:func:`otel_graph.telemetry.attributes.task_attributes` builds a dict per task span, which the encoder
then walks pair by pair (:mod:`otel_graph.export.otlp_wire`). Where spans are encoded as they
end, :class:`TaskAttributeEncoder` writes the same attributes as OTLP bytes without the
dict, reusing whole the runs of fields that repeat from span to span:

* where the task ran and what it returned: prefix, worker, thread, result type;
* its result's size;
* its dependency and dependent counts, and its dependencies' keys where they are few;
* its functions' names.

Only the key, and many dependencies' keys, are encoded afresh. The bytes are the ones the
generic path writes for the same span, field for field and in the same order
(``tests/test_task_encoding.py``), so a span reads the same whichever path made it. A
failed task, whose span carries an exception event and an error status, takes the
generic path.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from otel_graph.export.otlp_spans import encoded_attribute, encoded_attributes, keyed_string
from otel_graph.export.otlp_wire import attribute_head
from otel_graph.naming import INT64_MAX, MAX_DEPENDENCIES
from otel_graph.telemetry.attributes import TaskFacts, dependency_keys, key_text, task_facts, type_text, worker_text
from otel_graph.telemetry.events import AT_KEY, AT_NBYTES, AT_THREAD, AT_TYPE, AT_WORKER

#: Entries each cache keeps at most; past it, it starts again empty.
_CACHE_ENTRIES = 4096
_KEY_HEAD = attribute_head("dask.task.key")


class TaskAttributeEncoder:
    """``task_attributes(ev, prefix, graph, state)`` of a task that succeeded, as encoded fields.

    Safe to call from several threads: each cache is a dict read and written whole, and an
    entry two threads make at once is made the same by both.
    """

    def __init__(self) -> None:
        self._where: dict[tuple[Any, ...], bytes] = {}
        self._sizes: dict[int, bytes] = {}
        self._counts: dict[tuple[int, int], bytes] = {}
        self._functions: dict[str, bytes] = {}
        #: Dependency sets of at most MAX_DEPENDENCIES keys: a collection's tasks depend on
        #: the same keys compute after compute. Fewer entries: each holds its keys.
        self._dependencies: dict[frozenset[Any], bytes] = {}

    def __call__(self, ev: Any, prefix: str, graph: Mapping | None, state: Mapping | None, memo: Any) -> bytes:
        """Raises where a field cannot be encoded: the generic path then logs and leaves it out."""
        return self.encode(ev, prefix, task_facts(ev.key, graph, state), memo)

    def encode(self, ev: Any, prefix: str, facts: TaskFacts, memo: Any) -> bytes:
        """:meth:`__call__`, given what the graph and Dask's state say of the task (:func:`task_facts`).
        ``ev`` is a TaskEvent or a plain task record: read by position (events.AT_*)."""
        parts = [keyed_string(_KEY_HEAD, key_text(ev[AT_KEY]))]
        worker, thread, type_name = ev[AT_WORKER], ev[AT_THREAD], ev[AT_TYPE]
        where = self._where.get((prefix, worker, thread, type_name))
        if where is None:
            where = _remember(self._where, (prefix, worker, thread, type_name), encoded_attributes({
                "dask.task.prefix": prefix, "dask.worker.id": worker_text(worker), "thread.id": thread,
                "dask.task.type": type_text(type_name)}, memo))
        parts.append(where)
        nbytes = ev[AT_NBYTES]
        if 0 <= nbytes <= INT64_MAX:
            size = self._sizes.get(nbytes)
            if size is None:
                size = _remember(self._sizes, nbytes, encoded_attribute("dask.task.nbytes", nbytes, memo))
            parts.append(size)
        deps, dependents, functions = facts
        if dependents is not None:
            counted = (len(deps), dependents)
            counts = self._counts.get(counted)
            if counts is None:
                counts = _remember(self._counts, counted, encoded_attributes({
                    "dask.task.dependency_count": counted[0], "dask.task.dependent_count": counted[1]}, memo))
            parts.append(counts)
            if deps:
                if len(deps) <= MAX_DEPENDENCIES:
                    known = frozenset(deps)
                    listed = self._dependencies.get(known)
                    if listed is None:
                        listed = _remember(self._dependencies, known, encoded_attribute(
                            "dask.task.dependencies", dependency_keys(deps), memo), limit=_CACHE_ENTRIES // 4)
                else:
                    listed = encoded_attribute("dask.task.dependencies", dependency_keys(deps), memo)
                parts.append(listed)
        if functions:
            named = self._functions.get(functions)
            if named is None:
                named = _remember(self._functions, functions,
                                  encoded_attribute("code.function.name", functions, memo))
            parts.append(named)
        return b"".join(parts)


def _remember(cache: dict, key: Any, value: bytes, *, limit: int = _CACHE_ENTRIES) -> bytes:
    if len(cache) >= limit:
        cache.clear()
    cache[key] = value
    return value
