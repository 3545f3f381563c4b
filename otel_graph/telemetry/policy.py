"""The span budget: which tasks of a compute get their own span, and what stands for the rest.

Jaeger's UI turns sluggish above about 2,000 spans in a trace and fails near
40,000, and a million-task graph would otherwise be a million spans. So each compute
gets ``max_task_spans`` task spans (``OTEL_GRAPH_MAX_TASK_SPANS``) and spends them
like this:

* a **failed task always gets its span**, whatever the budget, and so does a task
  inside which spans were started (they need their parent; ``keep``);
* the **first half** of the budget goes to tasks in the order they finish, so a
  long job shows spans while it runs;
* the **second half** keeps the **slowest** of the remaining tasks, the ones a user
  hunting a bottleneck wants to see; they are emitted when the compute ends;
* every other task is folded into **one aggregate span per prefix**, carrying
  ``dask.task.count`` and duration statistics. A compute folds its first
  :data:`MAX_AGGREGATES` prefixes so; the tasks of any later one share one aggregate
  named :data:`OTHER_PREFIXES` (a key without a ``-``, ``"x0"``, is a prefix of its
  own, and 10^5 of them must not become 10^5 aggregate spans).

Every task is accounted for: the sum of ``dask.task.count`` over a trace's spans
(1 for a plain task span) equals the compute's ``dask.graph.tasks``.

>>> emitted, folded = [], []
>>> plan = SpanPlan(budget=2, emit=lambda ev, prefix: emitted.append(ev.key),
...                 emit_aggregate=lambda agg: folded.append((agg.prefix, agg.count)))
>>> from otel_graph.telemetry.events import TaskEvent
>>> events = [TaskEvent(f"t-{i}", 0, ms * 10**6, 1, 1, 8, "int", None) for i, ms in enumerate([5, 1, 9, 2])]
>>> plan.add(events, ["t"] * 4)
>>> plan.finish()
>>> emitted, folded
(['t-0', 't-2'], [('t', 2)])
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from otel_graph.naming import fold_prefix

if TYPE_CHECKING:
    from otel_graph.telemetry.events import ErrorInfo

#: Prefixes a compute (on a worker: its share there) gets aggregate spans of their own
#: for; the tasks of later ones share one, whose prefix and name are OTHER_PREFIXES.
MAX_AGGREGATES = 100


class TaskRecord(Protocol):
    """What the budget reads of a task's run: a :class:`~otel_graph.telemetry.events.TaskEvent`
    (local schedulers) or a distributed worker's ``TaskRun``, which starts with its fields."""

    @property
    def key(self) -> Any: ...

    @property
    def start_ns(self) -> int: ...

    @property
    def end_ns(self) -> int: ...

    @property
    def nbytes(self) -> int: ...

    @property
    def error(self) -> ErrorInfo | None: ...


#: The record type one plan routes (and hands back to its ``emit`` and ``hold``).
R = TypeVar("R", bound=TaskRecord)


@dataclass
class Aggregate:
    """The tasks of one prefix that did not get spans of their own."""

    prefix: str
    count: int = 0
    duration_sum_ns: int = 0
    duration_min_ns: int = 0
    duration_max_ns: int = 0
    start_ns: int = 0
    end_ns: int = 0
    nbytes: int = 0

    def add(self, events: Sequence[TaskRecord]) -> None:
        durations = [ev.end_ns - ev.start_ns for ev in events]
        starts = min(ev.start_ns for ev in events)
        ends = max(ev.end_ns for ev in events)
        if self.count == 0:
            self.duration_min_ns, self.duration_max_ns = min(durations), max(durations)
            self.start_ns, self.end_ns = starts, ends
        else:
            self.duration_min_ns = min(self.duration_min_ns, min(durations))
            self.duration_max_ns = max(self.duration_max_ns, max(durations))
            self.start_ns = min(self.start_ns, starts)
            self.end_ns = max(self.end_ns, ends)
        self.count += len(events)
        self.duration_sum_ns += sum(durations)
        self.nbytes += sum(ev.nbytes for ev in events if ev.nbytes > 0)


class SpanPlan(Generic[R]):
    """Routes one compute's events (task records of type ``R``) to task spans or aggregates,
    within the budget."""

    def __init__(
        self,
        *,
        budget: int | None,
        emit: Callable[[R, str], None],
        emit_aggregate: Callable[[Aggregate], None],
        keep: Container[Any] = (),
        hold: Callable[[R], R] | None = None,
        max_aggregates: int | None = None,
    ) -> None:
        self._emit = emit
        #: Makes an event kept for later (a slow candidate) lighter: drop what only its span needs.
        self._hold = hold
        self._emit_aggregate = emit_aggregate
        #: Keys whose task must get its span (spans were started inside it), read live.
        self._keep = keep
        self._unlimited = budget is None
        self._stream_left = 0 if budget is None else budget - budget // 2
        self._slow_capacity = 0 if budget is None else budget // 2
        self._slowest: list[tuple[int, int, R, str]] = []
        self._seq = 0
        self._aggregates: dict[str, Aggregate] = {}
        #: Prefixes folded so far, over settles too: at most max_aggregates.
        self._folded_prefixes: set[str] = set()
        self._max_aggregates = MAX_AGGREGATES if max_aggregates is None else max_aggregates
        self.task_spans = 0
        self.aggregated_tasks = 0

    def add(self, events: list[R], prefixes: list[str]) -> None:
        """Route a batch of events: spans now, slow candidates to the heap, the rest folded."""
        folded: dict[str, list[R]] = {}
        slowest, capacity, keep = self._slowest, self._slow_capacity, self._keep
        for ev, prefix in zip(events, prefixes, strict=False):
            if self._unlimited or ev.error is not None or (keep and ev.key in keep):
                self._span(ev, prefix)
                continue
            if self._stream_left > 0:
                self._stream_left -= 1
                self._span(ev, prefix)
                continue
            if capacity:
                duration = ev.end_ns - ev.start_ns
                if len(slowest) < capacity:
                    self._seq += 1
                    heapq.heappush(slowest, (duration, self._seq, self._held(ev), prefix))
                    continue
                if duration > slowest[0][0]:  # so ev stays, and the fastest kept one is folded
                    self._seq += 1
                    _, _, ev, prefix = heapq.heappushpop(slowest, (duration, self._seq, self._held(ev), prefix))
            group = folded.get(prefix)
            if group is None:
                group = folded[prefix] = []
            group.append(ev)
        for prefix, group in folded.items():
            self._fold(group, prefix)

    def finish(self) -> None:
        """Emit the kept slow tasks and one aggregate span per prefix.

        Called again after more events (a distributed worker settles a compute whenever
        it goes quiet), it emits only what came since, within what is left of the budget.
        """
        for _, _, ev, prefix in sorted(self._slowest, key=lambda item: item[2].start_ns):
            self._span(ev, prefix)
        self._slow_capacity -= len(self._slowest)
        self._slowest.clear()
        for aggregate in self._aggregates.values():
            self._emit_aggregate(aggregate)
        self._aggregates.clear()

    def _held(self, ev: R) -> R:
        return ev if self._hold is None else self._hold(ev)

    def _span(self, ev: R, prefix: str) -> None:
        self.task_spans += 1
        self._emit(ev, prefix)

    def _fold(self, events: list[R], prefix: str) -> None:
        self.aggregated_tasks += len(events)
        prefix = fold_prefix(prefix, self._folded_prefixes, limit=self._max_aggregates)
        aggregate = self._aggregates.get(prefix)
        if aggregate is None:
            aggregate = self._aggregates[prefix] = Aggregate(prefix)
        aggregate.add(events)
