"""A user's script that feeds otel_graph hostile input, run as a subprocess by tests/test_hostile.py.

Each compute below is built to break telemetry: keys and messages with lone surrogates
(not encodable as UTF-8), a class with a unicode name, results whose ``__sizeof__`` raises,
or whose sizes add up past int64, a megabyte exception message, a 10 MB key, a span of
the user's own that no exporter can encode, a deeply nested key, a task with 10^4
dependencies, and a storm of 600 failures with long stack traces (one batch of their
spans is over gRPC's 4 MB request limit). It prints RESULT lines for the parent to check
that the computation itself was unharmed, then flushes and prints FLUSHED with the
handle's stats.
"""

from __future__ import annotations

import sys

import dask

import otel_graph

Weird = type("Wéird-ключ", (), {})  # class names may be any unicode (not surrogates: Python refuses those)


class Raises:
    def __sizeof__(self) -> int:
        raise RuntimeError("no size for you")


class Huge:
    def __sizeof__(self) -> int:
        return sys.maxsize - 64  # each fits; a list of them sums past int64


def boom(x: object) -> None:
    raise ValueError("bad \udcff input " + "x" * 2_000_000)


def deep_fail(i: int, depth: int = 150) -> None:
    # A long stack trace and a long message: 600 of these make one 512-span export
    # request larger than gRPC's 4 MB default limit.
    if depth:
        deep_fail(i, depth - 1)
    raise ValueError(f"storm {i} " + "y" * 5_000)


def user_span_with_a_bad_name() -> int:
    # The user's own OpenTelemetry code, inside a task: a span name protobuf cannot encode.
    from opentelemetry import trace

    with trace.get_tracer("user-code").start_as_current_span("user-\udcff"):
        return 1


def total(*parts: int) -> int:
    return sum(parts)


def main() -> None:
    handle = otel_graph.instrument_scheduler()
    deep: object = "deep"
    for level in range(300):  # Dask itself cannot order much deeper keys (it str()s them)
        deep = (deep, level)
    graph = {
        "surrogate-\udcff": (len, "abc"),
        "weird": (Weird,),
        "raises": (Raises,),
        "huge": (lambda: [Huge(), Huge(), Huge()],),
        "k" * 10_000_000: (len, "x"),
        deep: (len, "deep"),
        "user": (user_span_with_a_bad_name,),
    }
    results = dask.get(graph, ["surrogate-\udcff", "weird", "raises", "huge", "k" * 10_000_000, deep, "user"])
    # A graph of its own, so the first one stays small.
    wide = {**{("part", i): (int, i) for i in range(10_000)}, "wide": (total, *[("part", i) for i in range(10_000)])}
    print("RESULT", results[0], isinstance(results[1], Weird), len(results[3]), dask.get(wide, "wide"), flush=True)
    try:
        dask.get({"fail-\udcfe": (boom, 1)}, "fail-\udcfe")
    except ValueError as exc:
        print("RAISED", type(exc).__name__, len(str(exc)), flush=True)
    failed = 0
    for i in range(600):  # a local scheduler stops at a compute's first failure: 600 computes
        try:
            dask.get({("storm", i): (deep_fail, i)}, ("storm", i))
        except ValueError:
            failed += 1
    print("STORM", failed, flush=True)
    print("FLUSHED", handle.flush(timeout_s=60), handle.stats(), flush=True)


if __name__ == "__main__":
    main()
