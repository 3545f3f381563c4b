"""Delivery without silent loss: a span processor that never drops quietly, and metric counting.

The SDK's ``BatchSpanProcessor`` drops spans when its queue (2,048) fills (it warns, once
a span, and counts them in its own metrics), and a batch its exporter failed is gone:
measured here it lost 79% of spans behind a collector that took 50 ms per batch. Its
queue is bounded by spans, not bytes, and its exit waits out a fixed timeout whatever
the collector does. :class:`ReliableSpanProcessor` instead:

* queues every ended span, up to ``max_queued`` (``OTEL_GRAPH_MAX_QUEUED_SPANS``);
  only past that bound does it drop, oldest first, and it counts what it drops. The
  bound is one of memory: a span held costs about :data:`SPAN_BYTES`, and a span whose
  exception text is larger (a failed task's stack trace) weighs one more per
  :data:`SPAN_BYTES` of it, so a storm of failures behind a dead collector cannot hold
  gigabytes where plain spans would hold the budget's worth;
* exports from one thread in batches; a failed batch goes back to the head of the
  queue and is retried with exponential backoff (capped at 5 s), so data is delivered
  when a collector that was down comes back; a span the exporter raises on is found
  by halving its batch, and given up on alone, counted, rather than blocking the queue;
  after a failure the next batch is half the size (doubling back on success), so a
  batch too large for the collector is not retried whole forever;
* with otel_graph's fast exporters, encodes each span once and cuts a batch into
  requests under :data:`MAX_REQUEST_BYTES`, and takes larger batches (up to
  :data:`CATCH_UP_BATCH`) while the queue is backed up;
* never blocks the caller of ``on_end``: a slow or hung collector only grows the queue;
* :meth:`deliver_remaining` is what runs at exit: it keeps exporting while the
  collector makes progress and gives up after ``timeout_s`` without progress,
  counting what is left as undelivered.

:class:`CountingMetricExporter` wraps a metric exporter to count the data points it
delivered and failed to deliver. Both feed :func:`otel_graph.telemetry.metrics.observe_delivery`
and the one warning printed when anything was not delivered.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from itertools import islice, repeat, starmap
from operator import itemgetter
from typing import Any

from opentelemetry.sdk.metrics import Histogram as HistogramInstrument
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    MetricExporter,
    MetricExportResult,
    MetricsData,
)
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_graph.config import DEFAULT_EXIT_TIMEOUT_S
from otel_graph.export.forks import forked_child_drops, stands_down
from otel_graph.export.histograms import HistogramSet

logger = logging.getLogger("otel_graph")

MAX_BACKOFF_S = 5.0
#: At exit, the wait before the first retry of a failed batch; each next wait is twice
#: the last (0.1, 0.2, 0.4 s...), so a collector back within exit's window is found soon
#: after it returns, and one that stays down draws a handful of tries, not one per 0.1 s.
EXIT_FIRST_RETRY_S = 0.1
#: An export out this long is held by the collector (hung), not just slow: exports take
#: milliseconds, and a hung collector holds one to its timeout (10 s by default).
STUCK_AFTER_S = 1.0
#: Event text (exception messages and stack traces) per export request at most, well
#: under gRPC's and the collector's 4 MB default request limit.
MAX_EVENT_BYTES = 2_500_000
#: A batch's size at most when the queue is backed up (two default batches or more).
#: Each export pays a fixed cost in waits for the GIL: the gRPC call gives it up a dozen
#: times, and a busy main thread then holds it for up to 5 ms each time (~80 ms a request
#: measured under a loop of tiny computes, against ~5 ms idle). Larger batches carry more
#: spans per wait: 1.7x the spans per second in that loop.
CATCH_UP_BATCH = 4096
#: A request's encoded size at most, when the exporter is one of otel_graph's fast ones
#: (which encode each span once, before the batch is cut): half the collector's 4 MB
#: default. A 512-span batch of long keys with 32 dependencies each would pass 4 MB.
MAX_REQUEST_BYTES = 2_000_000
#: Memory one queued task span holds, measured (tracemalloc, 50,000 spans of a 10^5-task
#: graph queued behind a collector that was down): 2.5 kB. The queue's unit of weight.
SPAN_BYTES = 2_500


#: What the span queue holds: a ReadableSpan, or a span encoded as it ended, (its
#: ``ScopeSpans.spans`` entry, its origin: :func:`otel_graph.export.otlp_fast.origin`).
Queued = ReadableSpan | tuple[bytes, int]


def _event_text_bytes(span: ReadableSpan) -> int:
    return sum(len(value) for event in span.events for value in (event.attributes or {}).values()
               if isinstance(value, str))


def _weight(span: Queued) -> int:
    if type(span) is tuple:  # encoded as it ended (otlp_fast.span_entry): its bytes are what it holds
        return 1 + len(span[0]) // SPAN_BYTES
    # Only spans with events are measured: they are rare (failed tasks), and measuring
    # every span would cost the export path on the hot side of a 10^6-task graph.
    return 1 + _event_text_bytes(span) // SPAN_BYTES if span.events else 1


def _takes_encoded_chunks(exporter: SpanExporter) -> bool:
    internals = sys.modules.get("otel_graph.export.sdk_internals")  # not loaded: not one of its exporters
    return internals is not None and internals.takes_encoded_chunks(exporter)


_entry_of = itemgetter(0)


def _take_encoded(queue: deque[Queued], count: int) -> list[Queued] | None:
    """The first ``count`` spans of ``queue``, taken off it, when every one is encoded as it ended
    (the usual batch where the exporter takes encoded chunks); else None, the queue untouched.

    Its loops run in C (``islice``, ``map``, ``starmap``): the export thread holds the GIL here,
    which a compute running meanwhile waits for (512 spans: 18 against the loop's 37 µs).
    """
    if not count or set(map(type, islice(queue, count))) != {tuple}:
        return None
    return list(starmap(queue.popleft, repeat((), count)))


def _encoded_weight(spans: Sequence[Any]) -> int:
    """:func:`_weight` summed over spans encoded as they ended, by loops that run in C where no
    entry reaches SPAN_BYTES (the usual case: only a failed task's exception text does)."""
    if not spans or max(map(len, map(_entry_of, spans))) < SPAN_BYTES:
        return len(spans)
    return sum(map(_weight, spans))


def _take_any(queue: deque[Queued], count: int) -> tuple[list[Queued], int]:
    """At most ``count`` spans taken off ``queue``, and their weight (:func:`_weight`'s, summed)."""
    batch: list[Queued] = []
    event_bytes = 0
    # Failed tasks carry exception events of up to ~20 kB; 512 of them would pass the
    # collector's 4 MB request limit. Only spans with events are measured (cheap), and
    # the batch is closed before their text passes MAX_EVENT_BYTES.
    weight = 0
    for _ in range(count):
        span = queue[0]
        if type(span) is tuple:  # encoded: chunks are cut by their encoded size (_weight's, inline)
            weight += len(span[0]) // SPAN_BYTES
        elif span.events:
            size = _event_text_bytes(span)
            if batch and event_bytes + size > MAX_EVENT_BYTES:
                break
            event_bytes += size
            weight += size // SPAN_BYTES
        batch.append(queue.popleft())
    return batch, weight + len(batch)


class ReliableSpanProcessor(SpanProcessor):
    #: on_end only queues (a hung collector grows the queue): spans may be ended in the
    #: user's thread (otel_graph.telemetry.spans.DirectEmitter.queues_only).
    never_blocks = True

    def __init__(self, exporter: SpanExporter, *, max_queued: int, max_batch: int = 512,
                 schedule_delay_s: float = 0.5) -> None:
        self._exporter = exporter
        self._max_queued = max_queued
        self._max_batch = max_batch
        self._delay = schedule_delay_s
        self._queue: deque[Queued] = deque()
        # Of the spans queued and in flight, in SPAN_BYTES units: a batch the exporter holds
        # (retrying inside a hung call, say) is memory held too.
        self._weight = 0
        self._inflight_weight = 0
        # A plain lock under the condition: spans are queued holding it directly, without
        # the condition's Python-level __enter__ (a fifth of queueing a span, measured).
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._inflight = 0
        self._inflight_since = 0.0
        self._last_ok = True
        self._last_began = 0.0  # when the last completed export attempt began
        self._retry_now = False  # at exit: no more waiting out backoffs
        self._flushing = 0
        self._stopped = False
        self._warned = False
        self._warned_unexportable = False
        # Halved after a failure, doubled back after a success: a batch the collector
        # refuses for its size (gRPC's 4 MB default, reached by 512 failed tasks' stack
        # traces) would otherwise be retried whole, forever, holding up every span behind it.
        self._batch_limit = max_batch
        self._chunked = _takes_encoded_chunks(exporter)
        #: Called first by force_flush, given its timeout in seconds: spans still to be made
        #: (small computes set aside) are made.
        self.before_flush: Callable[[float], None] | None = None
        self.exported = 0
        self.dropped = 0
        self.failed_attempts = 0
        self.undelivered = 0
        self._on_delivered: Callable[[list[ReadableSpan]], None] | None = None
        #: Whether :meth:`on_end_encoded` may be given spans: the exporter takes encoded
        #: chunks (otel_graph's OTLP exporters), and nothing reads delivered spans back.
        self.takes_encoded = self._chunked
        self._forked = False
        self._thread = threading.Thread(target=self._run, name="otel-graph-spans", daemon=True)
        self._thread.start()
        stands_down(self)

    def _after_fork_in_child(self) -> None:
        # The queue is the parent's to deliver, through an exporter the child cannot share.
        self._forked = self._stopped = True
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._queue = deque()
        self._weight = self._inflight = self._inflight_weight = 0
        self.exported = self.dropped = self.failed_attempts = self.undelivered = 0

    # -- SpanProcessor --------------------------------------------------------------
    def on_start(self, span: Any, parent_context: Any = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        self._enqueue((span,), _weight(span))

    @property
    def on_delivered(self) -> Callable[[list[ReadableSpan]], None] | None:
        """Called from the export thread with each batch the collector took (a distributed
        worker reports what it delivered to the scheduler: :mod:`otel_graph.cluster.ledger`)."""
        return self._on_delivered

    @on_delivered.setter
    def on_delivered(self, callback: Callable[[list[ReadableSpan]], None] | None) -> None:
        self._on_delivered = callback
        self.takes_encoded = self._chunked and callback is None  # it reads spans, not their encoding

    def on_end_encoded(self, span: tuple[bytes, int]) -> None:
        """A span encoded as it ended: ``(its entry, its origin)`` (:func:`otlp_fast.origin`)."""
        self._enqueue((span,), _weight(span))

    def on_end_encoded_many(self, spans: list[tuple[bytes, int]]) -> None:
        """Spans encoded as they ended, queued together (one lock round trip)."""
        self._enqueue(spans, _encoded_weight(spans))

    def _enqueue(self, spans: Sequence[Queued], weight: int) -> None:
        with self._lock:  # so a span cannot slip in after deliver_remaining has counted the queue
            if self._stopped:
                self.undelivered += len(spans)
                if self._forked:
                    forked_child_drops("spans")
                return
            queue = self._queue
            before = len(queue)
            queue.extend(spans)
            self._weight += weight
            if before // self._max_batch != len(queue) // self._max_batch:
                self._cond.notify()
            full = self._weight > self._max_queued
        if full:
            self._drop_oldest()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        deadline = time.monotonic() + timeout_millis / 1000
        before = self.before_flush
        if before is not None:
            before(timeout_millis / 1000)
        return self._wait_empty(deadline - time.monotonic())

    def shutdown(self) -> None:
        self.deliver_remaining(timeout_s=DEFAULT_EXIT_TIMEOUT_S)

    # -- delivery -----------------------------------------------------------------
    @property
    def pending(self) -> int:
        return len(self._queue) + self._inflight

    @property
    def stuck(self) -> bool:
        """An export has been out for over a second (a hung collector holds it to its timeout)."""
        return bool(self._inflight) and time.monotonic() - self._inflight_since > STUCK_AFTER_S

    @property
    def healthy(self) -> bool:
        """The last export went through, and none has been stuck for over a second."""
        return self._last_ok and not self.stuck

    def probe(self, *, timeout_s: float) -> bool | None:
        """At exit: try the collector now, backoffs cut short; did it take a batch?

        A collector back up just before exit would otherwise find this processor asleep
        in its backoff (and the exporter in its own), and exit would count as lost what
        it could have delivered. True or False by an export tried after the call (or,
        with nothing queued to try, by the last one); None when none ended in
        ``timeout_s``, or once an export becomes :attr:`stuck`: a hung collector, or a slow one.
        """
        asked = time.monotonic()
        deadline = asked + timeout_s
        # An export out for a second already may be asleep in its exporter's retry backoff,
        # which _hurry ends: that one is waited for.
        stuck_before = self.stuck
        self._hurry()
        with self._cond:
            # Woken by an export's end; and every 50 ms to see an export in flight become
            # stuck, which settles the question (hung) before the timeout.
            while not (self._last_began >= asked or self._stopped or not (self._queue or self._inflight)):
                left = deadline - time.monotonic()
                if left <= 0 or (self.stuck and not stuck_before):
                    break
                self._cond.wait(min(left, 0.05))
            # A slow batch that went through while we waited, leaving nothing to try, counts.
            if self._last_began >= asked or not (self._queue or self._inflight):
                return self._last_ok
            return None

    def _hurry(self) -> None:
        # Exit is near: retry at once, never sleep out a backoff, ours or the exporter's.
        from otel_graph.export.sdk_internals import stop_retry_waits

        stop_retry_waits(self._exporter)
        with self._cond:
            self._retry_now = True
            self._cond.notify_all()

    def deliver_remaining(self, *, timeout_s: float) -> int:
        """Export what is queued while progress is made; return how many spans were given up on.

        Gives up after ``timeout_s`` without progress, and after four times that in all, so a
        collector that crawls cannot hold the process for long either.
        """
        if self._stopped:
            return 0
        self._hurry()
        hard_deadline = time.monotonic() + 4 * timeout_s
        while self.pending:
            before = self.exported
            if self._wait_empty(min(timeout_s, max(0.0, hard_deadline - time.monotonic()))):
                break
            if self.exported == before or time.monotonic() >= hard_deadline:
                break
        with self._cond:
            if self._stopped:
                return 0
            self._stopped = True
            left = len(self._queue) + self._inflight
            self._queue.clear()
            self._weight = 0
            self.undelivered += left
            self._cond.notify_all()
        return left

    def _wait_empty(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._flushing += 1
            self._cond.notify_all()
            try:
                while self._queue or self._inflight:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or self._stopped:
                        return False
                    self._cond.wait(remaining)
                return True
            finally:
                self._flushing -= 1

    def _drop_oldest(self) -> None:
        with self._cond:
            while self._weight > self._max_queued and self._queue:
                self._weight -= _weight(self._queue.popleft())
                self.dropped += 1
                self.undelivered += 1
        if not self._warned:
            self._warned = True
            logger.warning("otel_graph: span queue full (%d spans, about %d MB); dropping the oldest "
                           "spans and counting them as undelivered", self._max_queued,
                           self._max_queued * SPAN_BYTES // 10**6)

    def _take_batch(self) -> list[Queued]:
        queue = self._queue
        limit = self._batch_limit
        if self._chunked and limit == self._max_batch and len(queue) >= 2 * limit:  # backed up, exports going through
            limit = CATCH_UP_BATCH
        count = min(len(queue), limit)
        # Not while delivered spans are read back (takes_encoded is off): then they come readable.
        batch = _take_encoded(queue, count) if self.takes_encoded else None
        if batch is not None:
            weight = _encoded_weight(batch)
        else:
            batch, weight = _take_any(queue, count)
        self._inflight_weight = weight
        self._inflight = len(batch)
        self._inflight_since = time.monotonic()
        return batch

    def _run(self) -> None:
        backoff = 0.0
        exit_pace = EXIT_FIRST_RETRY_S
        while True:
            with self._cond:
                if backoff and self._retry_now:
                    # At exit a notify cuts a long backoff short, but retries still pace
                    # themselves, their waits doubling: a collector that refuses at once
                    # would make a busy loop, and each failed try is a few lines of the
                    # exporter's own log (four tries in exit's default second).
                    self._cond.wait(min(backoff, exit_pace))
                    exit_pace *= 2
                elif backoff:
                    self._cond.wait(backoff)
                else:
                    deadline = time.monotonic() + self._delay
                    while not self._stopped and len(self._queue) < self._max_batch and not (
                            (self._flushing or self._retry_now) and self._queue):
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            break
                        self._cond.wait(remaining)
                if self._stopped:
                    return
                batch = self._take_batch()
            if not batch:
                backoff = 0.0
                continue
            began, sent = self._inflight_since, len(batch)
            exported, retry, unexportable = self._send(batch)
            # Let go of the batch before a flush can return (and of retry, below): up to
            # CATCH_UP_BATCH spans that would stay alive while this thread waits for the next.
            del batch
            retried, full = bool(retry), False
            with self._cond:
                self._inflight = 0
                self._last_ok, self._last_began = not retried, began
                if self._stopped:
                    pass  # deliver_remaining already counted this batch as undelivered
                else:
                    self._weight -= self._inflight_weight
                    self.exported += exported
                    self.undelivered += unexportable
                    if retry:
                        self._queue.extendleft(reversed(retry))
                        self._weight += sum(_weight(span) for span in retry)
                        full = self._weight > self._max_queued
                        backoff = min(max(backoff * 2, 0.25), MAX_BACKOFF_S)
                        self._batch_limit = max(1, min(sent, self._max_batch) // 2)  # a catch-up batch too
                    else:
                        backoff, exit_pace = 0.0, EXIT_FIRST_RETRY_S
                        self._batch_limit = min(self._max_batch, self._batch_limit * 2)
                retry = []
                self._cond.notify_all()
            if retried and full:  # spans that ended while this batch was out, past the bound
                self._drop_oldest()

    def _send(self, batch: list[Queued]) -> tuple[int, list[Queued], int]:
        """:meth:`_deliver` ``batch``, as requests under :data:`MAX_REQUEST_BYTES` if the exporter can.

        A chunk that must be retried is retried with every chunk after it, in order.
        """
        if not self._chunked:
            return self._deliver(batch)
        from otel_graph.export.otlp_fast import encode_chunks  # loaded: it made the exporter

        chunks = encode_chunks(batch, max_bytes=MAX_REQUEST_BYTES)
        exported = unexportable = 0
        for index, chunk in enumerate(chunks):
            done, retry, given_up = self._deliver(chunk)
            exported, unexportable = exported + done, unexportable + given_up
            if retry:
                return exported, retry + [span for rest in chunks[index + 1:] for span in rest], unexportable
        return exported, [], unexportable

    def _deliver(self, batch: list[Queued]) -> tuple[int, list[Queued], int]:
        """Export ``batch``: (spans exported, spans to retry, spans given up on).

        A collector that fails is retried. An exporter that *raises* may be choking on one
        span (say, a string it cannot encode): retrying the same batch would block every
        span behind it forever. So the batch is halved until the span that raises is alone;
        that one is given up on, counted, and said once.
        """
        outcome = self._export(batch)
        if outcome is True:
            if self._on_delivered is not None:
                try:
                    # Spans queued encoded before a reader was set carry no attributes to read.
                    self._on_delivered([span for span in batch if type(span) is not tuple])
                except Exception:
                    logger.debug("otel_graph: counting delivered spans failed", exc_info=True)
            return len(batch), [], 0
        if outcome is False:
            return 0, batch, 0
        if len(batch) == 1:
            if not self._warned_unexportable:
                self._warned_unexportable = True
                logger.warning("otel_graph: the span exporter cannot take a span (%r); dropping such "
                               "spans and counting them as undelivered", outcome)
            return 0, [], 1
        half = len(batch) // 2
        first, second = self._deliver(batch[:half]), self._deliver(batch[half:])
        return first[0] + second[0], first[1] + second[1], first[2] + second[2]

    def _export(self, batch: list[Queued]) -> bool | Exception:
        """True, False (the exporter reported failure), or what the exporter raised."""
        try:
            if self._exporter.export(batch) == SpanExportResult.SUCCESS:
                return True
        except Exception as exc:  # an exporter bug must not kill the delivery thread
            logger.debug("otel_graph: span exporter raised", exc_info=True)
            return exc
        self.failed_attempts += 1
        if self.failed_attempts == 1:
            logger.warning("otel_graph: exporting spans failed (the exporter reported failure); keeping "
                           "them queued and retrying")
        return False


class CountingMetricExporter(MetricExporter):
    """Counts data points exported and not delivered; delegates everything else."""

    def __init__(self, inner: MetricExporter, *, histograms: HistogramSet | None = None) -> None:
        from otel_graph.export.sdk_internals import preferences

        temporality, aggregation = preferences(inner)
        super().__init__(preferred_temporality=temporality, preferred_aggregation=aggregation)
        # None from an exporter that states no preference (the SDK's console one): cumulative.
        self._histogram_temporality = (temporality or {}).get(HistogramInstrument, AggregationTemporality.CUMULATIVE)
        self._inner = inner
        self._histograms = histograms
        self.exported = 0
        self.undelivered = 0
        self.inflight = 0
        self._try_began = 0.0
        self._lock = threading.Lock()
        self._given_up = False
        self._hurried = False
        #: Called with each export the collector took (a distributed worker reports its task
        #: counts to the scheduler: :mod:`otel_graph.cluster.ledger`).
        self.on_delivered: Callable[[MetricsData], None] | None = None
        self._forked = False
        stands_down(self)

    def _after_fork_in_child(self) -> None:
        # The SDK restarts its reader in the child; the exporter it calls is the parent's.
        self._forked = True
        self._lock = threading.Lock()
        self.exported = self.undelivered = self.inflight = 0

    @property
    def stuck(self) -> bool:
        """A try of an export has been out for over a second (a hung collector holds it)."""
        return bool(self.inflight) and time.monotonic() - self._try_began > STUCK_AFTER_S

    def hurry(self) -> None:
        """At exit: no more sleeping between retries, and a failed export is tried once more at once.

        The exporter's first try after an outage fails on the connection it had, which
        it then replaces; without retry sleeps the final export would end on that
        failure, with the collector back and a fresh connection ready.
        """
        from otel_graph.export.sdk_internals import stop_retry_waits

        stop_retry_waits(self._inner)
        self._hurried = True

    def give_up(self) -> None:
        """At exit: count an export still in flight as undelivered, now, and no export after.

        The SDK reader's shutdown stops waiting for its export thread after its timeout
        and returns; the export may still fail later, after the warning was printed, or
        never end before the process does. Its points must be in the warning.
        """
        with self._lock:
            if not self._given_up:
                self._given_up = True
                self.undelivered += self.inflight
                self.inflight = 0

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
               ) -> MetricExportResult:
        if self._histograms is not None:
            # A reader of deliveries (a worker's ledger) adds up each export's points: it gets them all.
            metrics_data = self._histograms.merge_into(metrics_data, self._histogram_temporality, consumer=self,
                                                       skip_unchanged=self.on_delivered is None)
        points = _count_points(metrics_data)
        with self._lock:
            if self._forked:
                self.undelivered += points
                forked_child_drops("metrics")
                return MetricExportResult.FAILURE
            if self._given_up:
                # Past exit's deadline, after the warning: the reader's final collection,
                # held behind an export that hung. Not sent, and not counted: its series are
                # those of the export counted in flight (cumulative, so the same totals and
                # later), and a count after the warning would leave the warning short of it
                # (bench_faults, hung collector: warned 33 points, counters said 49).
                return MetricExportResult.FAILURE
            self.inflight = points
        result = self._export(metrics_data, timeout_millis, **kwargs)
        if result != MetricExportResult.SUCCESS and self._hurried:
            result = self._export(metrics_data, timeout_millis, **kwargs)
        if result != MetricExportResult.SUCCESS and self._histograms is not None:
            self._histograms.unsent(self)
        with self._lock:
            if self._given_up:  # counted by give_up() already, whatever became of it
                return result
            self.inflight = 0
            if result == MetricExportResult.SUCCESS:
                self.exported += points
            else:
                self.undelivered += points
        if result == MetricExportResult.SUCCESS and self.on_delivered is not None:
            try:
                self.on_delivered(metrics_data)
            except Exception:
                logger.debug("otel_graph: counting delivered points failed", exc_info=True)
        return result

    def _export(self, metrics_data: MetricsData, timeout_millis: float, **kwargs: Any) -> MetricExportResult:
        self._try_began = time.monotonic()
        try:
            return self._inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)
        except Exception:
            logger.debug("otel_graph: metric exporter raised", exc_info=True)
            return MetricExportResult.FAILURE

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self._inner.force_flush(timeout_millis=timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._inner.shutdown(timeout_millis=timeout_millis, **kwargs)


def _count_points(metrics_data: MetricsData) -> int:
    return sum(len(metric.data.data_points)
               for resource in metrics_data.resource_metrics
               for scope in resource.scope_metrics
               for metric in scope.metrics)
