"""OTLP span encoding several times faster than the stock encoder.

A Dask compute can end 10^5 tasks, one span each. The stock encoder
(``opentelemetry.exporter.otlp.proto.common.trace_encoder.encode_spans``) builds
every span from nested keyword constructors, at about 100 µs a span: ten
seconds of export thread per large compute. Filling the official messages with
``.add()`` and field assignments is faster, but still makes a Python object per
message, about 1 µs per attribute. So this module writes the protobuf wire
format itself and parses it once, in C, into the official
``ExportTraceServiceRequest``; the HTTP exporter sends the bytes unparsed.
Field numbers and wire types are read from the ``opentelemetry-proto``
descriptors. Within a request, each resource and scope is encoded once, and so
is each repeated (key, value) pair, such as a task prefix or a worker address.
``benchmarks/bench_encode.py`` compares the encoders.

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

import logging
import os
import struct
import threading
from collections.abc import Mapping, Sequence
from operator import itemgetter
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, InstrumentationScope, KeyValue, KeyValueList
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, SpanFlags, Status
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.trace import Link, SpanKind, StatusCode
from opentelemetry.trace.span import DEFAULT_TRACE_STATE as _NO_STATE

__all__ = ["EncodedSpans", "child_entry", "encode_chunks", "encode_spans_fast", "encoded_attribute", "encoded_attributes",
           "group_spans", "new_memo", "origin", "simple_entry", "span_entry"]

_logger = logging.getLogger(__name__)

# -- protobuf wire format ----------------------------------------------------

_BYTE = [bytes((n,)) for n in range(128)]  # a varint below 128 is that one byte
_U64 = struct.Struct("<Q").pack  # fixed64
_F64 = struct.Struct("<d").pack  # double
_U32 = struct.Struct("<I").pack  # fixed32
_FD = FieldDescriptor
_WIRE_TYPE = {_FD.TYPE_DOUBLE: 1, _FD.TYPE_FIXED64: 1, _FD.TYPE_FIXED32: 5,  # others used here are varints (0)
              _FD.TYPE_STRING: 2, _FD.TYPE_BYTES: 2, _FD.TYPE_MESSAGE: 2}  # fmt: skip


def _varint(n: int) -> bytes:
    if n < 128:
        return _BYTE[n]
    out = bytearray()
    while n > 127:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_TWO_BYTES = struct.Struct("BB").pack


def _field(key: bytes, payload: bytes) -> bytes:
    """A length-delimited field: a string, bytes or an embedded message."""
    n = len(payload)
    return key + (_BYTE[n] if n < 128 else _TWO_BYTES(n & 0x7F | 0x80, n >> 7) if n < 16384 else _varint(n)) + payload


def _keys(message: type[Message], *names: str) -> list[bytes]:
    """The field keys (number and wire type) of ``names``, read from the official descriptor."""
    fields = message.DESCRIPTOR.fields_by_name
    return [_varint(fields[n].number << 3 | _WIRE_TYPE.get(fields[n].type, 0)) for n in names]


(_REQ_RESOURCE_SPANS,) = _keys(ExportTraceServiceRequest, "resource_spans")
_RS_RESOURCE, _RS_SCOPE_SPANS, _RS_SCHEMA_URL = _keys(ResourceSpans, "resource", "scope_spans", "schema_url")
(_RESOURCE_ATTRIBUTES,) = _keys(Resource, "attributes")
_SS_SCOPE, _SS_SPANS, _SS_SCHEMA_URL = _keys(ScopeSpans, "scope", "spans", "schema_url")
_SCOPE_NAME, _SCOPE_VERSION, _SCOPE_ATTRIBUTES = _keys(InstrumentationScope, "name", "version", "attributes")
(_TRACE_ID, _SPAN_ID, _TRACE_STATE, _PARENT_SPAN_ID, _NAME, _KIND, _START, _END, _ATTRIBUTES, _DROPPED_ATTRIBUTES,
 _EVENTS, _DROPPED_EVENTS, _LINKS, _DROPPED_LINKS, _STATUS, _FLAGS) = _keys(
    Span, "trace_id", "span_id", "trace_state", "parent_span_id", "name", "kind", "start_time_unix_nano",
    "end_time_unix_nano", "attributes", "dropped_attributes_count", "events", "dropped_events_count", "links",
    "dropped_links_count", "status", "flags")  # fmt: skip
_EVENT_TIME, _EVENT_NAME, _EVENT_ATTRIBUTES, _EVENT_DROPPED = _keys(
    Span.Event, "time_unix_nano", "name", "attributes", "dropped_attributes_count")
_LINK_TRACE_ID, _LINK_SPAN_ID, _LINK_ATTRIBUTES, _LINK_DROPPED, _LINK_FLAGS = _keys(
    Span.Link, "trace_id", "span_id", "attributes", "dropped_attributes_count", "flags")
_STATUS_MESSAGE, _STATUS_CODE = _keys(Status, "message", "code")
_KV_KEY, _KV_VALUE = _keys(KeyValue, "key", "value")
(_ARRAY_VALUES,), (_KVLIST_VALUES,) = _keys(ArrayValue, "values"), _keys(KeyValueList, "values")
_STRING, _BOOL, _INT, _DOUBLE, _ARRAY, _KVLIST, _BYTES = _keys(
    AnyValue, "string_value", "bool_value", "int_value", "double_value", "array_value", "kvlist_value", "bytes_value")

_KINDS = {kind: _KIND + _varint(getattr(Span, f"SPAN_KIND_{kind.name}")) for kind in SpanKind}
_INTERNAL = _KINDS[SpanKind.INTERNAL]
_HAS_IS_REMOTE = SpanFlags.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
_IS_REMOTE = _HAS_IS_REMOTE | SpanFlags.SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK
_SPAN_FLAGS = {False: _FLAGS + _U32(_HAS_IS_REMOTE), True: _FLAGS + _U32(_IS_REMOTE)}  # by parent.is_remote
_EMPTY_STATUS = _STATUS + b"\x00"  # stock always sends a status, even UNSET and empty
# A SpanContext is a tuple (trace id, span id, is_remote, flags, trace state, is_valid), its
# fields properties reading it: read by index in the span encoders (a Python call each fewer,
# nine a small compute). simple_entry and child_entry also take a plain tuple of a context's
# first five fields (a small compute set aside). Checked against the properties below.
_AT_TRACE_ID, _AT_SPAN_ID, _AT_IS_REMOTE, _AT_FLAGS, _AT_TRACE_STATE = 0, 1, 2, 3, 4


def _check_span_context_layout() -> None:
    from opentelemetry.trace import SpanContext, TraceFlags
    from opentelemetry.trace.span import TraceState

    probe = SpanContext(3, 5, True, TraceFlags(1), TraceState([("k", "v")]))
    if (probe[_AT_TRACE_ID], probe[_AT_SPAN_ID], probe[_AT_IS_REMOTE], probe[_AT_FLAGS], probe[_AT_TRACE_STATE]) != \
            (probe.trace_id, probe.span_id, probe.is_remote, probe.trace_flags, probe.trace_state):
        raise RuntimeError("otel_graph does not support this opentelemetry-api: its SpanContext is laid out anew")


_check_span_context_layout()

# A field's key and the length of its fixed-size payload, written together.
_TRACE_ID_16, _SPAN_ID_8, _PARENT_SPAN_ID_8 = _TRACE_ID + b"\x10", _SPAN_ID + b"\x08", _PARENT_SPAN_ID + b"\x08"
#: Start and end times, fixed64 fields with one-byte keys, in one call: ``_TIMES(_START_KEY, start, _END_KEY, end)``.
_TIMES = struct.Struct("<BQBQ").pack
(_START_KEY,), (_END_KEY,) = _START, _END  # (a key of more than one byte fails here, at import)

# -- attribute values --------------------------------------------------------


def _any_int(value: int) -> bytes:
    if not -(1 << 63) <= value < 1 << 63:
        raise ValueError(f"Value out of range: {value}")
    return _INT + _varint(value & 0xFFFF_FFFF_FFFF_FFFF)  # a negative int64 is a 10-byte varint


def _any_array(value: Sequence[Any]) -> bytes:
    items = []
    for item in value:
        if type(item) is str:  # the usual item, inlined: 1-byte key, length, string AnyValue (1-byte key)
            encoded = item.encode()
            if len(encoded) < 126:
                items.append(_ARRAY_VALUES + _BYTE[len(encoded) + 2] + _STRING + _BYTE[len(encoded)] + encoded)
                continue
        items.append(_field(_ARRAY_VALUES, (_ANY.get(type(item)) or _any_encoder(item))(item)))
    return _field(_ARRAY, b"".join(items))


def _any_kvlist(value: Mapping[Any, Any]) -> bytes:
    return _field(_KVLIST, b"".join([_attribute(_KVLIST_VALUES, str(k), v, {}) for k, v in value.items()]))


# Exact types first, so the common case is one dict lookup; ``_any_encoder`` handles subclasses.
_ANY = {str: lambda value: _field(_STRING, value.encode()), int: _any_int, float: lambda value: _DOUBLE + _F64(value),
        bool: lambda value: _BOOL + (b"\x01" if value else b"\x00"), bytes: lambda value: _field(_BYTES, value),
        tuple: _any_array, list: _any_array, dict: _any_kvlist, type(None): lambda value: b""}  # None: empty AnyValue


def _any_encoder(value: Any) -> Any:
    """The encoder for a value of a subclass (or an ABC); stock's isinstance order."""
    for kind in (bool, str, int, float, bytes):  # bool before int, str and bytes before Sequence
        if isinstance(value, kind):
            return _ANY[kind]
    if isinstance(value, Sequence):
        return _any_array
    if isinstance(value, Mapping):
        return _any_kvlist
    raise TypeError(f"Invalid type {type(value)} of value {value}")


