"""Spans from Dask's local schedulers, read back from a real SDK's in-memory exporter."""

from __future__ import annotations

import sys
import threading

import dask
import pytest
from opentelemetry import trace
from opentelemetry.trace import StatusCode

from conftest import needs_distributed
from graphs import DSK, add, boom, inc, timed_sleep
from test_exporters_env import receiver  # noqa: F401

SCHEDULERS = ["sync", "threads", "processes"]


def compute(graph: dict, keys: object, scheduler: str, **kwargs: object) -> object:
    if scheduler == "processes":
        # The processes scheduler fuses linear chains by default; keep task names stable.
        kwargs.setdefault("optimize_graph", False)
        return dask.multiprocessing.get(graph, keys, **kwargs)
    getters = {"sync": dask.get, "threads": dask.threaded.get}
    return getters[scheduler](graph, keys, **kwargs)


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_one_trace_per_compute_with_a_span_per_task(telemetry, scheduler):
    assert compute(DSK, "z", scheduler) == 12
    (root,) = telemetry.roots()
    assert root.attributes["dask.scheduler"] == scheduler
    assert root.attributes["dask.graph.tasks"] == 2
    tasks = {s.attributes["dask.task.key"]: s for s in telemetry.children(root)}
    assert set(tasks) == {"y", "z"}
    assert {s.context.trace_id for s in tasks.values()} == {root.context.trace_id}
    y, z = tasks["y"], tasks["z"]
    assert y.name == "y" and y.attributes["code.function.name"] == "inc"
    assert z.attributes["dask.task.dependencies"] == ("y",)
    assert z.attributes["dask.task.dependency_count"] == 1
    assert y.attributes["dask.task.dependent_count"] == 1
    assert z.attributes["dask.task.type"] == "int"
    assert z.attributes["dask.task.nbytes"] == 28
    assert int(z.attributes["dask.worker.id"]) > 0 and isinstance(z.attributes["thread.id"], int)
    for span in tasks.values():
        assert root.start_time <= span.start_time <= span.end_time <= root.end_time
        assert span.status.status_code == StatusCode.UNSET


def test_a_graph_node_that_cannot_be_walked_keeps_its_span_without_its_function(telemetry, monkeypatch):
    # Naming a node's functions walks user data (nested tasks, containers); a walk that raises
    # costs that span its code.function.name, not the span, nor the compute's other spans.
    from otel_graph.telemetry import function_names
    walk = function_names._FunctionNames._visit

    def visit(self, value, names, depth, *, known):
        if getattr(value, "key", None) == "y":
            raise RuntimeError("a node that cannot be walked")
        return walk(self, value, names, depth, known=known)

    monkeypatch.setattr(function_names._FunctionNames, "_visit", visit)
    assert compute(DSK, "z", "sync") == 12
    (root,) = telemetry.roots()
    tasks = {s.attributes["dask.task.key"]: s for s in telemetry.children(root)}
    assert set(tasks) == {"y", "z"}
    assert "code.function.name" not in tasks["y"].attributes
    assert tasks["y"].attributes["dask.task.dependent_count"] == 1
    assert tasks["z"].attributes["code.function.name"] == "add"


def test_span_name_is_the_prefix_never_the_key(telemetry):
    graph = {("load-abc123", i): (inc, i) for i in range(3)}
    dask.get(graph, list(graph))
    names = {s.name for s in telemetry.spans() if s.name != "dask.compute"}
    assert names == {"load"}
    keys = sorted(s.attributes["dask.task.key"] for s in telemetry.spans() if s.name == "load")
    assert keys == ["('load-abc123', 0)", "('load-abc123', 1)", "('load-abc123', 2)"]


@pytest.mark.parametrize("scheduler", ["threads", "processes"])
def test_task_spans_are_timed_where_the_task_ran(telemetry, scheduler):
    # The processes scheduler reports batches late; spans must still match the real run.
    graph = {f"nap-{i}": (timed_sleep, 0.05 + 0.01 * i) for i in range(8)}
    results = dict(zip(graph, compute(graph, list(graph), scheduler), strict=True))
    spans = {s.attributes["dask.task.key"]: s for s in telemetry.spans() if s.name == "nap"}
    assert set(spans) == set(graph)
    for key, (start, end) in results.items():
        assert abs(spans[key].start_time - start) < 50_000_000
        assert abs(spans[key].end_time - end) < 50_000_000


