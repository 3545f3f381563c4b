"""``otel_graph.export.otlp_json``'s span lines: written straight from the spans, equal, key for key
and in the same order, to protobuf's JSON mapping of the stock request (the way they
were written before, and the way any span the direct writer leaves alone still is)."""

from __future__ import annotations

import json
import logging
import random

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode

from otel_graph.export import otlp_json, otlp_wire
from otel_graph.export.otlp_fast import encode_spans_fast
from test_otlp_fast import ALL_TYPES, RESOURCE, SCOPE, _context, sdk_spans  # noqa: F401


def mapped(spans: list[ReadableSpan]) -> str:
    """The line as protobuf's JSON mapping writes it."""
    return otlp_json.request_json(encode_spans_fast(spans))


def assert_written_as_mapped(spans: list[ReadableSpan], *, direct: bool = True) -> None:
    line = otlp_json.span_request_json(spans)
    assert line == mapped(spans)
    try:
        otlp_json._spans_request(spans)
        took_direct = True
    except otlp_json._Unusual:
        took_direct = False
    assert took_direct is direct  # so the equality above tested the writer meant


def test_sdk_spans_are_written_as_mapped(sdk_spans):  # noqa: F811
    # The root holds every attribute type (bytes, None, maps among them) and one span has links:
    # those two go through the mapping alone, the rest of the line is the direct writer's.
    assert_written_as_mapped([s for s in sdk_spans if not s.links and s.name != "dask.compute"])
    assert_written_as_mapped(sdk_spans)


def test_a_resource_the_direct_writer_leaves_alone_sends_the_line_through_the_mapping():
    span = ReadableSpan("s", context=_context(1, 2), resource=Resource({"raw": b"\x00"}), instrumentation_scope=SCOPE)
    assert_written_as_mapped([span], direct=False)


@pytest.mark.parametrize("name", sorted(ALL_TYPES))
def test_each_attribute_type_is_written_as_mapped(name):
    value = ALL_TYPES[name]
    span = ReadableSpan("inc", context=_context(1, 2), resource=RESOURCE, instrumentation_scope=SCOPE,
                        attributes={name: value}, start_time=1, end_time=2)
    line = otlp_json.span_request_json([span])
    assert line == mapped([span])
    assert json.loads(line)["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["attributes"][0]["key"] == name


def test_task_spans_of_every_status_and_with_events_take_the_direct_writer():
    spans = [ReadableSpan(name=name, context=_context(0xFEED, i + 1), parent=_context(0xFEED, 0xBEEF, remote=i == 1),
                          resource=RESOURCE, instrumentation_scope=scope, kind=kind, status=status,
                          attributes={"dask.task.key": f"inc-{i}", "dask.task.nbytes": 2**40, "dask.task.dependencies":
                                      ("a", "b"), "empty": (), "ratio": -0.0, "ok": False},
                          events=[Event("exception", {"exception.message": "boom ✗"}, timestamp=7)] if i % 2 else (),
                          start_time=100 + i, end_time=0 if i == 3 else 200 + i)
             for i, (name, scope, kind, status) in enumerate([
                 ("inc", SCOPE, SpanKind.INTERNAL, Status(StatusCode.UNSET)),
                 ("", None, SpanKind.SERVER, Status(StatusCode.ERROR, "failed: ✗")),
                 ("ü", SCOPE, SpanKind.CONSUMER, Status(StatusCode.OK)),
                 ("inc", None, SpanKind.CLIENT, Status(StatusCode.ERROR))])]
    spans.append(ReadableSpan("other", context=_context(9, 9), resource=Resource({"service.name": "x"}, "url"),
                              instrumentation_scope=SCOPE))
    assert_written_as_mapped(spans)


def _plain_value(rng: random.Random, depth: int = 0):  # noqa: ANN202
    """A random attribute value of a type the direct writer takes."""
    pick = rng.randrange(6 if depth < 2 else 5)
    if pick == 0:
        return rng.choice(["", "a", "ü ✓", "x" * 200])
    if pick == 1:
        return rng.choice([True, False])
    if pick == 2:
        return rng.choice([0, 1, -1, 2**63 - 1, -(2**63), rng.randrange(-(2**40), 2**40)])
    if pick == 3:
        return rng.choice([0.0, -0.0, 1.0, 1e-7, 1e22, rng.uniform(-1e9, 1e9)])
    if pick == 4:
        return rng.choice(["a", "b"])
    return [_plain_value(rng, depth + 1) for _ in range(rng.randrange(4))]


@pytest.mark.parametrize("seed", range(5))
def test_random_spans_take_the_direct_writer_and_write_as_mapped(seed):
    rng = random.Random(seed)
    resources = [RESOURCE, Resource({"service.name": "other"}, "https://schema"), Resource({"service.name": "dask"})]
    spans = [ReadableSpan(name=rng.choice(["inc", "add", "ü", ""]), context=_context(rng.getrandbits(128) or 1, i + 1),
                          parent=rng.choice([None, _context(1, 2), _context(1, 3, remote=True)]),
                          resource=rng.choice(resources), instrumentation_scope=rng.choice([SCOPE, None]),
                          kind=rng.choice(list(SpanKind)),
                          attributes={f"k{rng.randrange(12)}": _plain_value(rng) for _ in range(rng.randrange(6))},
                          events=[Event("e", {"k": _plain_value(rng)}, timestamp=i)] if i % 5 == 0 else (),
                          start_time=rng.getrandbits(63), end_time=rng.getrandbits(63))
             for i in range(100)]
    assert_written_as_mapped(spans)


@pytest.mark.parametrize("where", ["span", "event", "resource", "scope"])
def test_a_key_that_is_not_utf8_costs_that_key_only(where, caplog):
    """A lone surrogate in a key: the mapping's path leaves that key out (and logs it),
    rather than the whole line failing to write."""
    # Its log line would carry the surrogate into pytest-xdist's report, which cannot carry it.
    caplog.set_level(logging.CRITICAL + 1, logger=otlp_wire._logger.name)
    bad = {"path\udcff": "v", "ok": 1}
    span = ReadableSpan(
        "s", context=_context(1, 2), attributes=bad if where == "span" else {"ok": 1},
        events=[Event("e", bad)] if where == "event" else (),
        resource=Resource(bad) if where == "resource" else RESOURCE,
        instrumentation_scope=InstrumentationScope("s", "1", attributes=bad) if where == "scope" else SCOPE)
    line = otlp_json.span_request_json([span])
    assert line == mapped([span]) and "\\udcff" not in line and '"key":"ok"' in line
    line.encode()  # writable


@pytest.mark.parametrize("field, value", [("trace_id", 2**128 + 5), ("trace_id", -1), ("span_id", 2**64),
                                          ("start_time", -5), ("start_time", 2**64), ("start_time", True)])
def test_ids_and_times_out_of_range_are_left_to_the_mapping(field, value):
    """What the mapping's path does with them (fail, or write True as 1), the line does."""
    context = {"trace_id": 7, "span_id": 8}
    times = {"start_time": 1, "end_time": 2}
    if field in context:
        context[field] = value
    else:
        times[field] = value
    span = ReadableSpan("s", context=SpanContext(context["trace_id"], context["span_id"], is_remote=False),
                        resource=RESOURCE, instrumentation_scope=SCOPE, **times)
    with pytest.raises(otlp_json._Unusual):
        otlp_json._span(span)
    try:
        expected: object = mapped([span])
    except Exception as error:  # noqa: BLE001
        expected = type(error)
    try:
        written: object = otlp_json.span_request_json([span])
    except Exception as error:  # noqa: BLE001
        written = type(error)
    assert written == expected
