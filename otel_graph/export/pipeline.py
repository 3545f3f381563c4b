"""Delivery without silent loss: a span processor that never drops quietly.

The SDK's ``BatchSpanProcessor`` drops spans when its queue (2,048) fills (it warns, once
a span, and counts them in its own metrics), and a batch its exporter failed is gone:
measured here it lost 79% of spans behind a collector that took 50 ms per batch. Its
queue is bounded by spans, not bytes, and its exit waits out a fixed timeout whatever
the collector does. :class:`ReliableSpanProcessor` instead:

* queues every ended span, up to ``max_queued`` (``OTEL_GRAPH_MAX_QUEUED_SPANS``);
  only past that bound does it drop, oldest first, and it counts what it drops. The
  bound is one of memory: each span weighs what it holds (:mod:`.span_batches`), so
  a storm of failed tasks' stack traces counts for more than plain spans;
* exports from one thread in batches; a failed batch goes back to the head of the
  queue and is retried with exponential backoff (capped at :data:`MAX_BACKOFF_S`), so
  data is delivered when a collector that was down comes back; a span the exporter
  raises on is found by halving its batch, and given up on alone, counted, rather than
  blocking the queue; after a failure the next batch is half the size (doubling back
  on success), so a batch too large for the collector is not retried whole forever;
* with otel_graph's fast exporters, encodes each span once and cuts a batch into
  requests under :data:`MAX_REQUEST_BYTES`, and takes larger batches (up to
  :data:`CATCH_UP_BATCH`) while the queue is backed up;
* never blocks the caller of ``on_end``: a slow or hung collector only grows the queue;
* :meth:`~ReliableSpanProcessor.deliver_remaining` is what runs at exit: it keeps
  exporting while the collector makes progress and gives up after ``timeout_s`` without
  progress, counting what is left as undelivered.

Its counts (``exported``, ``dropped``, ``undelivered``), with the metric points'
(:mod:`.metric_counting`), feed :func:`otel_graph.telemetry.metrics.observe_delivery` and
the one warning printed when anything was not delivered.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, cast

from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_graph.config import DEFAULT_EXIT_TIMEOUT_S
from otel_graph.export.forks import forked_child_drops, stands_down
from otel_graph.export.span_batches import SPAN_BYTES, Queued, encoded_weight, span_weight, take_any, take_encoded

logger = logging.getLogger("otel_graph")

MAX_BACKOFF_S = 5.0
#: At exit, the wait before the first retry of a failed batch; each next wait is twice
#: the last (0.1, 0.2, 0.4 s...), so a collector back within exit's window is found soon
#: after it returns, and one that stays down draws a handful of tries, not one per 0.1 s.
EXIT_FIRST_RETRY_S = 0.1
#: An export out this long is held by the collector (hung), not just slow: exports take
#: milliseconds, and a hung collector holds one to its timeout (10 s by default).
STUCK_AFTER_S = 1.0
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


def _takes_encoded_chunks(exporter: SpanExporter) -> bool:
    internals = sys.modules.get("otel_graph.export.sdk_internals")  # not loaded: not one of its exporters
    return internals is not None and internals.takes_encoded_chunks(exporter)


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
        #: What an ended span is moved by before it is queued: in a worker process, the spans
        #: code inside tasks makes go onto their caller's timeline (otel_graph.cluster.inside_tasks).
        self.placement: Callable[[ReadableSpan], ReadableSpan] | None = None
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
        placement = self.placement
        if placement is not None:
            try:
                span = placement(span)
            except Exception:  # noqa: BLE001 - a span that cannot be moved still goes, as it is
                logger.debug("otel_graph: span not placed", exc_info=True)
        self._enqueue((span,), span_weight(span))

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
        self._enqueue((span,), span_weight(span))

    def on_end_encoded_many(self, spans: list[tuple[bytes, int]]) -> None:
        """Spans encoded as they ended, queued together (one lock round trip)."""
        self._enqueue(spans, encoded_weight(spans))

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
                self._weight -= span_weight(self._queue.popleft())
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
        batch = take_encoded(queue, count) if self.takes_encoded else None
        if batch is not None:
            weight = encoded_weight(batch)
        else:
            batch, weight = take_any(queue, count)
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
                        self._weight += sum(span_weight(span) for span in retry)
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
                    self._on_delivered(cast("list[ReadableSpan]", [span for span in batch if type(span) is not tuple]))
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
            # Encoded spans are queued only for otel_graph's fast exporters (takes_encoded), whose export
            # takes them; SpanExporter.export's signature names ReadableSpans only.
            if self._exporter.export(batch) == SpanExportResult.SUCCESS:  # type: ignore[arg-type]
                return True
        except Exception as exc:  # an exporter bug must not kill the delivery thread
            logger.debug("otel_graph: span exporter raised", exc_info=True)
            return exc
        self.failed_attempts += 1
        if self.failed_attempts == 1:
            logger.warning("otel_graph: exporting spans failed (the exporter reported failure); keeping "
                           "them queued and retrying")
        return False