def test_fused_tasks_name_their_inner_functions(telemetry):
    graph = {"a": 1, "b": (inc, "a"), "c": (add, "b", 2)}
    assert dask.multiprocessing.get(graph, "c") == 4  # fuses b and c
    fused = [s for s in telemetry.spans() if s.name != "dask.compute" and "," in
             s.attributes.get("code.function.name", "")]
    assert fused and fused[0].attributes["code.function.name"] == "inc, add"


def test_composed_and_partial_functions_are_named_by_what_they_call(telemetry):
    """Dask's reductions run toolz.compose of partials: the span names the functions, innermost first."""
    from functools import partial

    from toolz import compose

    graph = {"a": 1, "b": (compose(partial(add, 10), inc), "a")}
    assert dask.get(graph, "b") == 12
    named = {s.attributes["dask.task.key"]: s.attributes.get("code.function.name") for s in telemetry.spans()
             if s.name != "dask.compute"}
    assert named == {"b": "inc, add"}


def test_a_callable_is_named_by_itself_not_by_one_that_had_its_id(telemetry):
    """Names are remembered by callable identity, weakly: a key reused for another function
    (custom graphs do) and a new function at a freed one's address are each named rightly."""
    import gc

    def first(x):
        return x

    assert dask.get({"k": (first, 1)}, "k") == 1
    assert telemetry.handle.flush(timeout_s=10)
    addresses = {id(first)}
    del first
    gc.collect()
    for step in range(50):  # new functions, each at a freed one's address as a rule
        def later(x, step=step):
            return x + step

        later.__name__ = later.__qualname__ = f"later_{step}"
        assert dask.get({"k": (later, 1)}, "k") == 1 + step
        assert telemetry.handle.flush(timeout_s=10)  # its record, holding it, let go
        addresses.add(id(later))
    assert len(addresses) < 51  # addresses were reused: the case is exercised
    names = [s.attributes["code.function.name"] for s in telemetry.spans() if s.name == "k"]
    assert names == ["first"] + [f"later_{step}" for step in range(50)]


def test_processes_report_the_worker_pid(telemetry):
    import os

    graph = {f"pid-{i}": (os.getpid,) for i in range(4)}
    pids = compute(graph, list(graph), "processes")
    spans = [s for s in telemetry.spans() if s.name == "pid"]
    assert sorted(s.attributes["dask.worker.id"] for s in spans) == sorted(str(p) for p in pids)
    assert str(os.getpid()) not in {s.attributes["dask.worker.id"] for s in spans}


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_failed_task_carries_the_real_exception(telemetry, scheduler):
    graph = {"x": 1, "bad": (boom, "x"), "out": (inc, "bad")}
    with pytest.raises(ValueError, match="boom on 1"):
        compute(graph, "out", scheduler)
    (root,) = telemetry.roots()
    assert root.status.status_code == StatusCode.ERROR
    (bad,) = [s for s in telemetry.spans() if s.name == "bad"]
    assert bad.status.status_code == StatusCode.ERROR
    assert bad.attributes["error.type"] == "ValueError"
    (event,) = [e for e in bad.events if e.name == "exception"]
    assert event.attributes["exception.type"] == "ValueError"
    assert event.attributes["exception.message"] == "boom on 1"
    assert "in boom" in event.attributes["exception.stacktrace"]
    assert "dask.task.nbytes" not in bad.attributes


@pytest.mark.parametrize("key", [
    "plain", b"bytes-key", ("tuple-key", 1, 2), ("nest", ("deep", (1, 2))), "ünïcødé-ключ", b"\xff\xfe-raw",
])
def test_keys_of_every_shape_become_readable_strings(telemetry, key):
    dask.get({key: (inc, 1)}, key)
    (span,) = [s for s in telemetry.spans() if s.name != "dask.compute"]
    text = span.attributes["dask.task.key"]
    assert isinstance(text, str) and text
    text.encode("utf-8")  # valid unicode, whatever the key held


