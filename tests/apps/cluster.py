"""A user's dask.distributed script, run as a subprocess by the tests.

Configured the user's way, through OTEL_* variables, plus arguments:

``--workers N``          LocalCluster worker processes (default 2)
``--client-first``       create the Client before calling instrument_scheduler()
``--attach``             pass the client: instrument_scheduler(client=client)
``--scheduler ADDR``     connect to a running scheduler instead of a LocalCluster
``--workload NAME``      sum (default), fail, transfer, spill, persist, kill, many,
                         retry, map, nested, slow, pause, stall, jobs, chain (on
                         workers named fast and skewed), chain-jump (the skewed worker's
                         clock jumps by a second mid-compute), nested-skewed (a task on
                         skewed computes a graph of its own), user-spans-skewed (a task
                         on each of fast and skewed starts a span of its own)
``--memory-limit TEXT``  per-worker memory limit (for spill)
``--parent``             run the compute inside a span of the app's own
``--flush``              call handle.flush() before closing the client, print FLUSHED
                         and STATS (handle.stats(workers=True), as JSON)
``--wait-workers N``     wait for N workers first (with --scheduler; a LocalCluster's are always waited for)
``--flush-timeout S``    the flush's timeout (default 30)
``--debug-logs``         log everything at DEBUG to stderr
``--no-memory-guard``    never pause, spill or kill workers for memory
``--hold``               after the work, print HOLDING and wait for a line on stdin

It prints RESULT (or FAILED with the exception type), TRACE_ID/PARENT_SPAN_ID under
``--parent``, and WORKERS (the worker addresses).
"""

from __future__ import annotations

import argparse
import json
import operator
import os
import sys

import dask
import numpy as np
from distributed import Client, LocalCluster, futures_of, wait


def inc(x: int) -> int:
    return x + 1


def boom(x: int) -> int:
    raise ValueError(f"bad input {x}")


def die(x: int) -> int:
    import os

    os._exit(3)


def nested(n: int) -> int:
    from distributed import get_client

    graph = {f"inner-{i}": (inc, i) for i in range(n)}
    return sum(get_client().get(graph, list(graph)))


def nap(seconds: float) -> float:
    import time

    time.sleep(seconds)
    return seconds


def flaky(x: int, marker: str) -> int:
    import os

    if not os.path.exists(marker):
        open(marker, "w").close()
        raise RuntimeError("first attempt fails")
    os.unlink(marker)
    return x


def block(i: int, size: int) -> np.ndarray:
    return np.full(size, i, dtype="u1")


def total(*blocks: np.ndarray) -> int:
    return int(sum(int(b.sum()) for b in blocks))


def inc_unless(x: int, bad: int) -> int:
    return boom(x) if x == bad else x + 1


STALLED: list = []


def jobs(client: Client) -> str:
    """Named computes of every way a compute ends, for their per-job totals."""
    import dask.array as da

    import otel_graph

    x = da.random.RandomState(0).random((400, 400), chunks=100)
    with otel_graph.name("sum-job"):
        client.compute((x + x.T).sum()).result()
    with otel_graph.name("fail-job"):
        try:
            client.get({"inc-0": (inc, 1), "boom-0": (boom, "inc-0")}, "boom-0")
        except ValueError:
            pass
    with otel_graph.name("fail-first-job"):  # get raises at the failed output, the other still running
        try:
            client.get({"inc-1": (inc, 1), "boom-1": (boom, "inc-1"), "nap-1": (nap, 1.0)}, ["nap-1", "boom-1"])
        except ValueError:
            pass
    with otel_graph.name("map-job"):
        wait(client.map(inc_unless, range(10), bad=3))
    with Client(client.scheduler.address, set_as_default=False) as other:
        with otel_graph.name("persist-job"):
            held = other.persist(x)  # the other client holds them
            other.gather(futures_of(held))  # wait() would wait on the default client's loop
        with otel_graph.name("persisted-job"):  # the same keys, all in memory already: nothing runs
            mine = client.persist(x)
            wait(mine)
        with otel_graph.name("held-job"):  # and again, with this client holding their results
            wait(client.persist(x))
    with otel_graph.name("cancel-job"):
        stalled = client.submit(nap, 60, key="nap-cancelled")
        wait(client.submit(nap, 0.5, key="nap-short"))  # the long one is running by now
        client.cancel(stalled)
    return "jobs"


def step(x: int, jump_s: float = 0.0) -> int:
    import time

    if jump_s:
        import sitecustomize  # tests/skewed_clock: this worker's wall clock steps

        sitecustomize.jump(jump_s)
    time.sleep(0.05)
    return x + 1


def nested_steps(n: int) -> int:
    from distributed import get_client

    graph = {f"inner-{i}": (step, i) for i in range(n)}
    return sum(get_client().get(graph, list(graph)))