def _utf8(text: str | bytes) -> bytes:
    """A string field's payload. Like the messages, take str, or bytes that are valid UTF-8."""
    if isinstance(text, str):
        return text.encode()  # a lone surrogate raises, as in the messages
    if isinstance(text, bytes):
        text.decode()  # raises on invalid UTF-8
        return bytes(text)
    raise TypeError(f"bad argument type {type(text)} for a string field")


class _Memo:
    """What is encoded once and reused: (key, value) pairs, the head of a KeyValue per key.

    One per request at export; one per emitter for spans encoded as they end (its owner
    replaces it once it holds too many pairs)."""

    __slots__ = ("heads", "pairs", "names", "trace", "parent", "child")

    def __init__(self) -> None:
        self.heads: dict[str, bytes] = {}
        self.pairs: dict[tuple[bytes, str, Any, type], bytes] = {}
        #: Span names as their encoded field; spans come in runs of one trace, and of one
        #: parent: (trace id, its field) and (parent context, its fields) of the last span.
        self.names: dict[str, bytes] = {}
        self.trace: tuple[int, bytes] = (-1, b"")
        self.parent: tuple[Any, bytes] = (None, b"")
        #: child_entry's: (the parent, its trace's field, its fields after the span's id).
        self.child: tuple[Any, bytes, bytes] = (None, b"", b"")


