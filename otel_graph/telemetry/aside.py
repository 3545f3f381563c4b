"""Small computes set aside, and their telemetry made together, a batch at a time.

Made one by one, each small compute's spans would be made in code and data that Dask has
just evicted from the CPU's caches, at about three times what they cost made in a run. So
a small compute that succeeded, handled by the thread that computed it
(:data:`~otel_graph.telemetry.tracker.INLINE_MAX_TASKS`), is set aside (:meth:`Aside.add`):
what the graph and Dask's state say of its tasks is read at once into plain values, its root
span ends into a plain tuple (:meth:`~otel_graph.telemetry.compute_span.ComputeSpan.end_aside`),
and the compute is forgotten. The spans and metrics of those set aside are made together
(:meth:`Aside.make`), encoded into one batch for the span processors there when they ended:

* by the thread that sets aside the last of :data:`ASIDE_COMPUTES` (or of :data:`ASIDE_SPANS`
  spans): a compute's return pays for making them;
* at the tracker's next full drain, in a flush, at stop, in the span processors'
  ``force_flush`` (``before_flush``), or when the span processors change.

Until made, their spans count as unbuilt (:attr:`Aside.spans`, in the tracker's
``unprocessed()``). Spans are made under the :class:`~otel_graph.telemetry.drain.Drainer`'s
``building`` lock, and not at all once it halts, like any other.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from opentelemetry.trace import NonRecordingSpan

from otel_graph.telemetry.attributes import TaskFacts, attributes_of, task_facts
from otel_graph.telemetry.compute_record import ComputeRecord
from otel_graph.telemetry.compute_span import ComputeSpan
from otel_graph.telemetry.drain import Drainer
from otel_graph.telemetry.encoded_batch import UNSET_STATUS, span_context_of
from otel_graph.telemetry.events import AT_ERROR, AT_KEY
from otel_graph.telemetry.job import graph_fingerprint
from otel_graph.telemetry.metrics import Compute, Run, run_totals

logger = logging.getLogger("otel_graph")

#: Small computes set aside whose telemetry is then made together (see the module's docstring).
ASIDE_COMPUTES = 64
#: ... or as soon as they are to make this many spans: a compute's return pays for making them.
ASIDE_SPANS = 512


class Aside:
    """The computes set aside, and their spans still to make.

    It shares the tracker's lock and its dict of computes in flight: a compute leaves that
    dict as it is set aside, under that lock, so that no drain takes it meanwhile.
    ``encoding`` is the emitter's (None: spans are not encoded as they end, and nothing is
    set aside).
    """

    def __init__(self, drainer: Drainer, *, lock: threading.Lock, records: dict[ComputeRecord, None],
                 encoding: Callable[[], Any] | None) -> None:
        self._drainer = drainer
        self._lock = lock
        self._records = records
        self._encoding = encoding
        self._whole_budget = drainer.whole_budget
        #: In plain values: the encoding (processors) their spans go to, then a compute each.
        self._items: list[Any] = []
        #: The spans of the computes set aside, counted until made (the tracker's unprocessed()).
        self.spans = 0
        self._listed = 0  # of those spans, the ones in _items (not being made elsewhere)
        #: Set by the tracker's stop(): nothing is set aside after it.
        self.closed = False

    def add(self, record: ComputeRecord, end_ns: int) -> bool:
        """Set a small compute that succeeded aside, for its telemetry to be made with others'
        (:data:`ASIDE_COMPUTES`, :meth:`make`): what the graph and Dask's state say of its
        tasks is read now, into plain values, and the compute is forgotten. False, having done
        nothing, for any other: it is drained here (the tracker's ``_drain_here``). Never raises.
        ``end_ns``: the compute's end, just set as ``record.end_ns`` (which is typed optional)."""
        span = record.span
        # A span each, so within the half of the span budget given to tasks as they come: the
        # drainer's _whole(), inline (a call fewer a compute).
        if record.error is not None or record.seen or record.lost or record.outer or not record.sampled \
                or self._encoding is None or type(span) is not ComputeSpan or record.plan is not None \
                or record.task_span_ids or len(record.sink) > self._whole_budget:
            return False
        try:
            # Its spans go to the processors there now, even if made after an application adds one.
            encoding = self._encoding()
            if encoding is None:
                return False
            sink, graph, state = record.sink, record.graph, record.state
            # A failed task's span carries its exception: such a compute is drained here.
            facts = []
            known: dict[int, str] = {}  # the graph's callables, named once (it keeps them alive meanwhile)
            for raw in sink:  # a loop, not a comprehension: no call of its own
                if raw[AT_ERROR] is not None:
                    return False
                facts.append((raw, task_facts(raw[AT_KEY], graph, state, keep=True, known=known)))
            tasks = tuple(facts)
            for _ in range(2):
                with self._lock:
                    # The tracker's thread may have drained some of it while it ran (and given it
                    # a plan) since the checks above: then it is drained here.
                    if self.closed or record.claimed or record not in self._records or record.seen \
                            or record.plan is not None or len(record.sink) != len(tasks):
                        return False
                    aside = self._items
                    if not aside or (aside[0][0] is encoding[0] and aside[0][1] is encoding[1]):
                        root = span.end_aside(end_ns)
                        if root is None:
                            return False
                        del self._records[record]
                        if not aside:
                            aside.append(encoding)
                        aside.append((root, record.scheduler, tasks, record.job,
                                      None if state is None else state.get("dependencies")))
                        self.spans += len(tasks) + 1
                        self._listed += len(tasks) + 1
                        full = len(aside) > ASIDE_COMPUTES or self._listed >= ASIDE_SPANS
                        break
                # The processors changed: those set aside go to the ones there when they ended.
                self.make()
            else:
                return False
        except Exception:
            self._drainer.processing_errors += 1
            logger.debug("otel_graph: failed to set a compute aside", exc_info=True)
            return False
        record.graph = record.state = None
        if full:
            self.make()
        return True

    def make(self, timeout_s: float | None = None) -> None:
        """The spans and metrics of the computes set aside so far (:meth:`add`), made and
        queued together; a compute that fails is counted and its root ended marked so. From any
        thread: never raises. Waits at most ``timeout_s`` for spans being made elsewhere (an
        application's processor may block in them): then makes nothing."""
        try:
            if not self._drainer.building.acquire(timeout=-1 if timeout_s is None else max(0.0, timeout_s)):
                return
            try:
                self._make_now()
            finally:
                self._drainer.building.release()
        except Exception:
            self._drainer.processing_errors += 1
            logger.debug("otel_graph: failed to process computes set aside", exc_info=True)

    def _make_now(self) -> None:
        """Under the drainer's ``building``."""
        if self._drainer.halt:
            return  # counted as unbuilt
        with self._lock:
            aside, self._items = self._items, []  # still counted in spans, until made
            self._listed = 0
        if not aside:
            return
        items = aside[1:]
        drainer = self._drainer
        try:
            batch = drainer.emitter.encoded_batch(aside[0])
        except Exception:  # none of them can be made: lost, and counted
            drainer.processing_errors += len(items) - 1  # and one by make()
            with self._lock:
                self.spans -= sum(len(item[2]) + 1 for item in items)
            raise
        made = 0
        runs: list[Run] = []
        computes: list[Compute] = []
        encode, label = drainer.task_encoder.encode, drainer.metrics.label
        try:
            for root, scheduler, tasks, job, dependencies in items:
                if drainer.halt:
                    break  # stop(drain=False): the rest stay counted as unbuilt
                made += len(tasks) + 1
                try:
                    done = self._spans_of(batch, root, scheduler, tasks, label, encode, dependencies)
                except Exception:
                    drainer.processing_errors += 1
                    logger.debug("otel_graph: failed to process a compute", exc_info=True)
                    done = None
                    root[5]["otel_graph.processing_error"] = True  # its root still ends, marked
                    try:
                        batch.add(*root, (), UNSET_STATUS)
                    except Exception as exc:
                        drainer.span_failed(exc)
                # Only computes that succeeded are set aside; one we failed to process has unknown totals.
                failed_tasks, nbytes = run_totals(done) if done is not None else (-1, -1)
                if done:
                    runs += done
                computes.append((scheduler, False, (root[4] - root[3]) / 1e9, job, len(tasks), failed_tasks, nbytes))
            drainer.metrics.record_computes(computes, runs)
        finally:
            with self._lock:
                self.spans -= made
            if batch:
                drainer.queue_batch(batch)

    def _spans_of(self, batch: Any, root: tuple[Any, ...], scheduler: str,
                  tasks: tuple[tuple[tuple[Any, ...], TaskFacts], ...], label: Any, encode: Any,
                  dependencies: Any) -> list[Run]:
        """One set-aside compute's spans, into ``batch``; its tasks' runs."""
        # The encoders read a span context's fields by position: the plain tuple serves as one.
        name, context, parent, start_ns, end_ns, attributes = root
        attributes["dask.graph.tasks"] = len(tasks)
        if dependencies is not None:
            attributes["dask.graph.fingerprint"] = graph_fingerprint(dependencies)
        runs, left = batch.add_tasks(context, tasks, label, scheduler, encode)
        if left:  # attributes that could not be encoded: made the generic way, which says what it left out
            facts = dict(tasks)
            parent_span = NonRecordingSpan(span_context_of(context))
            for ev, prefix in left:
                try:
                    self._drainer.emitter.emit(parent=parent_span, name=self._drainer.metrics.span_name(prefix),
                                               start_ns=ev.start_ns, end_ns=ev.end_ns,
                                               attributes=attributes_of(ev, prefix, facts[tuple(ev)]))
                except Exception as exc:
                    self._drainer.span_failed(exc)
        batch.add(name, context, parent, start_ns, end_ns, attributes, (), UNSET_STATUS)
        return runs

    def release(self) -> None:
        """Let go of what is set aside, unmade (it stays counted in :attr:`spans`)."""
        self._items = []
