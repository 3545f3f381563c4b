"""What a queued span weighs, and how the export thread takes a batch off the queue.

:class:`~otel_graph.export.pipeline.ReliableSpanProcessor` bounds its queue by memory, not
by span count. Its unit of weight is :data:`SPAN_BYTES`, what one plain task span holds:

* a ``ReadableSpan`` weighs 1, plus 1 per :data:`SPAN_BYTES` of its events' text (a failed
  task's exception message and stack trace), so a storm of failures behind a dead
  collector cannot hold gigabytes where plain spans would hold the budget's worth;
* a span encoded as it ended (:data:`Queued`'s tuple, made by otel_graph's fast exporters)
  weighs 1, plus 1 per :data:`SPAN_BYTES` of its encoding: its bytes are what it holds.

A batch is taken in one of two ways. :func:`take_encoded` takes a batch of encoded spans
whole, by loops that run in C; :func:`take_any` goes span by span, closing the batch
before its events' text passes :data:`MAX_EVENT_BYTES`, which keeps one request of failed
tasks under the collector's request limit. Both run on the export thread holding the
queue's lock, so they stay cheap.

>>> spans = deque([(b"x" * 10, 0), (b"y" * (2 * SPAN_BYTES), 0), (b"z", 0)])
>>> [span_weight(span) for span in spans]
[1, 3, 1]
>>> batch = take_encoded(spans, 2)
>>> encoded_weight(batch), len(spans)
(4, 1)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from itertools import islice, repeat, starmap
from operator import itemgetter
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

#: Memory one queued task span holds, measured (tracemalloc, 50,000 spans of a 10^5-task
#: graph queued behind a collector that was down): 2.5 kB. The queue's unit of weight.
SPAN_BYTES = 2_500
#: Event text (exception messages and stack traces) per export request at most, well
#: under gRPC's and the collector's 4 MB default request limit.
MAX_EVENT_BYTES = 2_500_000

#: What the span queue holds: a ReadableSpan, or a span encoded as it ended, (its
#: ``ScopeSpans.spans`` entry, its origin: :func:`otel_graph.export.otlp_fast.origin`).
Queued = ReadableSpan | tuple[bytes, int]


def _event_text_bytes(span: ReadableSpan) -> int:
    return sum(len(value) for event in span.events for value in (event.attributes or {}).values()
               if isinstance(value, str))


def span_weight(span: Queued) -> int:
    """A queued span's weight, in :data:`SPAN_BYTES` units (at least 1)."""
    if type(span) is tuple:  # encoded as it ended (otlp_spans.span_entry): its bytes are what it holds
        return 1 + len(span[0]) // SPAN_BYTES
    # Only spans with events are measured: they are rare (failed tasks), and measuring
    # every span would cost the export path on the hot side of a 10^6-task graph.
    # A ReadableSpan here, but mypy narrows only the if branch of ``type(x) is tuple`` (python/mypy#7260),
    # and isinstance, which it follows, tests a ReadableSpan in twice the time (24 against 11 ns).
    return 1 + _event_text_bytes(span) // SPAN_BYTES if span.events else 1  # type: ignore[arg-type, union-attr]


_entry_of = itemgetter(0)


def take_encoded(queue: deque[Queued], count: int) -> list[Queued] | None:
    """The first ``count`` spans of ``queue``, taken off it, when every one is encoded as it ended
    (the usual batch where the exporter takes encoded chunks); else None, the queue untouched.

    Its loops run in C (``islice``, ``map``, ``starmap``): the export thread holds the GIL here,
    which a compute running meanwhile waits for (512 spans: 18 against the loop's 37 µs).
    """
    if not count or set(map(type, islice(queue, count))) != {tuple}:
        return None
    return list(starmap(queue.popleft, repeat((), count)))


def encoded_weight(spans: Sequence[Any]) -> int:
    """:func:`span_weight` summed over spans encoded as they ended, by loops that run in C where no
    entry reaches SPAN_BYTES (the usual case: only a failed task's exception text does)."""
    if not spans or max(map(len, map(_entry_of, spans))) < SPAN_BYTES:
        return len(spans)
    return sum(map(span_weight, spans))


def take_any(queue: deque[Queued], count: int) -> tuple[list[Queued], int]:
    """At most ``count`` spans taken off ``queue``, and their weight (:func:`span_weight`'s, summed)."""
    batch: list[Queued] = []
    event_bytes = 0
    # Failed tasks carry exception events of up to ~20 kB; 512 of them would pass the
    # collector's 4 MB request limit. Only spans with events are measured (cheap), and
    # the batch is closed before their text passes MAX_EVENT_BYTES.
    weight = 0
    for _ in range(count):
        span = queue[0]
        if type(span) is tuple:  # encoded: chunks are cut by their encoded size (span_weight's, inline)
            weight += len(span[0]) // SPAN_BYTES
        elif span.events:  # type: ignore[union-attr]  # a ReadableSpan: see span_weight
            size = _event_text_bytes(span)  # type: ignore[arg-type]
            if batch and event_bytes + size > MAX_EVENT_BYTES:
                break
            event_bytes += size
            weight += size // SPAN_BYTES
        batch.append(queue.popleft())
    return batch, weight + len(batch)