# Types whose value (with the type) fixes the encoding, so a (key, value) pair seen before
# is reused as bytes. Not floats (0.0 == -0.0), not sequences (1 == True == 1.0 inside).
_MEMO_TYPES = frozenset({str, int, bool})
#: Longer strings are not remembered: they rarely repeat (stack traces, messages), and a
#: memo that outlives a request would keep them (1,300 distinct tracebacks: 53 MB).
_MEMO_MAX_CHARS = 64


def _attributes(field: bytes, attributes: Mapping[str, Any] | None, memo: _Memo) -> bytes:
    """Encode ``attributes`` as the repeated KeyValue ``field``; stock's error handling."""
    if not attributes:
        return b""
    parts, pairs, heads = [], memo.pairs, memo.heads
    for name, value in attributes.items():
        try:
            kind = type(value)
            if kind in _MEMO_TYPES and (kind is not str or len(value) <= _MEMO_MAX_CHARS):
                memo_key = (field, name, value, kind)
                encoded = pairs.get(memo_key)
                if encoded is None:
                    encoded = pairs[memo_key] = _attribute(field, name, value, heads)
            else:
                encoded = _attribute(field, name, value, heads)
            parts.append(encoded)
        except Exception as error:  # noqa: BLE001 - stock logs and skips the key, keeping the span
            _logger.exception("Failed to encode key %s: %s", name, error)
    return b"".join(parts)


def _attribute(field: bytes, name: str, value: Any, heads: dict[str, bytes]) -> bytes:
    """One KeyValue as ``field``; ``heads`` caches the key part (the key, then the value's tag)."""
    head = heads.get(name)
    if head is None:
        head = heads[name] = attribute_head(name)
    value_bytes = (_ANY.get(type(value)) or _any_encoder(value))(value)
    n = len(value_bytes)
    return _field(field, head + (_BYTE[n] if n < 128 else _varint(n)) + value_bytes)