def nested_on_skewed(client: Client) -> int:
    """outer-0, on the worker named skewed, computes inner-0..2 (which run on fast: outer-0
    holds skewed's one thread)."""
    by_name = {info["name"]: address for address, info in client.scheduler_info(n_workers=-1)["workers"].items()}
    return client.submit(nested_steps, 3, key="outer-0", workers=[by_name["skewed"]], allow_other_workers=False,
                         pure=False).result()


def traced_step(x: int) -> int:
    """A task whose code starts a span of its own: a client span linked to a made-up one, with
    an attribute, an event half-way and an error status."""
    import time

    from opentelemetry import trace

    linked = trace.SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=trace.TraceFlags(1))
    with trace.get_tracer("user-code").start_as_current_span(
            "user.step", kind=trace.SpanKind.CLIENT, links=[trace.Link(linked, {"why": "test"})],
            attributes={"user.x": x}, record_exception=False, set_status_on_exception=False) as span:
        time.sleep(0.02)
        span.add_event("halfway", {"step": 1})
        time.sleep(0.02)
        span.set_status(trace.Status(trace.StatusCode.ERROR, "on purpose"))
    return x + 1


def user_spans_on(client: Client) -> int:
    """traced-fast and traced-skewed, on the workers of those names, in one compute."""
    by_name = {info["name"]: address for address, info in client.scheduler_info(n_workers=-1)["workers"].items()}
    tasks = []
    for name in ("fast", "skewed"):
        with dask.annotate(workers=[by_name[name]], allow_other_workers=False):
            tasks.append(dask.delayed(traced_step)(1, dask_key_name=f"traced-{name}"))
    return sum(client.compute(tasks, optimize_graph=False, sync=True))


def chain(client: Client, *, jump_s: float = 0.0) -> int:
    """chain-a -> chain-b -> chain-c run on the workers named fast, skewed, fast, in one compute."""
    by_name = {info["name"]: address for address, info in client.scheduler_info(n_workers=-1)["workers"].items()}
    fast, skewed = by_name["fast"], by_name["skewed"]
    with dask.annotate(workers=[fast], allow_other_workers=False):
        a = dask.delayed(step)(0, dask_key_name="chain-a")
    with dask.annotate(workers=[skewed], allow_other_workers=False):
        b = dask.delayed(step)(a, jump_s, dask_key_name="chain-b")
    with dask.annotate(workers=[fast], allow_other_workers=False):
        c = dask.delayed(step)(b, dask_key_name="chain-c")
    with dask.annotate(workers=[skewed], allow_other_workers=False):
        d = dask.delayed(step)(c, dask_key_name="chain-d")
    return client.compute(d, optimize_graph=False).result()


