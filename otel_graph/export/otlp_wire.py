"""The protobuf wire format, as the OTLP span encoders write it: fields, keys, attribute values.

The encoders (:mod:`otel_graph.export.otlp_spans` for a span's entry,
:mod:`otel_graph.export.otlp_fast` for a request) write protobuf bytes themselves,
from these parts:

* varints and length-delimited fields (:func:`varint`, :func:`wire_field`), and each field's key
  read from the official ``opentelemetry-proto`` descriptors (:func:`field_keys`), never typed in;
* an attribute's ``AnyValue`` by the value's type (:data:`_ANY`), the stock encoder's
  ``isinstance`` order for subclasses (:func:`_any_encoder`);
* a ``KeyValue`` list (:func:`key_values`), each (key, value) pair that can repeat encoded
  once and remembered in a :class:`Memo`; a pair that cannot be encoded is logged and left
  out, as stock leaves it.

The names without an underscore are what the two encoders and
:mod:`otel_graph.telemetry.task_encoding` (:func:`attribute_head`) share; the rest is this
module's own.

>>> varint(300).hex(), wire_field(b"\\x0a", b"inc").hex()
('ac02', '0a03696e63')
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Mapping, Sequence
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList

_logger = logging.getLogger("otel_graph.otlp_fast")  # the name it has always logged under

BYTE = [bytes((n,)) for n in range(128)]  # a varint below 128 is that one byte
U64 = struct.Struct("<Q").pack  # fixed64
_F64 = struct.Struct("<d").pack  # double
U32 = struct.Struct("<I").pack  # fixed32
_FD = FieldDescriptor
_WIRE_TYPE = {_FD.TYPE_DOUBLE: 1, _FD.TYPE_FIXED64: 1, _FD.TYPE_FIXED32: 5,  # others used here are varints (0)
              _FD.TYPE_STRING: 2, _FD.TYPE_BYTES: 2, _FD.TYPE_MESSAGE: 2}  # fmt: skip


def varint(n: int) -> bytes:
    if n < 128:
        return BYTE[n]
    out = bytearray()
    while n > 127:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


TWO_BYTES = struct.Struct("BB").pack


def wire_field(key: bytes, payload: bytes) -> bytes:
    """A length-delimited field: a string, bytes or an embedded message."""
    n = len(payload)
    return key + (BYTE[n] if n < 128 else TWO_BYTES(n & 0x7F | 0x80, n >> 7) if n < 16384 else varint(n)) + payload


def field_keys(message: type[Message], *names: str) -> list[bytes]:
    """The field keys (number and wire type) of ``names``, read from the official descriptor."""
    fields = message.DESCRIPTOR.fields_by_name
    return [varint(fields[n].number << 3 | _WIRE_TYPE.get(fields[n].type, 0)) for n in names]


_KV_KEY, _KV_VALUE = field_keys(KeyValue, "key", "value")
(_ARRAY_VALUES,), (_KVLIST_VALUES,) = field_keys(ArrayValue, "values"), field_keys(KeyValueList, "values")
ANY_STRING, _BOOL, _INT, _DOUBLE, _ARRAY, _KVLIST, _BYTES = field_keys(
    AnyValue, "string_value", "bool_value", "int_value", "double_value", "array_value", "kvlist_value", "bytes_value")

# -- attribute values --------------------------------------------------------


def _any_int(value: int) -> bytes:
    if not -(1 << 63) <= value < 1 << 63:
        raise ValueError(f"Value out of range: {value}")
    return _INT + varint(value & 0xFFFF_FFFF_FFFF_FFFF)  # a negative int64 is a 10-byte varint


def _any_array(value: Sequence[Any]) -> bytes:
    items = []
    for item in value:
        if type(item) is str:  # the usual item, inlined: 1-byte key, length, string AnyValue (1-byte key)
            encoded = item.encode()
            if len(encoded) < 126:
                items.append(_ARRAY_VALUES + BYTE[len(encoded) + 2] + ANY_STRING + BYTE[len(encoded)] + encoded)
                continue
        items.append(wire_field(_ARRAY_VALUES, (_ANY.get(type(item)) or _any_encoder(item))(item)))
    return wire_field(_ARRAY, b"".join(items))


def _any_kvlist(value: Mapping[Any, Any]) -> bytes:
    return wire_field(_KVLIST, b"".join([key_value(_KVLIST_VALUES, str(k), v, {}) for k, v in value.items()]))


# Exact types first, so the common case is one dict lookup; ``_any_encoder`` handles subclasses.
_ANY = {str: lambda value: wire_field(ANY_STRING, value.encode()), int: _any_int,
        float: lambda value: _DOUBLE + _F64(value),
        bool: lambda value: _BOOL + (b"\x01" if value else b"\x00"), bytes: lambda value: wire_field(_BYTES, value),
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


def utf8(text: str | bytes) -> bytes:
    """A string field's payload. Like the messages, take str, or bytes that are valid UTF-8."""
    if isinstance(text, str):
        return text.encode()  # a lone surrogate raises, as in the messages
    if isinstance(text, bytes):
        text.decode()  # raises on invalid UTF-8
        return bytes(text)
    raise TypeError(f"bad argument type {type(text)} for a string field")


class Memo:
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


def key_values(field: bytes, attributes: Mapping[str, Any] | None, memo: Memo) -> bytes:
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
                    encoded = pairs[memo_key] = key_value(field, name, value, heads)
            else:
                encoded = key_value(field, name, value, heads)
            parts.append(encoded)
        except Exception as error:  # noqa: BLE001 - stock logs and skips the key, keeping the span
            _logger.exception("Failed to encode key %s: %s", name, error)
    return b"".join(parts)


def key_value(field: bytes, name: str, value: Any, heads: dict[str, bytes]) -> bytes:
    """One KeyValue as ``field``; ``heads`` caches the key part (the key, then the value's tag)."""
    head = heads.get(name)
    if head is None:
        head = heads[name] = attribute_head(name)
    value_bytes = (_ANY.get(type(value)) or _any_encoder(value))(value)
    n = len(value_bytes)
    return wire_field(field, head + (BYTE[n] if n < 128 else varint(n)) + value_bytes)


def attribute_head(name: str) -> bytes:
    """The part of an attribute's KeyValue before its value's length: its key, then the value's tag."""
    encoded = name.encode() if type(name) is str else utf8(name)
    return (wire_field(_KV_KEY, encoded) if encoded else b"") + _KV_VALUE

