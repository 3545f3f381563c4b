"""dask.distributed with the cluster in the test's process (LocalCluster(processes=False)).

Workers here share the test's providers (the in-memory SDK of the ``telemetry``
fixture), so these tests see every span and point directly: client wrappers,
uninstrumenting, concurrency, cancellation and nested computes.
"""

from __future__ import annotations

import gc
import threading
import time
import weakref

import dask
import pytest

distributed = pytest.importorskip("distributed")
from distributed import Client, LocalCluster  # noqa: E402


def inc(x: int) -> int:
    return x + 1


def slow(x: int) -> int:
    time.sleep(1)  # cancelled or dropped long before it ends
    return x


GATE = threading.Event()


def wait_for_gate(parts: list) -> int:
    return sum(parts) if GATE.wait(30) else -1


def nested(n: int) -> int:
    from distributed import get_client

    client = get_client()
    graph = {f"inner-{i}": (inc, i) for i in range(n)}
    return sum(client.get(graph, list(graph)))


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(n_workers=2, threads_per_worker=2, processes=False, dashboard_address=":0") as running:
        yield running


@pytest.fixture
def client(cluster, telemetry):
    with Client(cluster) as connected:
        yield connected


def wait_until(predicate, timeout_s: float = 20) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)  # spans come from worker threads; no event to wait on from here
    return False


def test_in_process_workers_emit_through_the_applications_providers(telemetry, client):
    graph = {f"inc-{i}": (inc, i) for i in range(10)}
    assert client.get(graph, list(graph)) == list(range(1, 11))
    (root,) = telemetry.roots()
    assert root.attributes["dask.scheduler"] == "distributed"
    assert wait_until(lambda: len(telemetry.children(root)) == 10)
    tasks = telemetry.children(root)
    addresses = {s.attributes["dask.worker.id"] for s in tasks}
    assert addresses <= set(client.scheduler_info()["workers"])
    assert all(s.context.trace_id == root.context.trace_id for s in tasks)
    durations = [p for p in telemetry.points("dask.task.duration") if p.attributes["dask.scheduler"] == "distributed"]
    assert sum(p.count for p in durations) == 10


def test_each_worker_in_the_process_reports_its_own_address(telemetry, client):
    futures = client.compute([dask.delayed(inc)(i, dask_key_name=f"inc-{i}") for i in range(40)])
    client.gather(futures)
    (root,) = telemetry.roots()
    assert wait_until(lambda: len(telemetry.children(root)) == 40)
    by_worker = {}
    for span in telemetry.children(root):
        by_worker.setdefault(span.attributes["dask.worker.id"], set()).add(span.attributes["thread.id"])
    assert len(by_worker) == 2, "both in-process workers ran tasks and named themselves"


def test_a_second_client_keeps_the_plugins_in_place_and_counts_once(telemetry, client, cluster):
    def plugins() -> dict:
        return client.run(lambda dask_worker: id(dask_worker.plugins["otel-graph"]))

    before = plugins()
    with Client(cluster) as second:
        assert plugins() == before, "no teardown and setup on every worker for each new client"
        graph = {f"inc-{i}": (inc, i) for i in range(5)}
        assert second.get(graph, list(graph)) == list(range(1, 6))
    (root,) = telemetry.roots()
    assert root.attributes["dask.graph.tasks"] == 5


def test_dropped_futures_still_release_their_work(telemetry, client, cluster):
    futures = client.compute([dask.delayed(slow)(i, dask_key_name=f"slow-{i}") for i in range(4)])
    assert wait_until(lambda: len(cluster.scheduler.tasks) == 4)
    del futures
    assert wait_until(lambda: len(cluster.scheduler.tasks) == 0), "otel_graph kept dropped futures alive"
    (root,) = telemetry.roots()
    assert len([e for e in root.events if e.name == "dask.future.released"]) == 4
    assert root.status.status_code.name != "ERROR"