def test_compute_is_a_child_of_the_callers_span(telemetry):
    tracer = telemetry.tracer_provider.get_tracer("user")
    with tracer.start_as_current_span("pipeline") as outer:
        dask.get(DSK, "z")
    (root,) = telemetry.roots()
    assert root.parent is not None and root.parent.span_id == outer.get_span_context().span_id
    assert root.context.trace_id == outer.get_span_context().trace_id


def test_each_compute_is_its_own_trace(telemetry):
    dask.get(DSK, "z")
    dask.get(DSK, "z")
    roots = telemetry.roots()
    assert len(roots) == 2 and roots[0].context.trace_id != roots[1].context.trace_id


@pytest.mark.parametrize("telemetry", [{"max_task_spans": 10}], indirect=True)
def test_span_budget_folds_the_rest_and_accounts_for_every_task(telemetry):
    graph = {("many", i): (inc, i) for i in range(100)}
    graph.update({("other", i): (add, ("many", i), 1) for i in range(50)})
    dask.get(graph, list(graph))
    (root,) = telemetry.roots()
    children = telemetry.children(root)
    singles = [s for s in children if "dask.task.count" not in s.attributes]
    aggregates = [s for s in children if "dask.task.count" in s.attributes]
    assert len(singles) == 10
    assert {a.name for a in aggregates} == {"many", "other"}
    assert len(singles) + sum(a.attributes["dask.task.count"] for a in aggregates) == 150
    assert root.attributes["dask.graph.tasks"] == 150
    for agg in aggregates:
        attrs = agg.attributes
        assert attrs["dask.task.duration.min"] <= attrs["dask.task.duration.mean"] <= attrs["dask.task.duration.max"]
        assert agg.start_time <= agg.end_time
    assert telemetry.handle.stats()["tasks_aggregated"] == 140


@pytest.mark.parametrize("telemetry", [{"max_task_spans": 0}], indirect=True)
def test_failed_tasks_always_get_spans(telemetry):
    graph = {"ok-1": (inc, 1), "bad": (boom, "ok-1")}
    with pytest.raises(ValueError):
        dask.get(graph, "bad")
    (bad,) = [s for s in telemetry.spans() if s.name == "bad"]
    assert bad.status.status_code == StatusCode.ERROR
    (agg,) = [s for s in telemetry.spans() if s.name == "ok"]
    assert agg.attributes["dask.task.count"] == 1


def test_concurrent_computes_from_threads_are_all_traced(telemetry):
    # dask's global Callback.active loses callbacks here; per-call wrapping must not.
    barrier = threading.Barrier(4)
    graph = {f"t-{i}": (timed_sleep, 0.02) for i in range(6)}

    def run() -> None:
        barrier.wait()
        dask.threaded.get(graph, list(graph), num_workers=2)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    roots = telemetry.roots()
    assert len(roots) == 4
    for root in roots:
        assert len(telemetry.children(root)) == 6


def test_nested_compute_inside_a_task_keeps_the_outer_trace_whole(telemetry):
    def inner(x: int) -> int:
        return dask.get({"a": x, "b": (inc, "a")}, "b")

    graph = {"x": 1, "outer": (inner, "x"), "final": (inc, "outer")}
    assert dask.get(graph, "final") == 3
    roots = telemetry.roots()
    assert len(roots) == 2
    outer = next(r for r in roots if r.attributes["dask.graph.tasks"] == 2)
    nested = next(r for r in roots if r is not outer)
    assert {s.name for s in telemetry.children(outer)} == {"outer", "final", "dask.compute"}
    assert [s.name for s in telemetry.children(nested)] == ["b"]
    # The nested compute is part of the outer trace, under the outer compute, not a stray one.
    assert nested.context.trace_id == outer.context.trace_id
    assert nested.parent.span_id == outer.context.span_id


def test_dask_callbacks_still_work_alongside(telemetry):
    from dask.diagnostics import Profiler

    with Profiler() as prof:
        dask.threaded.get(DSK, "z")
    assert {r.key for r in prof.results} == {"y", "z"}
    assert len(telemetry.roots()) == 1


