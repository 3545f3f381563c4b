"""One compute in flight: what capture writes into it, and what the tracker derives.

:meth:`Tracker.begin <otel_graph.telemetry.tracker.Tracker.begin>` makes a
:class:`ComputeRecord` per compute, holding its ``dask.compute`` root span. Local capture
then writes into it, from whatever thread runs the compute or its tasks:

* ``sink``: a plain tuple of :class:`~otel_graph.telemetry.events.TaskEvent`'s fields per
  task run, appended (an atomic ``list.append``, no lock);
* ``submitted`` and ``lost``: the tasks handed to the executor, and those that will never
  report;
* ``graph`` and ``state`` (the converted graph, Dask's scheduler state), read later, off
  the hot path, for the task spans' attributes.

Cluster capture notes instead the scheduler's address (``cluster``), the spans opened
around the compute (``outer``) and the scheduler's task count (``graph_tasks``). Everything
else is the tracker's: how far its drain got (``seen``, ``in_spans``), its span plan, its
progress spans, whether a thread is draining it (``claimed``).

A task that starts spans of its own runs in the compute's context, with a
:class:`~otel_graph.telemetry.task_context.TaskParent` per thread current
(:meth:`ComputeRecord.parent_for`): the caller's context, its baggage say, carries on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import TraceFlags

from otel_graph.telemetry.policy import SpanPlan
from otel_graph.telemetry.task_context import TaskParent, with_span

if TYPE_CHECKING:
    from otel_graph.telemetry.events import TaskEvent

_get_ident = threading.get_ident
_SAMPLED = TraceFlags.SAMPLED

#: Results whose size is measured per memory reading; beyond it the total is scaled up.
HELD_SAMPLE = 1024


def _no_drain(record: ComputeRecord) -> None:
    """``drain_soon`` of a compute that is only drained every interval (``early_at`` None)."""


class ComputeRecord:
    """One compute: what capture writes (``sink``, ``submitted``, ``lost``) and what we derive."""

    __slots__ = ("scheduler", "span", "context", "start_ns", "end_ns", "error", "sink", "submitted",
                 "lost", "seen", "in_spans", "graph", "state", "plan", "sampled", "graph_tasks", "cluster",
                 "cluster_events", "task_span_ids", "caller", "parents", "assign_ids", "in_backlog",
                 "progress_ns", "progress_spans", "outer", "claimed", "inline", "batch", "span_context",
                 "early_at", "drain_soon", "nvtx_range", "job", "fingerprint", "failed_tasks", "output_bytes",
                 "shift_ns")

    def __init__(self, scheduler: str, span: trace.Span, start_ns: int, *, assign_ids: bool = False,
                 context: Context | None = None) -> None:
        """``context`` is the caller's (None: the current one), which its tasks run in, the task parent current."""
        self.scheduler = scheduler
        self.span = span
        #: Its job's name (``dask.compute.name``; :mod:`otel_graph.telemetry.job`), set as it begins.
        self.job = ""
        #: Its ``dask.graph.fingerprint``, once known (dask.distributed: the scheduler's, when it says).
        self.fingerprint: str | None = None
        #: Of the task records drained a slice at a time: those that failed, and their results' bytes
        #: (dask.distributed: the scheduler's count, -1 until it says).
        self.failed_tasks = 0
        self.output_bytes = 0
        #: Span ids given to tasks that had spans started inside them (otel_graph.telemetry.task_context).
        self.task_span_ids: dict[Any, int] = {}
        #: The thread that called compute, and the task parent of each thread running tasks.
        self.caller = _get_ident()
        #: The root's span context: the parent of the task spans.
        self.span_context = span_context = span.get_span_context()
        self.sampled = bool(span_context[3] & _SAMPLED)  # trace_flags, by position: a call fewer
        # An unsampled compute emits no task spans: its tasks' children follow it, unsampled.
        self.assign_ids = assign_ids = assign_ids and self.sampled
        parent = TaskParent(span_context, self.task_span_ids, assign_ids=assign_ids)
        # The caller's own context (its baggage, say) with the task parent current; other
        # threads get this one with their own parent (parent_for).
        self.context = with_span(parent, context)
        self.parents: dict[int, tuple[TaskParent, Context]] = {self.caller: (parent, self.context)}
        self.start_ns = start_ns
        self.end_ns: int | None = None
        #: Added to this process's clock for the compute's own spans (its root, its progress):
        #: a compute a task started in a worker process is drawn on its caller's timeline
        #: (:mod:`otel_graph.cluster.clock`). Set as it begins; 0 elsewhere.
        self.shift_ns = 0
        self.error: BaseException | None = None
        #: The compute's NVTX range (otel_graph.telemetry.nvtx_ranges), where one was started.
        self.nvtx_range: int | None = None
        self.sink: list[tuple[Any, ...]] = []  # TaskEvent's fields: see task_runner.execute
        self.submitted = 0
        self.lost = 0
        self.seen = 0
        #: Tasks that the compute's spans made so far stand for (task spans, aggregates' counts):
        #: of those seen, the rest are yet to be made spans of.
        self.in_spans = 0
        self.graph: Any = None
        self.state: Any = None
        self.plan: SpanPlan[TaskEvent] | None = None
        #: Tasks counted elsewhere (the distributed scheduler); None where we count them ourselves.
        self.graph_tasks: int | None = None
        #: distributed: the scheduler's address, and the cluster events already noted on the span
        #: (a set, made at the first).
        self.cluster: str | None = None
        self.cluster_events: set[tuple[str, str]] | None = None
        #: Counted in the tracker's backlog of ended computes not yet processed.
        self.in_backlog = False
        #: The end of the last progress span; None before the first.
        self.progress_ns: int | None = None
        self.progress_spans = 0
        #: Spans opened around this compute alone, innermost first: they end with it.
        self.outer: tuple[trace.Span, ...] = ()
        #: Being drained, by the tracker's thread or inline by the thread that computed it.
        self.claimed = False
        #: Drained inline when it ends, if small (its root is then a light one: compute_span).
        self.inline = False
        #: While spans of it are made (a compute drained whole, a slice of its task records, its
        #: end): where they are encoded, to be queued together (or None).
        self.batch: Any = None
        #: Task records awaiting the tracker at which capture asks it to drain this compute while
        #: it runs (``drain_soon()``; ``OTEL_GRAPH_EARLY_DRAIN``); None: only every interval.
        self.early_at: int | None = None
        #: Set with ``early_at`` (the tracker's ``_drain_soon``); until then asks for nothing.
        self.drain_soon: Callable[[ComputeRecord], None] = _no_drain

    def all_reported(self) -> bool:
        """Every submitted task has its event (seen, or waiting in the sink) or was lost."""
        return self.seen + len(self.sink) + self.lost >= self.submitted

    def parent_for(self, thread: int) -> tuple[TaskParent, Context]:
        """The parent of spans started by tasks of this compute on ``thread``, and the compute's
        context with it current there (made once per thread)."""
        found = self.parents.get(thread)
        if found is None:
            parent = TaskParent(self.span_context, self.task_span_ids, assign_ids=self.assign_ids)
            found = self.parents[thread] = (parent, with_span(parent, self.context))
        return found

    def held(self) -> tuple[int, int]:
        """Results in Dask's cache right now: (count, bytes). Read from another thread.

        Bytes are measured on at most :data:`HELD_SAMPLE` results and scaled up, so a
        cache of 10^6 results costs a collection a millisecond, not a second.
        """
        state = self.state
        if state is None:
            return 0, 0
        from dask.sizeof import sizeof

        values = list(state["cache"].values())  # one C-level copy: safe while Dask mutates
        count = len(values)
        sample = values if count <= HELD_SAMPLE else values[:: count // HELD_SAMPLE]
        total = 0
        for value in sample:
            try:
                total += int(sizeof(value))
            except Exception:
                continue
        return count, total if len(sample) == count else int(total * count / len(sample))
