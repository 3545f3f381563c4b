"""One span as OTLP bytes: its ``ScopeSpans.spans`` entry, from a ``ReadableSpan`` or from its parts.

:func:`span_entry` writes any span, field for field as the stock encoder would (ids,
kind, parent, trace state, name, times, attributes, events, links, status, drop counts).
Spans otel_graph makes itself take shorter paths to the same bytes: :func:`simple_entry`
for an INTERNAL span with no events (a compute's root), :func:`child_entry` for a task span,
whose attributes come already encoded (:func:`encoded_attributes`, :func:`keyed_string`,
or :mod:`otel_graph.telemetry.task_encoding`) and whose parent's fields are made once for
all its siblings. Each takes a memo (:func:`new_memo`) of what repeats between spans:
(key, value) pairs, span names, the last trace id and parent. The wire format itself is
:mod:`otel_graph.export.otlp_wire`; :mod:`otel_graph.export.otlp_fast` puts entries in a request.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.proto.trace.v1.trace_pb2 import ScopeSpans, Span, SpanFlags, Status
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.trace import Link, SpanKind, StatusCode
from opentelemetry.trace.span import DEFAULT_TRACE_STATE as _NO_STATE

from otel_graph.export.otlp_wire import (
    ANY_STRING,
    BYTE,
    TWO_BYTES,
    U32,
    U64,
    Memo,
    field_keys,
    key_value,
    key_values,
    utf8,
    varint,
    wire_field,
)

(_SS_SPANS,) = field_keys(ScopeSpans, "spans")
(_TRACE_ID, _SPAN_ID, _TRACE_STATE, _PARENT_SPAN_ID, _NAME, _KIND, _START, _END, _ATTRIBUTES, _DROPPED_ATTRIBUTES,
 _EVENTS, _DROPPED_EVENTS, _LINKS, _DROPPED_LINKS, _STATUS, _FLAGS) = field_keys(
    Span, "trace_id", "span_id", "trace_state", "parent_span_id", "name", "kind", "start_time_unix_nano",
    "end_time_unix_nano", "attributes", "dropped_attributes_count", "events", "dropped_events_count", "links",
    "dropped_links_count", "status", "flags")  # fmt: skip
_EVENT_TIME, _EVENT_NAME, _EVENT_ATTRIBUTES, _EVENT_DROPPED = field_keys(
    Span.Event, "time_unix_nano", "name", "attributes", "dropped_attributes_count")
_LINK_TRACE_ID, _LINK_SPAN_ID, _LINK_ATTRIBUTES, _LINK_DROPPED, _LINK_FLAGS = field_keys(
    Span.Link, "trace_id", "span_id", "attributes", "dropped_attributes_count", "flags")
_STATUS_MESSAGE, _STATUS_CODE = field_keys(Status, "message", "code")

_KINDS = {kind: _KIND + varint(getattr(Span, f"SPAN_KIND_{kind.name}")) for kind in SpanKind}
_INTERNAL = _KINDS[SpanKind.INTERNAL]
_HAS_IS_REMOTE = SpanFlags.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
_IS_REMOTE = _HAS_IS_REMOTE | SpanFlags.SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK
_SPAN_FLAGS = {False: _FLAGS + U32(_HAS_IS_REMOTE), True: _FLAGS + U32(_IS_REMOTE)}  # by parent.is_remote
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

# -- spans -------------------------------------------------------------------


def _event(event: Event, memo: Memo) -> bytes:
    return wire_field(_EVENTS, b"".join([
        _EVENT_TIME + U64(event.timestamp) if event.timestamp else b"",
        wire_field(_EVENT_NAME, utf8(event.name)) if event.name else b"",
        key_values(_EVENT_ATTRIBUTES, event.attributes, memo),
        _EVENT_DROPPED + varint(event.dropped_attributes) if event.dropped_attributes else b""]))  # fmt: skip


def _link(link: Link, memo: Memo) -> bytes:
    context = link.context
    flags = _IS_REMOTE if context and context.is_remote else _HAS_IS_REMOTE  # no W3C trace flags, as stock
    return wire_field(_LINKS, b"".join([
        _LINK_TRACE_ID + b"\x10" + context.trace_id.to_bytes(16, "big"),
        _LINK_SPAN_ID + b"\x08" + context.span_id.to_bytes(8, "big"),
        key_values(_LINK_ATTRIBUTES, link.attributes, memo),
        _LINK_DROPPED + varint(link.dropped_attributes) if link.dropped_attributes else b"",
        _LINK_FLAGS + U32(flags)]))  # fmt: skip


def encode_span(span: ReadableSpan, memo: Memo) -> bytes:
    """One ``ScopeSpans.spans`` entry."""
    return span_entry(span.get_span_context(), span.parent, span.name, span.kind, span.start_time, span.end_time,
                      span.attributes, span.events, span.links, span.status, memo, span.dropped_attributes,
                      span.dropped_events, span.dropped_links)


def span_entry(context: Any, parent: Any, name: str, kind: SpanKind, start: int | None, end: int | None,
               attributes: Mapping[str, Any] | None, events: Sequence[Event], links: Sequence[Link],
               status: Any, memo: Memo, dropped_attributes: int = 0, dropped_events: int = 0,
               dropped_links: int = 0) -> bytes:
    """A span's ``ScopeSpans.spans`` entry from its parts. The hot path: flat, locals for repeated reads."""
    parts = [_head(context.trace_id, context.span_id, _INTERNAL if kind is SpanKind.INTERNAL else _KINDS[kind],
                   parent, context.trace_state, name, start, end, memo),  # SpanKind's hash is Python code
             key_values(_ATTRIBUTES, attributes, memo)]
    for event in events:
        parts.append(_event(event, memo))
    for link in links:
        parts.append(_link(link, memo))
    if status is not None:
        code, description = status.status_code, status.description
        if code is StatusCode.UNSET and not description:
            parts.append(_EMPTY_STATUS)
        else:
            parts.append(wire_field(_STATUS, (wire_field(_STATUS_MESSAGE, utf8(description)) if description else b"")
                                + (_STATUS_CODE + varint(code.value) if code.value else b"")))  # fmt: skip
    if dropped_attributes:
        parts.append(_DROPPED_ATTRIBUTES + varint(dropped_attributes))
    if dropped_events:
        parts.append(_DROPPED_EVENTS + varint(dropped_events))
    if dropped_links:
        parts.append(_DROPPED_LINKS + varint(dropped_links))
    return wire_field(_SS_SPANS, b"".join(parts))