def test_metrics_count_every_task(telemetry):
    graph = {("m", i): (inc, i) for i in range(20)}
    dask.get(graph, list(graph))
    (point,) = [p for p in telemetry.points("dask.task.duration")
                if p.attributes["dask.task.prefix"] == "m"]
    assert point.count == 20
    assert point.attributes == {"dask.task.prefix": "m", "dask.scheduler": "sync",
                                "dask.task.outcome": "success"}
    (size,) = [p for p in telemetry.points("dask.task.output.size") if p.attributes["dask.task.prefix"] == "m"]
    assert size.count == 20 and size.sum == 20 * 28
    (computes,) = telemetry.points("dask.compute.duration")
    assert computes.count == 1


def test_instrument_is_idempotent_and_uninstrument_restores_dask():
    import dask.local
    import dask.multiprocessing
    import dask.threaded
    from dask.callbacks import Callback
    from opentelemetry.sdk.trace import TracerProvider

    import otel_graph

    before = (dask.local.get_async, dask.threaded.get_async, dask.multiprocessing.get_async,
              dask.local.start_state_from_dask, set(Callback.active))
    provider = TracerProvider()
    handle = otel_graph.instrument_scheduler(tracer_provider=provider, meter_provider=_noop_meter(),
                                             resources=False)
    assert otel_graph.instrument_scheduler() is handle
    assert dask.local.get_async is not before[0]
    handle.uninstrument()
    after = (dask.local.get_async, dask.threaded.get_async, dask.multiprocessing.get_async,
             dask.local.start_state_from_dask, set(Callback.active))
    assert after == before
    handle.uninstrument()  # twice is harmless
    with otel_graph.instrument_scheduler(tracer_provider=provider, meter_provider=_noop_meter(),
                                         resources=False) as again:
        assert again is not handle
    assert dask.local.get_async is before[0]


def test_a_second_call_says_which_of_its_choices_the_live_handle_ignores(telemetry, caplog):
    import dask
    from opentelemetry.sdk.trace import TracerProvider

    import otel_graph
    from otel_graph.config import ConfigurationError

    with caplog.at_level("WARNING", logger="otel_graph"):
        assert otel_graph.instrument_scheduler() is telemetry.handle  # nothing asked: nothing said
        assert otel_graph.instrument_scheduler(resources=False) is telemetry.handle  # what it has
        assert not caplog.records
        assert otel_graph.instrument_scheduler(max_task_spans=2, tracer_provider=TracerProvider()) is \
            telemetry.handle
    (record,) = caplog.records
    assert "the tracer_provider and its options are ignored" in record.getMessage()
    with pytest.raises(ConfigurationError, match="OTEL_GRAPH_DRAIN_INTERVAL|drain_interval"):
        otel_graph.instrument_scheduler(drain_interval_s="oops")
    # The live handle kept its budget and its provider.
    dask.get({("t", i): (abs, i) for i in range(5)}, [("t", i) for i in range(5)])
    (root,) = telemetry.roots()
    assert len(telemetry.children(root)) == 5


def test_a_span_processor_that_raises_on_one_span_costs_that_span_only(caplog):
    import dask
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import otel_graph

    class Picky(SpanProcessor):  # an application's processor with a bug for one value
        def on_end(self, span):
            if span.attributes.get("dask.task.key") == "('t', 3)":
                raise ValueError("bug in the app's processor")

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(Picky())  # first: the span it raises on reaches no later one
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    graph = {("t", i): (abs, i) for i in range(10)}
    with caplog.at_level("WARNING", logger="otel_graph"), otel_graph.instrument_scheduler(
            tracer_provider=provider, meter_provider=_noop_meter(), resources=False) as handle:
        assert dask.get(graph, list(graph)) == tuple(range(10))
        assert handle.flush(timeout_s=30)
        assert handle.stats()["span_errors"] == 1
    # The drain used to give up the rest of the compute at the first raise: 3 of 10 arrived.
    keys = sorted(s.attributes["dask.task.key"] for s in exporter.get_finished_spans() if s.name == "t")
    assert keys == sorted(str(("t", i)) for i in range(10) if i != 3)
    assert [r.getMessage() for r in caplog.records if "making a span raised" in r.getMessage()] != []
    assert len(caplog.records) == 1


