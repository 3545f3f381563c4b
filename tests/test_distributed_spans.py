"""distributed's spans (``with distributed.span(...)``) as OTel spans, and what Dask itself
shows staying as it is: no annotation of ours, the user's code in ``Computation.code``,
and the user's tracebacks."""

from __future__ import annotations

import sys
import time
import traceback

import pytest

distributed = pytest.importorskip("distributed")
# The in-process cluster and its client, shared with those tests.
from test_distributed_inprocess import client, cluster, wait_until  # noqa: E402,F401


def inc(x: int) -> int:
    return x + 1


def named(telemetry, name: str) -> list:
    return [s for s in telemetry.spans() if s.name == name]


def test_a_distributed_span_is_a_span_with_its_computes_and_tasks_under_it(telemetry, client):
    with distributed.span("etl") as etl_id:
        with distributed.span("load") as load_id:
            assert client.submit(inc, 1).result() == 2
            futures = client.map(inc, range(5))
            assert client.gather(futures) == [1, 2, 3, 4, 5]
        assert client.get({"x": (inc, 10)}, "x") == 11
    computes = telemetry.roots()
    assert wait_until(lambda: sum(len(telemetry.children(c)) for c in telemetry.roots()) == 7)
    (etl,), (load,) = named(telemetry, "etl"), named(telemetry, "load")
    assert etl.parent is None and load.parent.span_id == etl.context.span_id
    assert dict(etl.attributes) == {"dask.span.name": "etl", "dask.span.id": etl_id}
    assert dict(load.attributes) == {"dask.span.name": "etl/load", "dask.span.id": load_id}
    computes = telemetry.roots()
    assert len(computes) == 3
    under = {c.parent.span_id for c in computes}
    assert under == {load.context.span_id, etl.context.span_id}
    assert {c.attributes["dask.span.name"] for c in computes} == {"etl/load", "etl"}
    assert all(c.context.trace_id == etl.context.trace_id for c in computes)
    for compute in computes:
        assert compute.start_time >= etl.start_time and compute.end_time <= etl.end_time
        tasks = telemetry.children(compute)
        assert tasks and all(t.context.trace_id == etl.context.trace_id for t in tasks)
    # The ids are distributed's own: the scheduler's spans extension knows them by these.
    spans = client.cluster.scheduler.extensions["spans"].spans
    assert spans[load_id].name == ("etl", "load") and spans[etl_id].name == ("etl",)


def test_a_span_of_several_tags_is_one_span_per_tag(telemetry, client):
    with distributed.span("a", "b"):
        assert client.submit(inc, 2).result() == 3
    (a,), (b,) = named(telemetry, "a"), named(telemetry, "b")
    assert b.parent.span_id == a.context.span_id
    assert b.attributes["dask.span.name"] == "a/b"
    (compute,) = telemetry.roots()
    assert compute.parent.span_id == b.context.span_id


def raise_inside_span() -> None:
    with distributed.span("failing"):
        raise KeyError("mine")


def frames_of(error: BaseException) -> list[tuple[str, str]]:
    return [(frame.filename, frame.name) for frame in traceback.extract_tb(error.__traceback__)]


def test_an_error_in_the_block_is_the_users_own_and_fails_the_span(telemetry):
    with pytest.raises(KeyError) as instrumented:
        raise_inside_span()
    (failing,) = named(telemetry, "failing")
    assert failing.status.status_code.name == "ERROR"
    assert failing.attributes["error.type"] == "KeyError"
    telemetry.handle.uninstrument()
    with pytest.raises(KeyError) as plain:
        raise_inside_span()
    assert frames_of(instrumented.value) == frames_of(plain.value)


@pytest.mark.skipif(sys.version_info < (3, 11), reason="a bare raise adds the frame back before 3.11")
def test_distributeds_own_error_is_raised_with_its_own_traceback(telemetry):
    def no_tags() -> None:
        with distributed.span():
            pass

    with pytest.raises(ValueError, match="Must specify at least one span tag") as instrumented:
        no_tags()
    telemetry.handle.uninstrument()
    with pytest.raises(ValueError) as plain:
        no_tags()
    assert frames_of(instrumented.value) == frames_of(plain.value)


def test_a_block_inside_a_span_entered_otherwise_gets_that_span_around_it(client, telemetry):
    from distributed.spans import span as taken_early

    with taken_early.__wrapped__("etl") as etl_id:
        with distributed.span("load"):
            assert client.submit(inc, 1).result() == 2
    (etl,), (load,) = named(telemetry, "etl"), named(telemetry, "load")
    assert dict(etl.attributes) == {"dask.span.name": "etl", "dask.span.id": etl_id}
    assert load.parent.span_id == etl.context.span_id
    (compute,) = telemetry.roots()
    assert compute.parent.span_id == load.context.span_id