def keyed_string(head: bytes, text: str) -> bytes:
    """A string attribute as a span's attribute field, its key given as :func:`attribute_head`
    made it: the same bytes as :func:`encoded_attribute`, in fewer steps."""
    value = text.encode()
    n = len(value)
    if n < 100:  # the usual key: each length below is one byte
        any_value = _STRING + _BYTE[n] + value
        pair = head + _BYTE[n + 2] + any_value
        return _ATTRIBUTES + _BYTE[len(pair)] + pair if len(pair) < 128 else _field(_ATTRIBUTES, pair)
    return _field(_ATTRIBUTES, head + _field(b"", _field(_STRING, value)))


def attribute_head(name: str) -> bytes:
    """The part of an attribute's KeyValue before its value's length: its key, then the value's tag."""
    encoded = name.encode() if type(name) is str else _utf8(name)
    return (_field(_KV_KEY, encoded) if encoded else b"") + _KV_VALUE


# -- spans -------------------------------------------------------------------


def _event(event: Event, memo: _Memo) -> bytes:
    return _field(_EVENTS, b"".join([
        _EVENT_TIME + _U64(event.timestamp) if event.timestamp else b"",
        _field(_EVENT_NAME, _utf8(event.name)) if event.name else b"",
        _attributes(_EVENT_ATTRIBUTES, event.attributes, memo),
        _EVENT_DROPPED + _varint(event.dropped_attributes) if event.dropped_attributes else b""]))  # fmt: skip


def _link(link: Link, memo: _Memo) -> bytes:
    context = link.context
    flags = _IS_REMOTE if context and context.is_remote else _HAS_IS_REMOTE  # no W3C trace flags, as stock
    return _field(_LINKS, b"".join([
        _LINK_TRACE_ID + b"\x10" + context.trace_id.to_bytes(16, "big"),
        _LINK_SPAN_ID + b"\x08" + context.span_id.to_bytes(8, "big"),
        _attributes(_LINK_ATTRIBUTES, link.attributes, memo),
        _LINK_DROPPED + _varint(link.dropped_attributes) if link.dropped_attributes else b"",
        _LINK_FLAGS + _U32(flags)]))  # fmt: skip


def _span(span: ReadableSpan, memo: _Memo) -> bytes:
    """One ``ScopeSpans.spans`` entry."""
    return span_entry(span.get_span_context(), span.parent, span.name, span.kind, span.start_time, span.end_time,
                      span.attributes, span.events, span.links, span.status, memo, span.dropped_attributes,
                      span.dropped_events, span.dropped_links)


def span_entry(context: Any, parent: Any, name: str, kind: SpanKind, start: int | None, end: int | None,
               attributes: Mapping[str, Any] | None, events: Sequence[Event], links: Sequence[Link],
               status: Any, memo: _Memo, dropped_attributes: int = 0, dropped_events: int = 0,
               dropped_links: int = 0) -> bytes:
    """A span's ``ScopeSpans.spans`` entry from its parts. The hot path: flat, locals for repeated reads."""
    parts = [_head(context.trace_id, context.span_id, _INTERNAL if kind is SpanKind.INTERNAL else _KINDS[kind],
                   parent, context.trace_state, name, start, end, memo),  # SpanKind's hash is Python code
             _attributes(_ATTRIBUTES, attributes, memo)]
    for event in events:
        parts.append(_event(event, memo))
    for link in links:
        parts.append(_link(link, memo))
    if status is not None:
        code, description = status.status_code, status.description
        if code is StatusCode.UNSET and not description:
            parts.append(_EMPTY_STATUS)
        else:
            parts.append(_field(_STATUS, (_field(_STATUS_MESSAGE, _utf8(description)) if description else b"")
                                + (_STATUS_CODE + _varint(code.value) if code.value else b"")))  # fmt: skip
    if dropped_attributes:
        parts.append(_DROPPED_ATTRIBUTES + _varint(dropped_attributes))
    if dropped_events:
        parts.append(_DROPPED_EVENTS + _varint(dropped_events))
    if dropped_links:
        parts.append(_DROPPED_LINKS + _varint(dropped_links))
    return _field(_SS_SPANS, b"".join(parts))