@pytest.mark.parametrize("budget", [None, 100])
def test_what_exit_counts_unbuilt_is_never_also_built(budget):
    """Exit gives up on the drain while a span is being made (here, an application's processor
    holds the 50th): the count it warns with is what will not be made, exactly. Counting while
    the thread was inside a slice of 2,048 records counted that slice twice, unbuilt and then
    made (seen under load); and tasks folded into an aggregate not yet made went uncounted."""
    import dask
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import otel_graph

    holding, release = threading.Event(), threading.Event()

    class Slow(SpanProcessor):
        ended = 0

        def on_end(self, span):
            Slow.ended += 1
            if Slow.ended == 50:
                holding.set()
                release.wait(30)

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    provider.add_span_processor(Slow())
    tasks = 5000
    graph = {("t", i): (abs, i) for i in range(tasks)}
    handle = otel_graph.instrument_scheduler(tracer_provider=provider, meter_provider=_noop_meter(),
                                             resources=False, max_task_spans=budget, drain_interval_s=600)
    try:
        dask.get(graph, list(graph))
        tracker = handle._tracker
        threading.Thread(target=tracker.flush, args=(None,), daemon=True).start()  # the drain starts
        assert holding.wait(30)
        unbuilt = tracker.stop(0.0, drain=False)  # as at exit with the collector down
        release.set()
        tracker._thread.join(30)
        assert not tracker._thread.is_alive()
    finally:
        release.set()
        handle.uninstrument()  # which builds nothing that stop() counted
    made = sum(s.attributes.get("dask.task.count", 1) for s in exporter.get_finished_spans() if s.name == "t")
    assert 0 < made < tasks
    assert made + unbuilt == tasks + 1, (made, unbuilt)  # and the compute's own span, never ended


def _noop_meter():
    from opentelemetry.sdk.metrics import MeterProvider

    return MeterProvider()


def test_results_and_arguments_are_never_recorded(telemetry):
    secret = "hunter2-secret-token"
    dask.get({"s": secret, "t": (str.upper, "s")}, "t")
    for span in telemetry.spans():
        for value in span.attributes.values():
            assert secret.upper() not in str(value) and secret not in str(value)


def test_untraced_when_no_span_is_sampled():
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    import otel_graph

    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ALWAYS_OFF)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with otel_graph.instrument_scheduler(tracer_provider=provider, meter_provider=_noop_meter(),
                                         resources=False) as handle:
        assert dask.get(DSK, "z") == 12
        assert handle.flush(timeout_s=10)
    assert exporter.get_finished_spans() == ()
    assert trace.get_current_span() is trace.INVALID_SPAN


def test_sync_batches_with_a_failure_still_close_the_trace(telemetry):
    # With chunksize > 1 the sync scheduler abandons the rest of a batch when a task raises.
    graph = {f"ok-{i}": (inc, i) for i in range(4)}
    graph.update({"bad": (boom, 1), "after": (inc, "bad")})
    with dask.config.set(chunksize=3), pytest.raises(ValueError):
        dask.get(graph, list(graph))
    assert telemetry.handle.flush(timeout_s=10)
    (root,) = telemetry.roots()
    assert root.status.status_code == StatusCode.ERROR
    counted = sum(s.attributes.get("dask.task.count", 1) for s in telemetry.children(root))
    assert counted == root.attributes["dask.graph.tasks"]


def test_uninstrument_while_another_thread_computes_closes_that_compute(telemetry):
    started, release = threading.Event(), threading.Event()

    def hold(x: int) -> int:
        started.set()
        release.wait(timeout=10)
        return x

    results = []
    worker = threading.Thread(target=lambda: results.append(dask.get({"a": 1, "h": (hold, "a")}, "h")))
    worker.start()
    assert started.wait(timeout=10)
    telemetry.handle.uninstrument()
    release.set()
    worker.join(timeout=10)
    assert results == [1]
    (root,) = [s for s in telemetry.exporter.get_finished_spans() if s.name == "dask.compute"]
    assert root.attributes["otel_graph.incomplete"] is True


