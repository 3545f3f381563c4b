"""A Dask script that something else launched, run as a subprocess by the tests.

Its launcher's trace, if any, is in ``TRACEPARENT`` / ``TRACESTATE``; everything else is
configured the user's way, through OTEL_* variables, and these arguments:

``--scheduler NAME``   sync (default), threads or processes
``--computes N``       computes in a row (default 2), each of a three-task graph
``--parent``           compute inside a span of the app's own; print its TRACE_ID and SPAN_ID
``--app-processor``    add a span processor of the app's to the provider otel_graph built:
                       the compute spans are then the SDK's own (``tracer.start_span``)

It prints RESULT (the computes' results, space-separated) and FLUSHED (``handle.flush()``).
"""

from __future__ import annotations

import argparse

import dask
import dask.multiprocessing
import dask.threaded


def inc(x: int) -> int:
    return x + 1


def add(x: int, y: int) -> int:
    return x + y


GRAPH = {"x": 1, "y": (inc, "x"), "z": (add, "y", 10)}
GETS = {"sync": dask.get, "threads": dask.threaded.get, "processes": dask.multiprocessing.get}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scheduler", default="sync", choices=sorted(GETS))
    parser.add_argument("--computes", type=int, default=2)
    parser.add_argument("--parent", action="store_true")
    parser.add_argument("--app-processor", action="store_true")
    args = parser.parse_args()

    from opentelemetry import trace

    import otel_graph

    handle = otel_graph.instrument_scheduler()
    if args.app_processor:
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        trace.get_tracer_provider().add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))

    # The processes scheduler fuses linear chains by default; keep the tasks as they are.
    options = {"optimize_graph": False} if args.scheduler == "processes" else {}

    def computes() -> list[int]:
        return [GETS[args.scheduler](GRAPH, "z", **options) for _ in range(args.computes)]

    if args.parent:
        with trace.get_tracer("launched-app").start_as_current_span("app-step") as span:
            context = span.get_span_context()
            print("TRACE_ID", f"{context.trace_id:032x}", flush=True)
            print("SPAN_ID", f"{context.span_id:016x}", flush=True)
            results = computes()
    else:
        results = computes()
    print("RESULT", *results, flush=True)
    print("FLUSHED", handle.flush(timeout_s=30), flush=True)


if __name__ == "__main__":  # the processes scheduler starts fresh interpreters
    main()