def _head(trace_id: int, span_id: int, kind: bytes, parent: Any, trace_state: Any, name: str,
          start: int | None, end: int | None, memo: _Memo) -> bytes:
    """A span entry's fields before its attributes: ids, kind, parent, trace state, name, times."""
    if parent:
        last, fields = memo.parent
        if parent is not last:
            fields = _parent_fields(parent)
            memo.parent = (parent, fields)
    else:
        fields = _SPAN_FLAGS[False]
    return b"".join((_trace_field(trace_id, memo), _SPAN_ID_8, span_id.to_bytes(8, "big"), kind, fields,
                     _trace_state(trace_state) if trace_state is not _NO_STATE and trace_state else b"",
                     _name(name, memo) if name else b"", _times(start, end)))


def _parent_fields(parent: Any) -> bytes:
    """The parent's span id field, then the flags field (which says whether it is remote)."""
    return _PARENT_SPAN_ID_8 + parent[_AT_SPAN_ID].to_bytes(8, "big") + _SPAN_FLAGS[bool(parent[_AT_IS_REMOTE])]


def _trace_field(trace_id: int, memo: _Memo) -> bytes:
    """The trace id's field; spans come in runs of one trace, so the last one is remembered."""
    last, field = memo.trace  # one read: the memo may be shared by threads
    if last != trace_id:
        field = _TRACE_ID_16 + trace_id.to_bytes(16, "big")
        memo.trace = (trace_id, field)
    return field


def _times(start: int | None, end: int | None) -> bytes:
    """The start and end time fields; a time of 0 or None is left out, as stock leaves it."""
    if start and end:
        return _TIMES(_START_KEY, start, _END_KEY, end)
    return (_START + _U64(start) if start else b"") + (_END + _U64(end) if end else b"")


def _trace_state(trace_state: Any) -> bytes:
    return _field(_TRACE_STATE, ",".join([f"{k}={v}" for k, v in trace_state.items()]).encode())


def _name(name: str, memo: _Memo) -> bytes:
    field = memo.names.get(name) if type(name) is str else None
    if field is None:
        field = _field(_NAME, name.encode() if type(name) is str else _utf8(name))
        if type(name) is str:
            memo.names[name] = field
    return field


def simple_entry(context: Any, parent: Any, name: str, start: int, end: int, attributes: Mapping[str, Any] | None,
                 memo: _Memo) -> bytes:
    """:func:`span_entry` of an INTERNAL span with status UNSET and no events or links (a small
    compute's root, most often): the same bytes, in fewer steps."""
    return _field(_SS_SPANS, _head(context[_AT_TRACE_ID], context[_AT_SPAN_ID], _INTERNAL, parent, context[_AT_TRACE_STATE],
                                   name, start, end, memo) + _attributes(_ATTRIBUTES, attributes, memo) + _EMPTY_STATUS)


def child_entry(parent: Any, span_id: int, name: str, start: int, end: int, attributes: bytes, memo: _Memo) -> bytes:
    """:func:`span_entry` of an INTERNAL span in ``parent``'s trace (its flags and trace state), with
    status UNSET, no events or links, and its attributes given encoded (:func:`encoded_attributes`).

    The same bytes, written with fewer steps: a compute's task spans share their parent, whose
    fields (the trace id before the span's own id, the rest after) are made once."""
    last, trace, after = memo.child
    if parent is not last:
        trace = _trace_field(parent[_AT_TRACE_ID], memo)
        after = _INTERNAL + _parent_fields(parent)
        trace_state = parent[_AT_TRACE_STATE]
        if trace_state is not _NO_STATE and trace_state:
            after += _trace_state(trace_state)
        memo.child = (parent, trace, after)
    # _name's, _times' and _field's work inline for the usual span (a name met before, both times
    # set, under 16 kB), saving three calls a task span; keep in step with them (the test
    # test_a_child_entry_is_the_span_entry_of_the_same_span holds them to span_entry).
    named = memo.names.get(name) if type(name) is str else None
    if named is None:
        named = _name(name, memo) if name else b""
    body = b"".join((trace, _SPAN_ID_8, span_id.to_bytes(8, "big"), after, named,
                     _TIMES(_START_KEY, start, _END_KEY, end) if start and end else _times(start, end),
                     attributes, _EMPTY_STATUS))
    n = len(body)
    return _SS_SPANS + (_BYTE[n] if n < 128 else _TWO_BYTES(n & 0x7F | 0x80, n >> 7) if n < 16384 else _varint(n)) + body


def encoded_attributes(attributes: Mapping[str, Any], memo: _Memo) -> bytes:
    """``attributes`` as a span's attribute fields; a pair that cannot be encoded is logged and left out."""
    return _attributes(_ATTRIBUTES, attributes, memo)


