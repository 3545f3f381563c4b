"""Microseconds per span: the stock OTLP span encoder against ``otel_graph.export.otlp_fast``.

The spans are shaped like task spans: ``ReadableSpan`` objects built directly,
sharing one resource, scope and parent, each with ten attributes (a unique key,
repeated prefix and worker, ints, a float, a bool and a short string array).
Each encoder runs ``--repeat`` times, alternating; the best run counts, since
noise on a shared machine only ever adds time. The outputs are checked equal
first, so the two encoders are timed doing the same work. ``fast`` returns the
parsed message, which the gRPC exporter sends; ``fast bytes`` is the serialized
request that the HTTP exporter sends; ``stock + serialize`` is what the stock
HTTP exporter does. Usage::

    python benchmarks/bench_encode.py [--spans 20000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans  # noqa: E402
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan  # noqa: E402
from opentelemetry.sdk.util.instrumentation import InstrumentationScope  # noqa: E402
from opentelemetry.trace import SpanContext, TraceFlags  # noqa: E402

from otel_graph.export.otlp_fast import _encode_request, encode_spans_fast  # noqa: E402


def task_spans(count: int) -> list[ReadableSpan]:
    rng = random.Random(0)
    resource = Resource({"service.name": "dask", "host.name": "bench", "process.pid": 4242})
    scope = InstrumentationScope("otel_graph", "0.1.0")
    trace_id = rng.getrandbits(128)
    root = SpanContext(trace_id, rng.getrandbits(64), is_remote=False, trace_flags=TraceFlags(1))
    start = time.time_ns()
    spans = []
    for i in range(count):
        prefix = ("inc", "add", "sum-aggregate")[i % 3]
        spans.append(ReadableSpan(
            name=prefix,
            context=SpanContext(trace_id, rng.getrandbits(64), is_remote=False, trace_flags=TraceFlags(1)),
            parent=root, resource=resource, instrumentation_scope=scope,
            attributes={
                "dask.key": f"('{prefix}-8f3a9c', {i})", "dask.prefix": prefix, "dask.group": f"{prefix}-8f3a9c",
                "dask.worker": f"tcp://127.0.0.1:{40000 + i % 4}", "dask.thread": 139_872_001 + i % 4,
                "dask.nbytes": 8_000 + i % 17, "dask.duration_s": rng.random() / 100, "dask.ok": True,
                "dask.retries": 0, "dask.dependencies": (f"('{prefix}-1', {i})", f"('{prefix}-2', {i})"),
            },
            start_time=start + i * 1_000, end_time=start + i * 1_000 + 700,
        ))  # fmt: skip
    return spans


def best_seconds(encode: Callable[[Sequence[ReadableSpan]], Any], spans: list[ReadableSpan], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        began = time.perf_counter()
        encode(spans)
        best = min(best, time.perf_counter() - began)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    spans = task_spans(args.spans)
    if encode_spans_fast(spans) != encode_spans(spans):
        raise SystemExit("the encoders disagree; fix otlp_fast before timing it")
    encoders: dict[str, Callable[[Sequence[ReadableSpan]], Any]] = {
        "stock": encode_spans,
        "stock + serialize": lambda s: encode_spans(s).SerializePartialToString(),
        "fast": encode_spans_fast,
        "fast bytes": _encode_request,
    }
    best = dict.fromkeys(encoders, float("inf"))
    for _ in range(args.repeat):  # alternate, so a slow spell of the machine hits every encoder
        for name, encode in encoders.items():
            best[name] = min(best[name], best_seconds(encode, spans, 1))
    print(f"{args.spans} task spans, 10 attributes each, best of {args.repeat}")
    for name, seconds in best.items():
        print(f"  {name:18s} {seconds / len(spans) * 1e6:7.1f} µs/span")
    print(f"  fast is {best['stock'] / best['fast']:.1f}x faster than stock (gRPC path), "
          f"{best['stock + serialize'] / best['fast bytes']:.1f}x (HTTP path)")  # fmt: skip


if __name__ == "__main__":
    main()