def workload(client: Client, name: str, workers: list[str]) -> object:
    if name == "chain":
        return chain(client)
    if name == "chain-jump":
        return chain(client, jump_s=1.0)
    if name == "nested-skewed":
        return nested_on_skewed(client)
    if name == "user-spans-skewed":
        return user_spans_on(client)
    if name == "sum":
        graph = {f"inc-{i}": (inc, i) for i in range(20)}
        graph["total"] = (sum, [f"inc-{i}" for i in range(20)])
        return client.get(graph, "total")
    if name == "fail":
        graph = {"inc-0": (inc, 1), "boom-0": (boom, "inc-0")}
        return client.get(graph, "boom-0")
    if name == "transfer":
        # Each input is pinned to a different worker, so the sum must fetch one of them.
        a = client.submit(block, 1, 2_000_000, workers=[workers[0]], key="block-a", pure=False)
        b = client.submit(block, 2, 2_000_000, workers=[workers[1]], key="block-b", pure=False)
        wait([a, b])
        summed = dask.delayed(total)(a, b, dask_key_name="total-ab")
        return client.compute(summed, workers=[workers[1]]).result()
    if name == "spill":
        # 20 blocks of 4 MB with spilling above 5% of a 1 GB limit (see main): most go to disk.
        blocks = [dask.delayed(block)(i, 4_000_000, dask_key_name=f"big-{i}") for i in range(20)]
        return dask.delayed(total)(*blocks, dask_key_name="total-big").compute()
    if name == "kill":
        # The task kills its worker process; with no allowed failures the scheduler gives up.
        graph = {"inc-0": (inc, 1), "die-0": (die, "inc-0")}
        return client.get(graph, "die-0")
    if name == "many":
        graph = {f"inc-{i}": (inc, i) for i in range(200)}
        return sum(client.get(graph, list(graph)))
    if name == "retry":
        # The first run fails, the retry (pinned to the same worker) succeeds.
        import tempfile

        marker = os.path.join(tempfile.mkdtemp(), "failed-once")  # fresh for every run
        graph = {"flaky-0": (flaky, 7, marker)}
        return client.get(graph, "flaky-0", retries=1, workers=[workers[0]])
    if name == "map":
        futures = client.map(inc, range(10), key=[f"inc-{i}" for i in range(10)])
        return sum(client.gather(futures))
    if name == "nested":
        # A task that computes a graph of its own, from inside a worker process.
        return client.get({"outer-0": (nested, 3)}, "outer-0")
    if name == "slow":
        graph = {f"nap-{i}": (nap, 1.2) for i in range(6)}
        return len(client.get(graph, list(graph)))
    if name == "pause":
        return client.get({"inc-0": (inc, 1)}, "inc-0")
    if name == "stall":
        # One task that takes far longer than the test looks: work in progress, nothing completing.
        STALLED.append(client.submit(nap, 120, key="nap-stalled"))  # held, so it keeps running
        return "stalled"
    if name == "jobs":
        return jobs(client)
    if name == "persist":
        x = dask.delayed(operator.add)(1, 2, dask_key_name="add-1")
        (persisted,) = client.persist([x])
        return persisted.compute()
    raise SystemExit(f"unknown workload {name}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--client-first", action="store_true")
    parser.add_argument("--attach", action="store_true")
    parser.add_argument("--scheduler")
    parser.add_argument("--workload", default="sum")
    parser.add_argument("--memory-limit", default="auto")
    parser.add_argument("--parent", action="store_true")
    parser.add_argument("--flush", action="store_true")
    parser.add_argument("--wait-workers", type=int, default=0)
    parser.add_argument("--hold", action="store_true")
    parser.add_argument("--flush-timeout", type=float, default=30.0)
    parser.add_argument("--debug-logs", action="store_true")
    parser.add_argument("--no-memory-guard", action="store_true")
    args = parser.parse_args()
    if args.debug_logs:
        import logging

        logging.basicConfig(level=logging.DEBUG)

    import otel_graph

    if args.workload == "spill":
        # Spill by managed memory only, and never pause or kill: the point is the disk traffic.
        dask.config.set({"distributed.worker.memory.target": 0.05, "distributed.worker.memory.spill": False,
                         "distributed.worker.memory.pause": False, "distributed.worker.memory.terminate": False})
    if args.no_memory_guard:
        # A low memory limit for the memory alert, without the worker being paused or killed.
        dask.config.set({"distributed.worker.memory.pause": False, "distributed.worker.memory.terminate": False,
                         "distributed.worker.memory.spill": False, "distributed.worker.memory.target": False})
    if args.workload == "kill":
        dask.config.set({"distributed.scheduler.allowed-failures": 0})
    cluster = None
    if args.scheduler is None:
        cluster = LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                               memory_limit=args.memory_limit, dashboard_address=":0")
    address = args.scheduler or cluster.scheduler_address
    if args.client_first:
        client = Client(address)
        handle = otel_graph.instrument_scheduler(client=client if args.attach else None)
    else:
        handle = otel_graph.instrument_scheduler()
        client = Client(address)
    # A LocalCluster's workers may not have reached its scheduler yet when it returns (under
    # load, they often have not): workloads pinned to a worker need them all listed.
    wanted = args.wait_workers or (args.workers if cluster is not None else 0)
    if wanted:
        client.wait_for_workers(wanted, timeout=60)
    workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
    print("WORKERS", " ".join(workers), flush=True)
    try:
        if args.parent:
            from opentelemetry import trace

            with trace.get_tracer("app").start_as_current_span("etl") as span:
                context = span.get_span_context()
                print("TRACE_ID", f"{context.trace_id:032x}", flush=True)
                print("PARENT_SPAN_ID", f"{context.span_id:016x}", flush=True)
                result = workload(client, args.workload, workers)
        else:
            result = workload(client, args.workload, workers)
        print("RESULT", result, flush=True)
    except Exception as exc:
        print("FAILED", type(exc).__name__, exc, flush=True)
    if args.workload == "pause":
        # One worker stops answering (SIGSTOP): flush must give up on it within its timeout.
        import os
        import signal
        import time

        import distributed

        # Two more clients of the same cluster: the wait is one timeout in all, not one per client.
        others = [distributed.Client(client.scheduler.address) for _ in range(2)]
        pid = client.run(os.getpid, workers=[workers[0]])[workers[0]]
        os.kill(pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            print("FLUSHED", handle.flush(timeout_s=args.flush_timeout), flush=True)
            print("FLUSH_SECONDS", time.monotonic() - started, flush=True)
            started = time.monotonic()
            handle.stats(workers=True, timeout_s=args.flush_timeout)
            print("STATS_SECONDS", time.monotonic() - started, flush=True)
        finally:
            os.kill(pid, signal.SIGCONT)
        for other in others:
            other.close()
    elif args.flush:
        print("FLUSHED", handle.flush(timeout_s=args.flush_timeout), flush=True)
        print("STATS", json.dumps(handle.stats(workers=True)), flush=True)
    if args.hold:
        print("HOLDING", flush=True)
        sys.stdin.readline()
    client.close()
    if cluster is not None:
        cluster.close()


if __name__ == "__main__":
    main()