def test_a_broken_span_processor_never_fails_the_users_compute():
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

    import otel_graph

    class Broken(SpanProcessor):
        def on_start(self, span, parent_context=None):
            raise RuntimeError("broken processor")

    provider = TracerProvider()
    provider.add_span_processor(Broken())
    with otel_graph.instrument_scheduler(tracer_provider=provider, meter_provider=_noop_meter(),
                                         resources=False) as handle:
        assert dask.get(DSK, "z") == 12
        assert handle._tracker.begin_errors == 1


def test_a_thread_pool_passed_as_pool_is_labelled_threads(telemetry):
    from multiprocessing.pool import ThreadPool

    with ThreadPool(2) as pool:
        assert dask.threaded.get(DSK, "z", pool=pool) == 12
    (root,) = telemetry.roots()
    assert root.attributes["dask.scheduler"] == "threads"
    assert len(telemetry.children(root)) == 2


@needs_distributed
def test_a_handle_made_while_another_uninstruments_keeps_its_readings(monkeypatch):
    """uninstrument() silenced the process readings after its cluster teardown, outside its
    lock: a handle made on the same meter provider meanwhile lost its CPU and memory readings."""
    import threading

    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider

    import otel_graph
    from otel_graph.cluster import worker

    reader = InMemoryMetricReader()
    providers = {"tracer_provider": TracerProvider(), "meter_provider": MeterProvider(metric_readers=[reader])}
    first = otel_graph.instrument_scheduler(resources=True, gpu=False, **providers)
    tearing_down, go_on = threading.Event(), threading.Event()

    def slow_teardown() -> None:  # the cluster teardown of the first handle, still under way
        tearing_down.set()
        go_on.wait(30)

    monkeypatch.setattr(worker, "close_in_process", slow_teardown)
    leaving = threading.Thread(target=first.uninstrument)
    leaving.start()
    assert tearing_down.wait(30)
    second = otel_graph.instrument_scheduler(resources=True, gpu=False, **providers)
    go_on.set()
    leaving.join(30)
    try:
        data = reader.get_metrics_data()
        names = {m.name for r in data.resource_metrics for s in r.scope_metrics for m in s.metrics
                 if any(True for _ in m.data.data_points)}
        assert "process.cpu.utilization" in names, sorted(names)
    finally:
        second.uninstrument()


@pytest.mark.skipif(sys.version_info < (3, 11), reason="Python 3.10 adds the frame of a bare raise back")
@pytest.mark.parametrize("scheduler", SCHEDULERS)
@pytest.mark.parametrize("shorten", [True, False])
def test_a_failed_computes_traceback_shows_no_frame_of_otel_graph(scheduler, shorten):
    """What the user reads when a task fails: with Dask's traceback shortening (its default),
    the very frames Dask shows without otel_graph; without it, still none of ours."""
    import traceback
    from pathlib import Path

    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider

    import otel_graph

    def frames() -> list[tuple[str, str]]:
        paths = dask.config.get("admin.traceback.shorten") if shorten else []
        with dask.config.set({"admin.traceback.shorten": paths}), pytest.raises(ValueError) as raised:
            dask.compute(dask.delayed(boom)(1), scheduler=scheduler)
        return [(f.filename, f.name) for f in traceback.extract_tb(raised.value.__traceback__)]

    plain = frames()
    with otel_graph.instrument_scheduler(tracer_provider=TracerProvider(), meter_provider=MeterProvider(),
                                         resources=False):
        traced = frames()
    own = str(Path(otel_graph.__file__).parent)
    assert not [frame for frame in traced if frame[0].startswith(own)], traced
    assert traced[-1][1] == "boom"
    if shorten:
        assert traced == plain


