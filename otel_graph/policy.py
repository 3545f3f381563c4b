"""The span budget: which tasks of a compute get their own span, and what stands for the rest.

Jaeger's UI turns sluggish above about 2,000 spans in a trace and fails near
40,000, and a million-task graph would otherwise be a million spans. So each compute
gets ``max_task_spans`` task spans (``OTEL_GRAPH_MAX_TASK_SPANS``) and spends them
like this:

* a **failed task always gets its span**, whatever the budget;
* the **first half** of the budget goes to tasks in the order they finish, so a
  long job shows spans while it runs;
* the **second half** keeps the **slowest** of the remaining tasks, the ones a user
  hunting a bottleneck wants to see; they are emitted when the compute ends;
* every other task is folded into **one aggregate span per prefix**, carrying
  ``dask.task.count`` and duration statistics.

Every task is accounted for: the sum of ``dask.task.count`` over a trace's spans
(1 for a plain task span) equals the compute's ``dask.graph.tasks``.

>>> emitted, folded = [], []
>>> plan = SpanPlan(budget=2, emit=lambda ev, prefix: emitted.append(ev.key),
...                 emit_aggregate=lambda agg: folded.append((agg.prefix, agg.count)))
>>> from otel_graph.events import TaskEvent
>>> for i, ms in enumerate([5, 1, 9, 2]):
...     plan.add(TaskEvent(f"t-{i}", 0, ms * 10**6, 1, 1, 8, "int", None), "t")
>>> plan.finish()
>>> emitted, folded
(['t-0', 't-2'], [('t', 2)])
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

from otel_graph.events import TaskEvent


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

    def add(self, ev: TaskEvent) -> None:
        duration = ev.end_ns - ev.start_ns
        if self.count == 0:
            self.duration_min_ns = self.duration_max_ns = duration
            self.start_ns, self.end_ns = ev.start_ns, ev.end_ns
        else:
            if duration < self.duration_min_ns:
                self.duration_min_ns = duration
            if duration > self.duration_max_ns:
                self.duration_max_ns = duration
            if ev.start_ns < self.start_ns:
                self.start_ns = ev.start_ns
            if ev.end_ns > self.end_ns:
                self.end_ns = ev.end_ns
        self.count += 1
        self.duration_sum_ns += duration
        if ev.nbytes > 0:
            self.nbytes += ev.nbytes


class SpanPlan:
    """Routes one compute's events to task spans or aggregates, within the budget."""

    def __init__(
        self,
        *,
        budget: int | None,
        emit: Callable[[TaskEvent, str], None],
        emit_aggregate: Callable[[Aggregate], None],
    ) -> None:
        self._emit = emit
        self._emit_aggregate = emit_aggregate
        self._unlimited = budget is None
        self._stream_left = 0 if budget is None else budget - budget // 2
        self._slow_capacity = 0 if budget is None else budget // 2
        self._slowest: list[tuple[int, int, TaskEvent, str]] = []
        self._seq = 0
        self._aggregates: dict[str, Aggregate] = {}
        self.task_spans = 0
        self.aggregated_tasks = 0

    def add(self, ev: TaskEvent, prefix: str) -> None:
        if self._unlimited or ev.error is not None:
            self._span(ev, prefix)
        elif self._stream_left > 0:
            self._stream_left -= 1
            self._span(ev, prefix)
        elif self._slow_capacity:
            self._seq += 1
            item = (ev.end_ns - ev.start_ns, self._seq, ev, prefix)
            if len(self._slowest) < self._slow_capacity:
                heapq.heappush(self._slowest, item)
            else:
                _, _, evicted, evicted_prefix = heapq.heappushpop(self._slowest, item)
                self._fold(evicted, evicted_prefix)
        else:
            self._fold(ev, prefix)

    def finish(self) -> None:
        """Emit the kept slow tasks and one aggregate span per prefix; call once."""
        for _, _, ev, prefix in sorted(self._slowest, key=lambda item: item[2].start_ns):
            self._span(ev, prefix)
        self._slowest.clear()
        for aggregate in self._aggregates.values():
            self._emit_aggregate(aggregate)
        self._aggregates.clear()

    def _span(self, ev: TaskEvent, prefix: str) -> None:
        self.task_spans += 1
        self._emit(ev, prefix)

    def _fold(self, ev: TaskEvent, prefix: str) -> None:
        self.aggregated_tasks += 1
        aggregate = self._aggregates.get(prefix)
        if aggregate is None:
            aggregate = self._aggregates[prefix] = Aggregate(prefix)
        aggregate.add(ev)
