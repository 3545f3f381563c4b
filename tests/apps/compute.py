"""A user's script, run as a subprocess by the tests: instrument, compute, exit.

Configured the user's way, through OTEL_* variables, plus these arguments:
``--scheduler``, ``--tasks``, ``--fail`` (one task raises), ``--wait-stdin`` (compute,
print COMPUTED, then wait for a line on stdin before flushing), ``--no-instrument``
(for opentelemetry-instrument runs), ``--flush`` (call ``handle.flush()`` before
exiting and print FLUSHED with its result and the handle's stats, then FLUSH_SECONDS,
how long the call took), ``--flush-before-wait`` (the same, but before COMPUTED, so
that what the parent inspects while the app waits is complete) and
``--flush-timeout`` (the flush's ``timeout_s``, default 30), ``--straggle-ms N`` (with
``--fail`` on the threads scheduler, given 4 threads: a task still running for N ms when
the compute fails, its ``straggle`` task begun before ``boom`` raises), ``--built-before-wait``
(before COMPUTED, wait until every task record is a span, queued or dropped: what
arrives later is then what was held), ``--busy-ms`` (CPU
time each task burns, default 0), ``--storm N`` (then N computes whose one task fails
with a 5 kB message and a deep stack) and ``--die kill|term|exit`` (one task ends the process
running it: a processes-scheduler worker dying mid-graph; RAISED names what Dask raised). It prints RESULT and
LAST_COMPUTE_END (a time.monotonic() reading) so the parent can check correctness
and exit latency.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from typing import Any

import dask
import dask.multiprocessing
import dask.threaded

BUSY_S = 0.0
STRAGGLE_S = 0.0
STRAGGLING = threading.Event()


def inc(x: int) -> int:
    # Real CPU work (not a sleep) so that CPU readings have clock ticks to measure.
    deadline = time.thread_time() + BUSY_S
    while time.thread_time() < deadline:
        pass
    return x + 1


def boom(x: int) -> int:
    if STRAGGLE_S:
        STRAGGLING.wait(10)
    raise RuntimeError(f"task failed on purpose at {x}")


def straggle() -> None:
    STRAGGLING.set()
    time.sleep(STRAGGLE_S)


def deep_fail(i: int, depth: int = 100) -> None:
    if depth:
        deep_fail(i, depth - 1)
    raise ValueError(f"storm {i} " + "y" * 5_000)


def die(how: str) -> None:
    """End the process running this task: a processes-scheduler worker dying mid-graph."""
    import os
    import signal

    if how == "exit":
        os._exit(0)
    os.kill(os.getpid(), signal.SIGKILL if how == "kill" else signal.SIGTERM)
    time.sleep(30)  # SIGTERM is delivered asynchronously; never return a result


def say(label: str, *values: Any) -> None:
    """One whole line in one write: a console exporter writing from its own thread must not
    land between a label and its value."""
    sys.stdout.write(" ".join(map(str, (label, *values))) + "\n")
    sys.stdout.flush()


def report_flush(handle: Any, timeout_s: float) -> None:
    started = time.monotonic()
    flushed = handle.flush(timeout_s=timeout_s)
    took = time.monotonic() - started
    say("FLUSHED", flushed, handle.stats())
    say("FLUSH_SECONDS", took)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scheduler", default="sync")
    parser.add_argument("--tasks", type=int, default=20)
    parser.add_argument("--fail", action="store_true")
    parser.add_argument("--wait-stdin", action="store_true")
    parser.add_argument("--no-instrument", action="store_true")
    parser.add_argument("--flush", action="store_true")
    parser.add_argument("--flush-before-wait", action="store_true")
    parser.add_argument("--flush-timeout", type=float, default=30.0)
    parser.add_argument("--built-before-wait", action="store_true")
    parser.add_argument("--busy-ms", type=float, default=0.0)
    parser.add_argument("--straggle-ms", type=float, default=0.0)
    parser.add_argument("--storm", type=int, default=0)
    parser.add_argument("--die", choices=["kill", "term", "exit"], help="one task ends its worker process")
    args = parser.parse_args()
    global BUSY_S, STRAGGLE_S
    BUSY_S, STRAGGLE_S = args.busy_ms / 1000, args.straggle_ms / 1000

    handle = None
    if not args.no_instrument:
        import otel_graph

        handle = otel_graph.instrument_scheduler()
    graph = {("inc", i): (inc, i) for i in range(args.tasks)}
    if args.fail:
        graph[("boom", 0)] = (boom, ("inc", 0))
    if args.straggle_ms:
        graph[("straggle", 0)] = (straggle,)
    if args.die:
        graph[("die", 0)] = (die, args.die)
    try:
        get = {"sync": dask.get, "threads": dask.threaded.get, "processes": dask.multiprocessing.get}
        # Enough threads for straggle beside boom, whatever the machine's CPU count.
        options = {"num_workers": 4} if args.straggle_ms else {}
        values = get[args.scheduler](graph, list(graph), **options)
        say("RESULT", sum(values))
    except RuntimeError as exc:
        say("FAILED", exc)
    except Exception as exc:  # a dead worker process: whatever Dask raises for it
        say("RAISED", type(exc).__name__)
    for i in range(args.storm):  # a local scheduler stops at a compute's first failure
        try:
            dask.get({("storm", i): (deep_fail, i)}, ("storm", i))
        except ValueError:
            pass
    say("LAST_COMPUTE_END", time.monotonic())
    if args.flush_before_wait and handle is not None:
        report_flush(handle, args.flush_timeout)
    if args.built_before_wait and handle is not None:
        handle._tracker.flush(None)  # the building only; the collector may be refusing
    if args.wait_stdin:
        say("COMPUTED")
        sys.stdin.readline()
    if args.flush and handle is not None:
        report_flush(handle, args.flush_timeout)


if __name__ == "__main__":
    main()