def test_a_span_function_taken_before_instrumenting_still_names_the_computes_span(client, telemetry):
    from distributed.spans import span as taken_early

    original = taken_early.__wrapped__  # what `from distributed import span` got before otel_graph
    with original("early") as early_id:
        assert client.submit(inc, 3).result() == 4
    (early,) = named(telemetry, "early")
    (compute,) = telemetry.children(early)
    assert compute.attributes["dask.span.name"] == "early"
    assert dict(early.attributes) == {"dask.span.name": "early", "dask.span.id": early_id}
    assert early.start_time <= compute.start_time and early.end_time >= compute.end_time


def test_each_compute_under_dask_annotate_span_gets_that_span_around_it(client, telemetry):
    import dask

    with distributed.span("outer") as outer_id:
        annotation = dask.get_annotations()["span"]
    inner = {"name": (*annotation["name"], "inner"), "ids": (*annotation["ids"], "inner-id")}
    with distributed.span("user"):  # an OTel span open around it, of another distributed span
        with dask.annotate(span=inner):
            assert client.submit(inc, 1).result() == 2
            assert client.gather(client.map(inc, range(3))) == [1, 2, 3]
    (user,) = named(telemetry, "user")
    outers, inners = named(telemetry, "outer"), named(telemetry, "inner")
    (block,) = [o for o in outers if o.parent is None]  # the block's own; then one a compute
    outers.remove(block)
    assert len(outers) == 2 and len(inners) == 2
    assert all(o.parent.span_id == user.context.span_id for o in outers)
    assert all(dict(o.attributes) == {"dask.span.name": "outer", "dask.span.id": outer_id} for o in outers)
    assert all(dict(i.attributes) == {"dask.span.name": "outer/inner", "dask.span.id": "inner-id"} for i in inners)
    assert {i.parent.span_id for i in inners} == {o.context.span_id for o in outers}
    computes = telemetry.roots()
    assert {c.parent.span_id for c in computes} == {i.context.span_id for i in inners}
    assert wait_until(lambda: sum(len(telemetry.children(c)) for c in telemetry.roots()) == 4)
    # Under the block's own span, nothing more is opened.
    with distributed.span("plain"):
        assert client.submit(inc, 5).result() == 6
    assert len(named(telemetry, "plain")) == 1 and len(named(telemetry, "outer")) == 3


def test_uninstrumenting_puts_distributeds_span_back(telemetry):
    import distributed.spans

    assert distributed.span.__wrapped__ is distributed.spans.span.__wrapped__
    original = distributed.span.__wrapped__
    telemetry.handle.uninstrument()
    assert distributed.span is original and distributed.spans.span is original


def user_code_submits(client) -> int:
    return client.submit(inc, 41).result()


def test_dask_sees_no_annotation_and_records_the_users_code(telemetry, client):
    import dask

    scheduler = client.cluster.scheduler
    with distributed.span("visible"), dask.config.set({"distributed.diagnostics.computations.nframes": 1}):
        assert user_code_submits(client) == 42
    computation = scheduler.computations[-1]
    assert set(computation.annotations) == {"span"}  # distributed's own, nothing of ours
    assert all("otel" not in str(ts.annotations) for ts in scheduler.tasks.values())
    (code,) = computation.code
    assert "user_code_submits" in code[-1].code and code[-1].filename == __file__


def nap(x: int) -> int:
    time.sleep(0.1)
    return x


def test_fine_performance_metrics_are_counters_by_span_prefix_and_activity(telemetry, client):
    scheduler = client.cluster.scheduler
    with distributed.span("naps") as span_id:
        assert client.gather(client.map(nap, range(4))) == [0, 1, 2, 3]
    span = scheduler.extensions["spans"].spans[span_id]
    key = ("execute", "nap", "thread-noncpu", "seconds")

    def exported() -> float:
        return sum(p.value for p in telemetry.points("dask.activity.time")
                   if p.attributes.get("dask.span.name") == "naps" and p.attributes.get("dask.task.prefix") == "nap"
                   and p.attributes["dask.activity"] == "thread-noncpu"
                   and p.attributes["dask.activity.context"] == "execute")

    # What the dashboard shows for the span, once the workers' heartbeats have brought it all.
    assert wait_until(lambda: span.cumulative_worker_metrics.get(key, 0) >= 0.35 and exported() > 0)
    assert wait_until(lambda: exported() == span.cumulative_worker_metrics[key])
    assert 0.35 <= exported() < 5
    transfers = [p for p in telemetry.points("dask.activity.time")
                 if p.attributes["dask.activity.context"] != "execute"]
    assert all("dask.task.prefix" not in p.attributes for p in transfers)