def encoded_attribute(name: str, value: Any, memo: _Memo) -> bytes:
    """One attribute as a span's attribute field, not remembered; raises if it cannot be encoded."""
    return _attribute(_ATTRIBUTES, name, value, memo.heads)


# -- spans encoded as they end ------------------------------------------------
#
# A span otel_graph makes itself can be encoded where it ends, before it is queued
# (otel_graph.telemetry.spans.DirectEmitter), when every exporter behind the queue takes encoded
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


def new_memo() -> _Memo:
    """A memo for :func:`span_entry` (pairs and keys encoded once); keep its size bounded."""
    return _Memo()


def _entry(span: Any, memo: _Memo) -> bytes:
    """The entry of a ReadableSpan, or of a span encoded as it ended."""
    return span[0] if type(span) is tuple else _span(span, memo)


def _scope_head(scope: Any, memo: _Memo) -> bytes:
    """A ScopeSpans' scope and schema_url fields; ``None`` is stock's empty scope."""
    if scope is None:
        return _SS_SCOPE + b"\x00"
    body = (_field(_SCOPE_NAME, _utf8(scope.name)) if scope.name else b"") + (
        _field(_SCOPE_VERSION, _utf8(scope.version)) if scope.version else b"")
    head = _field(_SS_SCOPE, body + _attributes(_SCOPE_ATTRIBUTES, scope.attributes, memo))
    return head + (_field(_SS_SCHEMA_URL, _utf8(scope.schema_url)) if scope.schema_url else b"")


class EncodedSpans(list):  # type: ignore[type-arg]
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


def encode_chunks(spans: Sequence[ReadableSpan], *, max_bytes: int) -> list[list[ReadableSpan]]:
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
    memo = _Memo()
    chunks: list[list[ReadableSpan]] = []
    current, size = EncodedSpans(), 0
    for span in spans:
        try:
            part = span[0] if type(span) is tuple else _span(span, memo)  # _entry's, inline: a call a span fewer
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


def group_spans(spans: Sequence[ReadableSpan]) -> dict[Any, dict[Any, list[int]]]:
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
            resource, scope = span.resource, span.instrumentation_scope or None
        if resource is not last[0] or scope is not last[1]:
            bucket = groups.setdefault(resource, {}).setdefault(scope, [])
            last = (resource, scope)
        bucket.append(index)
    return groups


def _encode_request(spans: Sequence[ReadableSpan]) -> bytes:
    """``spans`` as a serialized ``ExportTraceServiceRequest``."""
    parts = spans.parts if isinstance(spans, EncodedSpans) else None
    memo = _Memo()
    pieces: list[bytes] = []
    if parts is not None and spans.origin is not None:  # the usual request: every span encoded, of one origin
        resource, scope = _ORIGINS[spans.origin]
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


def _add_resource_spans(pieces: list[bytes], resource: Any, scoped: list[tuple[Any, list[bytes]]], memo: _Memo) -> None:
    """A request's ``resource_spans`` field, of ``resource`` and per scope its spans' entries, appended
    to ``pieces`` in pieces, their lengths worked out ahead: the request's one join then copies
    each entry once, where a field joined at each level of nesting copies the whole request
    (hundreds of kB, each copy a fresh allocation) while the export thread holds the GIL."""
    resource_field = _field(_RS_RESOURCE, _attributes(_RESOURCE_ATTRIBUTES, resource.attributes, memo))
    size = len(resource_field)
    heads = []
    for scope, entries in scoped:
        scope_head = _scope_head(scope, memo)
        spans_size = sum(map(len, entries))
        head = _RS_SCOPE_SPANS + _varint(len(scope_head) + spans_size) + scope_head  # the ScopeSpans field's, to its spans
        heads.append((head, entries))
        size += len(head) + spans_size
    schema = _field(_RS_SCHEMA_URL, _utf8(resource.schema_url)) if resource.schema_url else b""
    pieces += (_REQ_RESOURCE_SPANS + _varint(size + len(schema)), resource_field)
    for head, entries in heads:
        pieces.append(head)
        pieces += entries
    if schema:
        pieces.append(schema)


def encode_spans_fast(spans: Sequence[ReadableSpan]) -> ExportTraceServiceRequest:
    """Encode finished spans as OTLP; equal to the stock ``encode_spans(spans)``, faster."""
    request = ExportTraceServiceRequest()
    request.ParseFromString(_encode_request(spans))
    return request