def test_concurrent_computes_from_threads_get_separate_traces(telemetry, client):
    results: dict[int, int] = {}

    def run(n: int) -> None:
        graph = {f"t{n}-{i}": (inc, i) for i in range(5)}
        results[n] = sum(client.get(graph, list(graph)))

    threads = [threading.Thread(target=run, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert results == dict.fromkeys(range(4), 15)
    roots = telemetry.roots()
    assert len(roots) == 4 and len({r.context.trace_id for r in roots}) == 4
    assert wait_until(lambda: all(len(telemetry.children(r)) == 5 for r in telemetry.roots()))
    for root in telemetry.roots():
        prefixes = {s.attributes["dask.task.key"].split("-")[0] for s in telemetry.children(root)}
        assert len(prefixes) == 1, "a trace holds one thread's tasks only"
        assert root.attributes["dask.graph.tasks"] == 5


def test_cancelled_future_ends_its_compute_with_an_error(telemetry, client):
    future = client.compute(dask.delayed(slow)(1, dask_key_name="slow-1"))
    future.cancel()
    assert wait_until(lambda: bool(telemetry.exporter.get_finished_spans()))
    (root,) = telemetry.roots()
    assert root.status.status_code.name == "ERROR"
    assert [e.name for e in root.events if e.name == "dask.future.cancelled"]


def test_nested_compute_inside_a_task_joins_the_outer_trace(telemetry, client):
    assert client.get({"nested-0": (nested, 3)}, "nested-0") == 6
    assert wait_until(lambda: len(telemetry.roots()) == 2)
    outer, inner = sorted(telemetry.roots(), key=lambda s: s.start_time)
    assert inner.context.trace_id == outer.context.trace_id
    assert inner.parent.span_id == outer.context.span_id
    assert wait_until(lambda: len(telemetry.children(inner)) == 3)


def tasks_left_by_uninstrument_right_after_a_compute(telemetry, client) -> int:
    """Ten tasks, then uninstrument() (no flush: it must deliver them itself); the task spans there."""
    graph = {f"inc-{i}": (inc, i) for i in range(10)}
    client.get(graph, list(graph))
    telemetry.handle.uninstrument()
    (root,) = [s for s in telemetry.exporter.get_finished_spans() if s.name == "dask.compute"]
    return len([s for s in telemetry.exporter.get_finished_spans() if s.parent is not None
                and s.parent.span_id == root.context.span_id and "dask.task.prefix" in s.attributes])


def test_uninstrument_right_after_a_compute_keeps_its_task_spans(telemetry, client):
    assert tasks_left_by_uninstrument_right_after_a_compute(telemetry, client) == 10


def test_uninstrument_waits_for_workers_whose_removed_plugin_is_closing_them(telemetry, client, monkeypatch):
    """The last client's leaving takes the plugins off; each worker's telemetry is then
    closed on an executor. uninstrument() returned without waiting for those (under load,
    6 of 10 task spans were there when it returned): a slow close shows it every time."""
    from otel_graph.cluster.task_spans import WorkerTelemetry

    close = WorkerTelemetry.close

    def slow_close(self, *args, **kwargs):
        time.sleep(0.5)  # a loaded machine
        return close(self, *args, **kwargs)

    monkeypatch.setattr(WorkerTelemetry, "close", slow_close)
    assert tasks_left_by_uninstrument_right_after_a_compute(telemetry, client) == 10


def test_a_drain_while_uninstrumenting_keeps_what_the_workers_recorded(telemetry, client, monkeypatch):
    """A worker's periodic drain can fall after uninstrument() ended the process's
    instrumentation and before it closed the workers' telemetry (it once dropped the
    compute's task spans there, a rare failure of the test above). Forced here."""
    from otel_graph.cluster.client import ClusterCapture
    from otel_graph.cluster.process import _ProcessTelemetry

    uninstall = ClusterCapture.uninstall

    def drain_then_uninstall(self: ClusterCapture, *args: object, **kwargs: object) -> None:
        for recorded in list(_ProcessTelemetry.by_worker.values()):
            assert recorded.flush(10, export=False)  # the drain: nothing live, not closing yet
        uninstall(self, *args, **kwargs)

    monkeypatch.setattr(ClusterCapture, "uninstall", drain_then_uninstall)
    assert tasks_left_by_uninstrument_right_after_a_compute(telemetry, client) == 10


def test_uninstrument_restores_the_client_class_and_the_cluster_exactly(telemetry, client, cluster):
    def plugged() -> dict:
        return client.run(lambda dask_worker: "otel-graph" in dask_worker.plugins)

    assert set(plugged().values()) == {True} and "otel-graph" in cluster.scheduler.plugins
    wrapped = {name: Client.__dict__[name] for name in ("get", "compute", "persist", "submit", "map", "start")}
    assert all(hasattr(function, "__wrapped__") for function in wrapped.values())
    telemetry.handle.uninstrument()
    for name, function in wrapped.items():
        restored = Client.__dict__[name]
        assert restored is function.__wrapped__ and not hasattr(restored, "__wrapped__")
    assert set(plugged().values()) == {False} and "otel-graph" not in cluster.scheduler.plugins
    assert client.get({"inc-0": (inc, 1)}, "inc-0") == 2
    assert telemetry.exporter.get_finished_spans() == ()


def slow_inc(x: int) -> int:
    time.sleep(0.3)
    return x + 1


def test_asynchronous_clients_are_traced(telemetry):
    import asyncio

    async def main() -> tuple[int, int]:
        async with LocalCluster(n_workers=2, processes=False, asynchronous=True, dashboard_address=":0") as cluster:
            async with Client(cluster, asynchronous=True) as client:
                plugged = await client.run(lambda dask_worker: "otel-graph" in dask_worker.plugins)
                assert set(plugged.values()) == {True}, "plugins are on before the client is returned"
                # (Client.get itself cancels its futures on asynchronous clients in distributed 2026.8.)
                submitted = client.submit(inc, 3, key="inc-3")
                future = client.compute(dask.delayed(inc)(41, dask_key_name="inc-41"))
                # sync=True: an awaitable of the results, ended when they are in (it ended at once).
                # (A list: distributed 2026.8 itself fails a single collection here.)
                results = client.compute([dask.delayed(slow_inc)(9, dask_key_name="slow-9")], sync=True)
                return await submitted, await future, await results

    assert asyncio.run(main()) == (4, 42, [10])
    roots = telemetry.roots()
    assert len(roots) == 3 and all(r.attributes["dask.scheduler"] == "distributed" for r in roots)
    assert wait_until(lambda: sum(len(telemetry.children(r)) for r in telemetry.roots()) == 3)
    (slow_root,) = [r for r in roots if any(c.attributes.get("dask.task.key") == "slow-9"
                                            for c in telemetry.children(r))]
    (slow_task,) = telemetry.children(slow_root)
    assert slow_root.end_time >= slow_task.end_time


@pytest.mark.parametrize("telemetry", [{"drain_interval_s": 0.1, "progress_interval_s": 0.2}], indirect=True)
def test_a_running_distributed_compute_has_progress_spans_before_its_root(client, telemetry):
    def progressed() -> bool:
        return sum(1 for s in telemetry.spans() if s.name == "dask.compute.progress") >= 2

    graph = {f"inc-{i}": (inc, i) for i in range(4)}
    graph["wait"] = (wait_for_gate, list(graph))
    GATE.clear()
    future = client.get(graph, "wait", sync=False)
    try:
        assert wait_until(progressed)
        assert not [s for s in telemetry.spans() if s.name == "dask.compute"]
    finally:
        GATE.set()
    assert future.result() == 10
    assert telemetry.handle.flush(timeout_s=20)
    (root,) = telemetry.roots()
    progress = [s for s in telemetry.spans() if s.name == "dask.compute.progress"]
    assert {s.parent.span_id for s in progress} == {root.context.span_id}
    assert progress[0].attributes["dask.graph.tasks"] == 5
    assert progress[0].start_time == root.start_time


class Payload:
    """Graph data embedded in a task; every copy (pickled or not) is tracked while alive."""

    alive: weakref.WeakSet = weakref.WeakSet()

    def __init__(self) -> None:
        self.data = bytes(1 << 20)  # state, so that unpickling calls __setstate__
        Payload.alive.add(self)

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        Payload.alive.add(self)


def touch(payload: Payload, delay_s: float) -> int:
    time.sleep(delay_s)
    return 1


@pytest.mark.parametrize("telemetry", [{"max_task_spans": 8}], indirect=True)
def test_a_slow_task_kept_for_its_span_lets_go_of_its_graph_data(telemetry):
    # The worker streams the first 4 tasks to end there and keeps its 4 slowest for when
    # the compute settles there (30 s after its last task, or a flush). The slow task is
    # kept; what its graph node embedded must be freed with the result, not held until
    # then. (distributed's own log of recent messages would hold it too: turned off.)
    with dask.config.set({"distributed.admin.low-level-log-length": 0}), \
            LocalCluster(n_workers=1, processes=False, dashboard_address=":0") as cluster, Client(cluster) as client:
        graph = {f"inc-{i}": (inc, i) for i in range(12)}
        graph["held"] = (touch, Payload(), 0.3)
        keys = list(graph)
        assert client.get(graph, keys)[-1] == 1
        del graph  # the test's own reference
        assert wait_until(lambda: gc.collect() >= 0 and not Payload.alive, timeout_s=10), \
            f"{len(Payload.alive)} payloads alive while their task waits to be emitted"
        (root,) = telemetry.roots()  # flushes: the kept task is emitted now
        (held,) = [s for s in telemetry.children(root) if s.attributes.get("dask.task.key") == "held"]
        assert held.attributes["code.function.name"] == "touch"


def test_a_busy_worker_drains_before_its_interval_without_losing_a_task(telemetry, client, monkeypatch):
    from otel_graph.cluster import task_spans

    monkeypatch.setattr(task_spans, "_DRAIN_AT", 16)  # woken early many times in one compute
    graph = {f"inc-{i}": (inc, i) for i in range(600)}
    assert client.get(graph, list(graph)) == list(range(1, 601))
    (root,) = telemetry.roots()
    tasks = telemetry.children(root)
    assert sum(s.attributes.get("dask.task.count", 1) for s in tasks) == root.attributes["dask.graph.tasks"] == 600
    (duration,) = telemetry.points("dask.task.duration")
    assert duration.count == 600


@pytest.mark.parametrize("telemetry", [{"max_task_spans": 8}], indirect=True)
def test_keys_that_are_each_their_own_prefix_stay_bounded_on_the_workers(telemetry, client, monkeypatch):
    from otel_graph import naming
    from otel_graph.telemetry import metrics, policy
    monkeypatch.setattr(policy, "MAX_AGGREGATES", 5)
    monkeypatch.setattr(metrics, "MAX_METRIC_PREFIXES", 20)
    graph = {f"t{i}": (inc, i) for i in range(300)}  # no '-': 300 prefixes
    assert client.get(graph, list(graph)) == list(range(1, 301))
    (root,) = telemetry.roots()
    tasks = telemetry.children(root)
    assert sum(s.attributes.get("dask.task.count", 1) for s in tasks) == root.attributes["dask.graph.tasks"] == 300
    aggregates: dict[str, list[str]] = {}
    for span in tasks:
        if span.attributes.get("dask.task.aggregate"):
            aggregates.setdefault(span.attributes["dask.worker.id"], []).append(span.attributes["dask.task.prefix"])
    assert aggregates, "the budget of 8 folded most tasks"
    for names in aggregates.values():  # each worker folds its share: 5 prefixes, then one for the rest
        assert len(names) == 6 and names.count(naming.OTHER_PREFIXES) == 1, names
    durations = telemetry.points("dask.task.duration")
    labelled = {p.attributes["dask.task.prefix"] for p in durations if "dask.task.prefix" in p.attributes}
    (overflow,) = [p for p in durations if "dask.task.prefix" not in p.attributes]
    assert len(labelled) == 20 and overflow.attributes["otel.metric.overflow"] is True
    assert sum(p.count for p in durations) == 300


def test_a_persisted_collection_is_traced_and_keeps_no_trace_annotation(telemetry, client):
    """The trace annotation goes on the graph sent, not on the collections ``persist``
    builds: annotating the whole call left it in the persisted graph's layers (sent again
    with every graph built on them), and made dask.dataframe warn of it, an error under
    ``-W error``."""
    import dask.array as da
    from distributed import wait

    persisted = client.persist(da.ones(20, chunks=5) + 1)
    wait(persisted)
    assert int(persisted.sum().compute()) == 40
    layers = persisted.__dask_graph__().layers.values()
    assert all("otel_graph" not in (layer.annotations or {}) for layer in layers)
    roots = telemetry.roots()
    assert len(roots) == 2  # the persist, and the compute of what it holds
    # The graph it sent still carried the annotation: its tasks are traced, under the persist.
    assert wait_until(lambda: sum(s.parent.span_id == roots[0].context.span_id and "dask.task.key" in s.attributes
                                  for s in telemetry.spans() if s.parent is not None) >= 4)


def fails(x: int) -> int:
    raise ValueError(f"no {x}")


def test_the_failed_keys_a_worker_remembers_for_retries_stay_bounded(telemetry, client, monkeypatch):
    """Each compute's failed keys are kept (to number a retry's attempt), at most 10,000 a
    compute, for up to 4,096 computes: bounded in theory only. Past a total, the oldest
    computes' are let go."""
    from distributed import wait

    from otel_graph.cluster import task_spans
    from otel_graph.cluster.process import _ProcessTelemetry

    monkeypatch.setattr(task_spans, "_MAX_FAILED_HELD", 6)
    for round_ in range(4):
        futures = client.map(fails, range(5), key=[f"fails-{round_}-{i}" for i in range(5)])
        wait(futures)
    telemetry.handle.flush(timeout_s=30)
    held = [sum(len(state.failed) for state in telemetry_of._traces.values())
            for telemetry_of in _ProcessTelemetry.by_worker.values()]
    assert held and all(0 < n <= 6 for n in held), held
    # Every failed run still has its span, with its error.
    errors = [s for s in telemetry.spans() if s.attributes.get("dask.task.prefix") == "fails"]
    assert len(errors) == 20 and all(s.status.status_code.name == "ERROR" for s in errors)


def shift_clock_estimate(shift_s: float) -> tuple[int, int]:
    # A heartbeat while the task runs: the worker's estimate of the scheduler's clock moves.
    from distributed import get_worker

    started = time.time_ns()
    get_worker().scheduler_delay += shift_s
    return started, time.time_ns()


@pytest.mark.parametrize("shift_s", [-5.0, 5.0])
def test_a_task_span_keeps_its_times_when_the_clock_estimate_moves_while_it_runs(telemetry, client, shift_s):
    # The worker stamps a task with the delay of when it began: undone with the moved one,
    # the span would be 5 s off (after the compute that waited for it, or before the task ran).
    worker = next(iter(client.cluster.workers.values()))
    before = worker.scheduler_delay
    try:
        started, ended = client.submit(shift_clock_estimate, shift_s, workers=[worker.address], pure=False).result()
    finally:
        worker.scheduler_delay = before
    (root,) = telemetry.roots()
    assert wait_until(lambda: len(telemetry.children(root)) == 1)
    (task,) = telemetry.children(root)
    assert task.name == "shift_clock_estimate"
    assert root.start_time <= task.start_time <= started < ended <= task.end_time <= root.end_time


def test_a_worker_instrumented_again_stamps_its_next_task_as_any(cluster):
    # Its telemetry ended with the last uninstrument(); the plugin stays on the worker. The
    # next task must run in the wrapped runner (its stamp, its NVTX range), not only be read.
    from conftest import instrumented

    worker = next(iter(cluster.workers.values()))
    with instrumented(), Client(cluster) as client:
        assert client.submit(inc, 1, workers=[worker.address], pure=False).result() == 2
    before = worker.scheduler_delay
    with instrumented() as again, Client(cluster) as client:
        try:
            started, ended = client.submit(shift_clock_estimate, 5.0, workers=[worker.address], pure=False).result()
        finally:
            worker.scheduler_delay = before
        (root,) = again.roots()
        assert wait_until(lambda: len(again.children(root)) == 1)
        (task,) = again.children(root)
    assert root.start_time <= task.start_time <= started < ended <= task.end_time <= root.end_time


def clock_readings(x: int) -> tuple[int, int]:
    started = time.time_ns()
    time.sleep(0.005)
    return started, time.time_ns()


def test_in_process_workers_keep_the_callers_own_clock_exactly(telemetry, client):
    # The same clock as the caller's: no estimate, whose error (a millisecond or so) would
    # move the span off the times the task itself read.
    started, ended = client.submit(clock_readings, 1, pure=False).result()
    (root,) = telemetry.roots()
    assert wait_until(lambda: len(telemetry.children(root)) == 1)
    (task,) = telemetry.children(root)
    assert task.attributes["dask.clock.correction"] == 0.0
    assert task.attributes["dask.clock.uncertainty"] == 0.0
    assert task.start_time <= started < ended <= task.end_time
