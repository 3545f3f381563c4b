"""OTLP span encoding several times faster than the stock encoder: spans -> requests.

A Dask compute can end 10^5 tasks, one span each. The stock encoder
(``opentelemetry.exporter.otlp.proto.common.trace_encoder.encode_spans``) builds
every span from nested keyword constructors, at about 100 µs a span: ten
seconds of export thread per large compute. Filling the official messages with
``.add()`` and field assignments is faster, but still makes a Python object per
message, about 1 µs per attribute. So otel_graph writes the protobuf wire
format itself and parses it once, in C, into the official
``ExportTraceServiceRequest``; the HTTP exporter sends the bytes unparsed.
Field numbers and wire types are read from the ``opentelemetry-proto``
descriptors. Within a request, each resource and scope is encoded once, and so
is each repeated (key, value) pair, such as a task prefix or a worker address.
``benchmarks/bench_encode.py`` compares the encoders.

Three modules, each using the one before: :mod:`otel_graph.export.otlp_wire` (fields,
keys, attribute values), :mod:`otel_graph.export.otlp_spans` (one span's entry), and this
one, which groups entries by resource and scope into requests, and cuts a long list of
spans into requests of bounded size.

Usage
-----
>>> from opentelemetry.sdk.trace import ReadableSpan
>>> from opentelemetry.trace import SpanContext
>>> span = ReadableSpan("inc", context=SpanContext(1, 2, is_remote=False), attributes={"dask.prefix": "inc"})
>>> encode_spans_fast([span]).resource_spans[0].scope_spans[0].spans[0].attributes[0].value.string_value
'inc'

To export, :func:`otel_graph.export.sdk_internals.otlp_span_exporter` builds the stock
exporter, which reads ``OTEL_EXPORTER_OTLP_*``, and makes it encode with this module
(the stock exporters' private parts that takes are all in :mod:`otel_graph.export.sdk_internals`).
Give each directly built ``ReadableSpan`` a shared ``resource=``: without one, each
gets its own ``Resource.create({})``, which is slow to create and to group.

A processor that holds many spans calls ``encode_chunks(spans, max_bytes=...)``
first: it encodes each span once and cuts the list into chunks whose requests
stay under the collector's size limit; exporting a chunk reuses its encoding.

Semantics
---------
The request equals stock's, message for message (``tests/test_otlp_fast.py``),
quirks included: spans are grouped by resource then scope using ``==`` (equal
resources of two providers share a ``ResourceSpans``); ``flags`` holds only the
is-remote bits, not the W3C trace flags; a link's ``trace_state`` is not sent; a
span without a scope gets an empty one; an attribute that cannot be encoded (an
unknown type, an int beyond int64, invalid UTF-8) is logged and left out.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from operator import itemgetter
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans

from otel_graph.export.otlp_spans import encode_span
from otel_graph.export.otlp_wire import Memo, field_keys, key_values, utf8, varint, wire_field
from otel_graph.export.span_batches import Queued

__all__ = ["EncodedSpans", "encode_chunks", "encode_spans_fast", "group_spans", "origin"]

(_REQ_RESOURCE_SPANS,) = field_keys(ExportTraceServiceRequest, "resource_spans")
_RS_RESOURCE, _RS_SCOPE_SPANS, _RS_SCHEMA_URL = field_keys(ResourceSpans, "resource", "scope_spans", "schema_url")
(_RESOURCE_ATTRIBUTES,) = field_keys(Resource, "attributes")
_SS_SCOPE, _SS_SCHEMA_URL = field_keys(ScopeSpans, "scope", "schema_url")
_SCOPE_NAME, _SCOPE_VERSION, _SCOPE_ATTRIBUTES = field_keys(InstrumentationScope, "name", "version", "attributes")

# -- spans encoded as they end ------------------------------------------------
#
# A span otel_graph makes itself can be encoded where it ends, before it is queued
# (otel_graph.telemetry.encoded_batch), when every exporter behind the queue takes encoded
# chunks. What is queued is then a plain tuple, (its entry, its origin): bytes and an
# int, which the garbage collector stops tracking, where a ReadableSpan is a dozen
# tracked objects that a queue of thousands keeps alive long enough to be promoted and
# traversed by full collections. The origin numbers a (resource, scope) pair.

_ORIGINS: list[tuple[Any, Any]] = []
_ORIGIN_NUMBERS: dict[tuple[int, int], int] = {}
_ORIGIN_LOCK = threading.Lock()


def _new_origin_lock() -> None:
    global _ORIGIN_LOCK
    _ORIGIN_LOCK = threading.Lock()  # a thread of the parent's may have held it at the fork


if hasattr(os, "register_at_fork"):  # not on Windows
    os.register_at_fork(after_in_child=_new_origin_lock)


def origin(resource: Any, scope: Any) -> int:
    """The number of spans of ``resource`` and ``scope`` (by identity). Both are kept alive
    here, for spans still queued: one pair per provider otel_graph builds in the process."""
    key = (id(resource), id(scope))
    with _ORIGIN_LOCK:
        number = _ORIGIN_NUMBERS.get(key)
        if number is None:
            number = _ORIGIN_NUMBERS[key] = len(_ORIGINS)
            _ORIGINS.append((resource, scope or None))
        return number


# -- requests ----------------------------------------------------------------


def _entry(span: Any, memo: Memo) -> bytes:
    """The entry of a ReadableSpan, or of a span encoded as it ended."""
    return span[0] if type(span) is tuple else encode_span(span, memo)


def _scope_head(scope: Any, memo: Memo) -> bytes:
    """A ScopeSpans' scope and schema_url fields; ``None`` is stock's empty scope."""
    if scope is None:
        return _SS_SCOPE + b"\x00"
    body = (wire_field(_SCOPE_NAME, utf8(scope.name)) if scope.name else b"") + (
        wire_field(_SCOPE_VERSION, utf8(scope.version)) if scope.version else b"")
    head = wire_field(_SS_SCOPE, body + key_values(_SCOPE_ATTRIBUTES, scope.attributes, memo))
    return head + (wire_field(_SS_SCHEMA_URL, utf8(scope.schema_url)) if scope.schema_url else b"")


class EncodedSpans(list[Queued]):
    """Spans, and in ``parts`` each one's encoding: what :func:`encode_chunks` returns.

    The fast exporters send the parts instead of encoding the spans again.
    """

    __slots__ = ("parts", "origin")

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[bytes] = []
        #: The origin (:func:`origin`) of every span, where the chunk was made whole of spans all
        #: encoded as they ended, of that one origin (the request is then made in one join); else None.
        self.origin: int | None = None


_entry_of, _origin_of = itemgetter(0), itemgetter(1)


def _encoded_only(spans: Sequence[Any]) -> tuple[list[bytes], int, int | None] | None:
    """(entries, their size in all, their one origin or None) where every span was encoded as it
    ended; else None. Its loops run in C: the export thread holds the GIL here, which a compute
    running meanwhile waits for (512 spans cut into chunks: 28 against the loop's 46 µs)."""
    if not spans or set(map(type, spans)) != {tuple}:
        return None
    parts = list(map(_entry_of, spans))
    origins = set(map(_origin_of, spans))
    return parts, sum(map(len, parts)), origins.pop() if len(origins) == 1 else None


def encode_chunks(spans: Sequence[Queued], *, max_bytes: int) -> list[list[Queued]]:
    """``spans`` in order, as chunks whose requests stay under about ``max_bytes``.

    Each chunk is an :class:`EncodedSpans`, except that a span that cannot be encoded
    is a plain list of its own, for the exporter to raise on. A span larger than
    ``max_bytes`` is alone in its chunk. A request adds its resources and scopes
    (once per chunk) to the sum of its spans' parts.
    """
    encoded = _encoded_only(spans)
    if encoded is not None and encoded[1] <= max_bytes:  # the usual batch: one request, made by loops in C
        chunk = EncodedSpans()
        chunk.extend(spans)
        chunk.parts, chunk.origin = encoded[0], encoded[2]
        return [chunk]
    memo = Memo()
    chunks: list[list[Queued]] = []
    current, size = EncodedSpans(), 0
    for span in spans:
        try:
            # _entry's, inline: a call a span fewer. A ReadableSpan in the else branch, which mypy does
            # not narrow to (span_batches.span_weight says why isinstance is not used).
            part = span[0] if type(span) is tuple else encode_span(span, memo)  # type: ignore[arg-type]
        except Exception:  # noqa: BLE001 - the exporter raises on it again, and the processor drops it alone
            if current:
                chunks.append(current)
                current, size = EncodedSpans(), 0
            chunks.append([span])
            continue
        if current and size + len(part) > max_bytes:
            chunks.append(current)
            current, size = EncodedSpans(), 0
        current.append(span)
        current.parts.append(part)
        size += len(part)
    if current:
        chunks.append(current)
    return chunks


def group_spans(spans: Sequence[Queued]) -> dict[Any, dict[Any, list[int]]]:
    """The indexes of ``spans`` by resource, then scope (None for none): stock's grouping,
    by ``==``, in first-seen order. Consecutive spans usually share both objects; the
    identity test skips hashing a Resource (which dumps its attributes to JSON) for each."""
    groups: dict[Any, dict[Any, list[int]]] = {}
    last: tuple[Any, Any] = (object(), object())
    bucket: list[int] = []
    for index, span in enumerate(spans):
        if type(span) is tuple:
            resource, scope = _ORIGINS[span[1]]
        else:
            resource, scope = span.resource, span.instrumentation_scope or None  # type: ignore[union-attr]
        if resource is not last[0] or scope is not last[1]:
            bucket = groups.setdefault(resource, {}).setdefault(scope, [])
            last = (resource, scope)
        bucket.append(index)
    return groups


def _encode_request(spans: Sequence[Queued]) -> bytes:
    """``spans`` as a serialized ``ExportTraceServiceRequest``."""
    parts: list[bytes] | None
    if isinstance(spans, EncodedSpans):
        parts, one_origin = spans.parts, spans.origin
    else:
        parts = one_origin = None
    memo = Memo()
    pieces: list[bytes] = []
    if parts is not None and one_origin is not None:  # the usual request: every span encoded, of one origin
        resource, scope = _ORIGINS[one_origin]
        _add_resource_spans(pieces, resource, [(scope, parts)], memo)
        return b"".join(pieces)
    for resource, scopes in group_spans(spans).items():
        scoped = []
        for scope, members in scopes.items():
            if parts is not None:
                scoped.append((scope, [parts[index] for index in members]))
            else:
                scoped.append((scope, [_entry(spans[index], memo) for index in members]))
        _add_resource_spans(pieces, resource, scoped, memo)
    return b"".join(pieces)


def _add_resource_spans(pieces: list[bytes], resource: Any, scoped: list[tuple[Any, list[bytes]]], memo: Memo) -> None:
    """A request's ``resource_spans`` field, of ``resource`` and per scope its spans' entries, appended
    to ``pieces`` in pieces, their lengths worked out ahead: the request's one join then copies
    each entry once, where a field joined at each level of nesting copies the whole request
    (hundreds of kB, each copy a fresh allocation) while the export thread holds the GIL."""
    resource_field = wire_field(_RS_RESOURCE, key_values(_RESOURCE_ATTRIBUTES, resource.attributes, memo))
    size = len(resource_field)
    heads = []
    for scope, entries in scoped:
        scope_head = _scope_head(scope, memo)
        spans_size = sum(map(len, entries))
        # The ScopeSpans field's, to its spans.
        head = _RS_SCOPE_SPANS + varint(len(scope_head) + spans_size) + scope_head
        heads.append((head, entries))
        size += len(head) + spans_size
    schema = wire_field(_RS_SCHEMA_URL, utf8(resource.schema_url)) if resource.schema_url else b""
    pieces += (_REQ_RESOURCE_SPANS + varint(size + len(schema)), resource_field)
    for head, entries in heads:
        pieces.append(head)
        pieces += entries
    if schema:
        pieces.append(schema)


def encode_spans_fast(spans: Sequence[Queued]) -> ExportTraceServiceRequest:
    """Encode finished spans as OTLP; equal to the stock ``encode_spans(spans)``, faster."""
    request = ExportTraceServiceRequest()
    request.ParseFromString(_encode_request(spans))
    return request