SMALL_COMPUTES = r"""
import dask, otel_graph
from otel_graph.telemetry.aside import ASIDE_COMPUTES
handle = otel_graph.instrument_scheduler(resources=False, drain_interval_s=3600)  # the tracker's thread stays out
def inc(x): return x + 1
def made():
    stats = handle.stats()
    return stats["spans_queued"] + stats["spans_exported"]
for scheduler in ("sync", "threads"):
    before = made()
    for _ in range(ASIDE_COMPUTES - 1):
        dask.compute(*[dask.delayed(inc)(i) for i in range(3)], scheduler=scheduler)
    print("ASIDE", scheduler, made() - before, flush=True)
    dask.compute(*[dask.delayed(inc)(i) for i in range(3)], scheduler=scheduler)
    print("BUILT", scheduler, made() - before, flush=True)  # at once: by the thread that computed
big = {("inc", i): (inc, i) for i in range(1000)}
dask.get(big, list(big), scheduler="sync")
print("FLUSHED", handle.flush(timeout_s=30), handle.stats()["spans_exported"], flush=True)
"""


def test_small_computes_spans_are_made_together_by_the_thread_that_computed(receiver):  # noqa: F811
    """Where otel_graph built the SDK (its processors only queue), computes of a few tasks are
    set aside, and their spans made together by the thread that computed the last of
    ASIDE_COMPUTES, before that compute() returns: no hand over to the tracker's thread,
    whose wake-up and GIL hand-offs cost more than the work. A large compute is still the
    tracker thread's (and flush() still waits for it)."""
    import subprocess

    from subprocesses import otlp_env

    env = otlp_env(receiver.grpc_endpoint, "grpc", OTEL_METRICS_EXPORTER="none")  # spans encoded as they end
    run = subprocess.run([sys.executable, "-c", SMALL_COMPUTES], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    from otel_graph.telemetry.aside import ASIDE_COMPUTES

    counts = {(line.split()[0], line.split()[1]): int(line.split()[2]) for line in run.stdout.splitlines()
              if line.startswith(("ASIDE", "BUILT"))}
    every = 4 * ASIDE_COMPUTES  # three task spans and the root a compute
    assert counts == {("ASIDE", "sync"): 0, ("BUILT", "sync"): every,
                      ("ASIDE", "threads"): 0, ("BUILT", "threads"): every}, run.stdout
    (flushed,) = [line.split()[1:] for line in run.stdout.splitlines() if line.startswith("FLUSHED")]
    assert flushed[0] == "True" and int(flushed[1]) > 2 * every + 1, flushed  # and the big one's, by the tracker
    assert len(receiver.spans()) == int(flushed[1])


FORCE_FLUSHED = r"""
import dask, otel_graph
from opentelemetry import trace
handle = otel_graph.instrument_scheduler(resources=False, drain_interval_s=3600)
def inc(x): return x + 1
for _ in range(3):
    dask.compute(*[dask.delayed(inc)(i) for i in range(3)], scheduler="sync")
print("ASIDE", handle.stats()["spans_queued"] + handle.stats()["spans_exported"], flush=True)
print("FORCED", trace.get_tracer_provider().force_flush(), handle.stats()["spans_exported"], flush=True)
"""


def test_the_providers_force_flush_makes_and_exports_small_computes_set_aside(receiver):  # noqa: F811
    """OpenTelemetry's own way to flush, the tracer provider's force_flush(), makes the spans of
    computes set aside too, and returns once they are exported."""
    import subprocess

    from subprocesses import otlp_env

    env = otlp_env(receiver.grpc_endpoint, "grpc", OTEL_METRICS_EXPORTER="none")
    run = subprocess.run([sys.executable, "-c", FORCE_FLUSHED], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in run.stdout.splitlines())
    assert lines["ASIDE"] == "0"
    assert lines["FORCED"] == "True 12"  # three computes, three task spans and a root each


def test_a_process_pool_worker_imports_no_opentelemetry(telemetry):
    """Dask's processes scheduler starts a pool per compute; what otel_graph sends its workers
    (otel_graph.capture.task_runner) must not make each of them import OpenTelemetry (10-25 ms)."""
    from graphs import loaded_modules

    (loaded,) = dask.compute(dask.delayed(loaded_modules)("opentelemetry"), scheduler="processes")
    assert loaded == [], loaded
    (root,) = telemetry.roots()
    assert [s.name for s in telemetry.children(root)] == ["loaded_modules"]  # traced all the same