def test_a_graph_sent_where_its_context_cannot_follow_is_counted(telemetry, client):
    # As for a scheduler that said it does not read contexts (our plugin could not be put there).
    capture = telemetry.handle._cluster
    stream = capture._streams.pop(client)
    worker = sorted(client.scheduler_info()["workers"])[0]
    assert client.submit(inc, 5, workers=[worker]).result() == 6
    assert telemetry.handle.stats()["computes_without_task_context"] == 1
    capture._streams[client] = stream
    assert client.submit(inc, 6, workers=[worker]).result() == 7
    # A later run on the same worker has its span: the first one's would have come by now.
    def in_order() -> list:
        return sorted(telemetry.roots(), key=lambda root: root.start_time)

    assert wait_until(lambda: len(in_order()) == 2 and telemetry.children(in_order()[1]))
    without, traced = in_order()
    assert telemetry.children(without) == [] and len(telemetry.children(traced)) == 1
    assert telemetry.handle.stats()["computes_without_task_context"] == 1


def test_after_a_reconnect_to_the_same_scheduler_tasks_get_their_context_again(telemetry, client):
    assert client.submit(inc, 1).result() == 2
    before = client.scheduler_comm
    client.sync(before.comm.close)  # the connection drops; distributed reconnects the client
    assert wait_until(lambda: client.scheduler_comm is not before and client.status == "running")
    # The first call on the new connection goes before the scheduler said it reads contexts there.
    assert client.submit(inc, 2).result() == 3
    assert telemetry.handle.stats()["computes_without_task_context"] == 1
    assert wait_until(lambda: telemetry.handle._cluster._streams.get(client) is client.scheduler_comm)
    # The scheduler let the client go with its connection; it counts it as instrumented again.
    plugin = client.cluster.scheduler.plugins["otel-graph"]
    assert wait_until(lambda: client.id in plugin.clients)
    assert client.submit(inc, 3).result() == 4
    assert wait_until(lambda: len(telemetry.children(telemetry.roots()[-1])) == 1)
    assert telemetry.handle.stats()["computes_without_task_context"] == 1


def drop_our_scheduler_plugin(dask_scheduler) -> None:
    dask_scheduler.remove_plugin(name="otel-graph")


def test_a_scheduler_plugin_put_there_anew_knows_which_workers_read_contexts(telemetry, client, cluster):
    assert client.submit(inc, 1).result() == 2
    client.run_on_scheduler(drop_our_scheduler_plugin)
    # The workers keep their plugin, so they say nothing again; the new scheduler plugin
    # must still hand them their tasks' contexts.
    with distributed.Client(cluster) as other:
        assert "otel-graph" in cluster.scheduler.plugins
        assert other.gather(other.map(inc, range(8))) == list(range(1, 9))
        assert wait_until(lambda: len(telemetry.roots()) == 2)  # a map's span ends once its futures are in
        compute = max(telemetry.roots(), key=lambda root: root.start_time)
        assert wait_until(lambda: len(telemetry.children(compute)) == 8)


def test_the_schedulers_event_log_holds_nothing_of_ours(telemetry, client):
    assert client.gather(client.map(inc, range(4))) == [1, 2, 3, 4]
    (compute,) = telemetry.roots()
    assert wait_until(lambda: len(telemetry.children(compute)) == 4)
    assert compute.attributes["dask.graph.tasks"] == 4  # the graph event did come
    topics = set(client.get_events())
    assert not {t for t in topics if "otel" in str(t)}, topics


def test_a_distributed_span_still_decorates(telemetry, client):
    @distributed.span("decorated")
    def job(x: int) -> int:
        return client.submit(inc, x).result()

    assert job(1) == 2 and job(2) == 3
    decorated = named(telemetry, "decorated")
    assert len(decorated) == 2 and decorated[0].attributes["dask.span.id"] != decorated[1].attributes["dask.span.id"]
    assert {c.parent.span_id for c in telemetry.roots()} == {s.context.span_id for s in decorated}


@pytest.fixture
def launched(monkeypatch):
    """A launcher's span in the environment, read when the ``telemetry`` fixture instruments."""
    trace_id, span_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    monkeypatch.setenv("TRACEPARENT", f"00-{trace_id}-{span_id}-01")
    return int(trace_id, 16), int(span_id, 16)


def test_with_no_span_current_the_blocks_and_stand_ins_join_a_launchers_trace(launched, telemetry, client):
    from distributed.spans import span as taken_early

    trace_id, span_id = launched
    with distributed.span("etl"):
        assert client.submit(inc, 1).result() == 2
    with taken_early.__wrapped__("early"):  # entered without a block of ours: a stand-in
        assert client.submit(inc, 2).result() == 3
    (etl,), (early,) = named(telemetry, "etl"), named(telemetry, "early")
    for span in (etl, early):
        assert (span.context.trace_id, span.parent.span_id) == (trace_id, span_id)
    computes = named(telemetry, "dask.compute")
    assert sorted(c.parent.span_id for c in computes) == sorted([etl.context.span_id, early.context.span_id])
    assert {c.context.trace_id for c in computes} == {trace_id}
