"""A user's script whose tasks start OpenTelemetry spans of their own (tests/test_user_spans.py).

Each ``work`` task starts ``user.step`` with ``user.inner`` inside it; ``nested`` runs a
compute inside a task. Run on the scheduler named by ``--scheduler``, with whatever
OTEL_* the parent set, then flushed.
"""

from __future__ import annotations

import argparse

import dask
from dask import delayed
from opentelemetry import trace

import otel_graph

tracer = trace.get_tracer("user-code")


def work(x: int) -> int:
    with tracer.start_as_current_span("user.step") as step:
        step.set_attribute("x", x)
        with tracer.start_as_current_span("user.inner"):
            pass
    return x + 1


def nested(x: int) -> int:
    return dask.compute(delayed(work)(x), scheduler="sync")[0]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scheduler", default="sync")
    args = parser.parse_args()
    handle = otel_graph.instrument_scheduler()
    with tracer.start_as_current_span("user.outside"):  # not in any task
        pass
    tasks = [delayed(work)(i) for i in range(20)] + [delayed(nested)(100)]
    print("RESULT", sum(dask.compute(*tasks, scheduler=args.scheduler)), flush=True)
    print("FLUSHED", handle.flush(timeout_s=30), flush=True)


if __name__ == "__main__":
    main()