def _head(trace_id: int, span_id: int, kind: bytes, parent: Any, trace_state: Any, name: str,
          start: int | None, end: int | None, memo: Memo) -> bytes:
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


def _trace_field(trace_id: int, memo: Memo) -> bytes:
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
    return (_START + U64(start) if start else b"") + (_END + U64(end) if end else b"")


def _trace_state(trace_state: Any) -> bytes:
    return wire_field(_TRACE_STATE, ",".join([f"{k}={v}" for k, v in trace_state.items()]).encode())


def _name(name: str, memo: Memo) -> bytes:
    field = memo.names.get(name) if type(name) is str else None
    if field is None:
        field = wire_field(_NAME, name.encode() if type(name) is str else utf8(name))
        if type(name) is str:
            memo.names[name] = field
    return field


def simple_entry(context: Any, parent: Any, name: str, start: int, end: int, attributes: Mapping[str, Any] | None,
                 memo: Memo) -> bytes:
    """:func:`span_entry` of an INTERNAL span with status UNSET and no events or links (a small
    compute's root, most often): the same bytes, in fewer steps."""
    return wire_field(_SS_SPANS, _head(context[_AT_TRACE_ID], context[_AT_SPAN_ID], _INTERNAL, parent,
                                   context[_AT_TRACE_STATE], name, start, end, memo)
                  + key_values(_ATTRIBUTES, attributes, memo) + _EMPTY_STATUS)


def child_entry(parent: Any, span_id: int, name: str, start: int, end: int, attributes: bytes, memo: Memo) -> bytes:
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
    # _name's, _times' and wire_field's work inline for the usual span (a name met before, both times
    # set, under 16 kB), saving three calls a task span; keep in step with them (the test
    # test_a_child_entry_is_the_span_entry_of_the_same_span holds them to span_entry).
    named = memo.names.get(name) if type(name) is str else None
    if named is None:
        named = _name(name, memo) if name else b""
    body = b"".join((trace, _SPAN_ID_8, span_id.to_bytes(8, "big"), after, named,
                     _TIMES(_START_KEY, start, _END_KEY, end) if start and end else _times(start, end),
                     attributes, _EMPTY_STATUS))
    n = len(body)
    return _SS_SPANS + (BYTE[n] if n < 128 else TWO_BYTES(n & 0x7F | 0x80, n >> 7) if n < 16384
                        else varint(n)) + body


# -- attributes encoded ahead of their span ---------------------------------


def encoded_attributes(attributes: Mapping[str, Any], memo: Memo) -> bytes:
    """``attributes`` as a span's attribute fields; a pair that cannot be encoded is logged and left out."""
    return key_values(_ATTRIBUTES, attributes, memo)


def encoded_attribute(name: str, value: Any, memo: Memo) -> bytes:
    """One attribute as a span's attribute field, not remembered; raises if it cannot be encoded."""
    return key_value(_ATTRIBUTES, name, value, memo.heads)


def keyed_string(head: bytes, text: str) -> bytes:
    """A string attribute as a span's attribute field, its key given as
    :func:`~otel_graph.export.otlp_wire.attribute_head` made it: the same bytes as
    :func:`encoded_attribute`, in fewer steps."""
    value = text.encode()
    n = len(value)
    if n < 100:  # the usual key: each length below is one byte
        any_value = ANY_STRING + BYTE[n] + value
        pair = head + BYTE[n + 2] + any_value
        return _ATTRIBUTES + BYTE[len(pair)] + pair if len(pair) < 128 else wire_field(_ATTRIBUTES, pair)
    return wire_field(_ATTRIBUTES, head + wire_field(b"", wire_field(ANY_STRING, value)))


def new_memo() -> Memo:
    """A memo for :func:`span_entry` (pairs and keys encoded once); keep its size bounded."""
    return Memo()
