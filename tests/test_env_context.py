"""A script launched by another system joins its trace: ``TRACEPARENT`` and ``TRACESTATE``.

Each app runs in a fresh interpreter, as a CI step, a cron wrapper or a workflow engine's
operator would start it: the launcher's span in its environment, its SDK built by
otel_graph from OTEL_* variables, its spans exported over OTLP to a real receiver. The
parsing itself (:mod:`otel_graph.telemetry.env_context`) is checked in-process below.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from functools import partial

import pytest

import subprocesses
from otel_graph.telemetry.env_context import TRACEPARENT, TRACESTATE, launcher_parent
from otlp_receiver import OtlpReceiver

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN_ID = "00f067aa0ba902b7"
LAUNCHER = f"00-{TRACE_ID}-{SPAN_ID}-01"
STATE = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
RESULT = "12 12"  # two computes of the app's graph

run_app = partial(subprocesses.run_app, "launched.py")


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as running:
        yield running


def launched_env(receiver: OtlpReceiver, traceparent: str | None = LAUNCHER, tracestate: str | None = None,
                 **extra: str) -> dict[str, str]:
    """Exporting to ``receiver``, launched with these values (None: the variable unset)."""
    env = subprocesses.otlp_env(receiver.grpc_endpoint, service="launched-test", OTEL_GRAPH_RESOURCES="false",
                                **extra)
    for name, value in ((TRACEPARENT, traceparent), (TRACESTATE, tracestate)):
        env.pop(name, None)  # the suite's own launcher, if any, is not the app's
        if value is not None:
            env[name] = value
    return env


def computes(receiver: OtlpReceiver, count: int = 2) -> list[dict]:
    """The app's ``count`` compute spans, each with its tasks' spans arrived."""

    def arrived(r: OtlpReceiver) -> bool:
        spans = r.spans()
        roots = [s for s in spans if s["name"] == "dask.compute"]
        return len(roots) >= count and all(
            len([s for s in spans if s["parent_span_id"] == root["span_id"]]) >= 2 for root in roots)

    assert receiver.wait_for(arrived, timeout_s=30), [s["name"] for s in receiver.spans()]
    roots = [s for s in receiver.spans() if s["name"] == "dask.compute"]
    assert len(roots) == count
    return roots


def tasks_of(receiver: OtlpReceiver, root: dict) -> list[dict]:
    return [s for s in receiver.spans() if s["parent_span_id"] == root["span_id"]
            and "dask.task.key" in s["attributes"]]


@pytest.mark.parametrize("scheduler, sdk_spans", [("sync", False), ("threads", False), ("processes", False),
                                                  ("sync", True), ("threads", True)])
def test_the_launchers_span_parents_every_compute(receiver, scheduler, sdk_spans):
    # sdk_spans: an application's span processor on the provider: the compute spans are then
    # the SDK's (Tracker.begin's other path), not otel_graph's light ones.
    args = ["--scheduler", scheduler, *(["--app-processor"] if sdk_spans else [])]
    app = run_app(*args, env=launched_env(receiver, tracestate=STATE))
    assert app.value("RESULT") == RESULT and app.value("FLUSHED") == "True"
    for root in computes(receiver):
        assert (root["trace_id"], root["parent_span_id"]) == (TRACE_ID, SPAN_ID)
        assert root["trace_state"] == STATE
        assert root["attributes"]["dask.scheduler"] == scheduler
        tasks = tasks_of(receiver, root)
        assert sorted(s["attributes"]["dask.task.key"] for s in tasks) == ["y", "z"]
        assert {s["trace_id"] for s in tasks} == {TRACE_ID}
    assert TRACEPARENT not in app.stderr


@pytest.mark.parametrize("sdk_spans", [False, True])
def test_a_compute_under_a_span_of_the_apps_own_stays_its_child(receiver, sdk_spans):
    args = ["--parent", *(["--app-processor"] if sdk_spans else [])]
    app = run_app(*args, env=launched_env(receiver, tracestate=STATE))
    assert app.value("RESULT") == RESULT
    trace_id, span_id = app.value("TRACE_ID"), app.value("SPAN_ID")
    for root in computes(receiver):
        assert (root["trace_id"], root["parent_span_id"]) == (trace_id, span_id)


def test_without_the_variables_each_compute_is_a_trace_of_its_own(receiver):
    app = run_app(env=launched_env(receiver, traceparent=None))
    assert app.value("RESULT") == RESULT
    roots = computes(receiver)
    assert [root["parent_span_id"] for root in roots] == ["", ""]
    assert len({root["trace_id"] for root in roots}) == 2


def test_a_launcher_that_did_not_sample_leaves_the_computes_unsampled(receiver):
    app = run_app(env=launched_env(receiver, traceparent=f"00-{TRACE_ID}-{SPAN_ID}-00"))
    assert app.value("RESULT") == RESULT and app.value("FLUSHED") == "True"
    # Flushed and exited: what the app was going to deliver has arrived.
    assert [s["name"] for s in receiver.spans()] == []


LONG = f"00-{TRACE_ID}-{SPAN_ID}-01-" + "x" * 600


@pytest.mark.parametrize("traceparent, reason", [
    (f"00-{TRACE_ID.upper()}-{SPAN_ID}-01", "its trace id"),
    (f"00-{'0' * 32}-{SPAN_ID}-01", "all zeros"),
    (LONG, "characters long"),
], ids=["upper-case", "zero-trace-id", "too-long"])
def test_a_malformed_traceparent_is_ignored_with_one_warning(receiver, traceparent, reason):
    app = run_app(env=launched_env(receiver, traceparent=traceparent, tracestate=STATE))
    assert app.value("RESULT") == RESULT
    roots = computes(receiver)
    assert [root["parent_span_id"] for root in roots] == ["", ""]
    assert TRACE_ID not in {root["trace_id"] for root in roots}
    warnings = [line for line in app.stderr.splitlines() if TRACEPARENT in line or "traceparent" in line]
    assert len(warnings) == 1, app.stderr
    assert reason in warnings[0] and "Traceback" not in app.stderr
    assert LONG not in app.stderr  # a long value quoted cut short


@pytest.mark.slow  # a LocalCluster
def test_on_a_local_cluster_the_clients_compute_and_its_workers_tasks_join_the_launchers_trace(receiver):
    pytest.importorskip("distributed")
    from test_distributed import APP, task_spans, trace_of

    app = subprocesses.run_app(APP, "--flush", env=launched_env(receiver, tracestate=STATE))
    assert app.value("RESULT") == str(sum(range(1, 21))) and app.value("FLUSHED") == "True"
    root, spans = trace_of(receiver, expect_tasks=21)
    assert (root["trace_id"], root["parent_span_id"], root["trace_state"]) == (TRACE_ID, SPAN_ID, STATE)
    assert root["attributes"]["dask.scheduler"] == "distributed"
    tasks = task_spans(spans, root)
    assert len(tasks) == 21 and {s["trace_id"] for s in tasks} == {TRACE_ID}
    # Made in the workers' processes, not the client's.
    assert {s["attributes"]["dask.worker.id"] for s in tasks} == set(app.value("WORKERS").split())
    assert root["resource"]["service.instance.id"] not in {s["resource"]["service.instance.id"] for s in tasks}


# -- the parsing, in-process -------------------------------------------------------------

def test_the_variables_become_a_remote_parent_with_its_trace_state():
    parent = launcher_parent(environ={TRACEPARENT: f" {LAUNCHER}\t", TRACESTATE: STATE})
    assert parent is not None and not parent.is_recording()
    context = parent.get_span_context()
    assert (f"{context.trace_id:032x}", f"{context.span_id:016x}") == (TRACE_ID, SPAN_ID)
    assert context.is_remote and context.trace_flags.sampled and context.trace_state.to_header() == STATE


def test_no_traceparent_is_no_parent_and_no_warning(caplog):
    for environ in ({}, {TRACEPARENT: ""}, {TRACEPARENT: "  "}, {TRACESTATE: STATE}):
        assert launcher_parent(environ=environ) is None
    assert caplog.records == []


@pytest.mark.parametrize("traceparent, reason", [
    ("nonsense", "it is not four fields joined by '-'"),
    (f"00-{TRACE_ID}-{SPAN_ID}", "it is not four fields joined by '-'"),
    (f"0-{TRACE_ID}-{SPAN_ID}-01", "its version '0' is not 2 lowercase hex digits"),
    (f"00-{TRACE_ID[:-1]}g-{SPAN_ID}-01", f"its trace id '{TRACE_ID[:-1]}g' is not 32 lowercase hex digits"),
    (f"00-{TRACE_ID}-{SPAN_ID}0-01", f"its parent span id '{SPAN_ID}0' is not 16 lowercase hex digits"),
    (f"00-{TRACE_ID}-{SPAN_ID}-1", "its flags '1' is not 2 lowercase hex digits"),
    (f"00-{TRACE_ID}-{'0' * 16}-01", "its trace id or parent span id is all zeros"),
    (f"ff-{TRACE_ID}-{SPAN_ID}-01", "version ff is forbidden"),
    (f"00-{TRACE_ID}-{SPAN_ID}-01-more", "version 00 has nothing after the flags"),
    (LONG, f"it is {len(LONG)} characters long, over the 512"),
])
def test_a_refused_traceparent_is_one_warning_saying_what_is_wrong(caplog, traceparent, reason):
    with caplog.at_level(logging.WARNING):
        assert launcher_parent(environ={TRACEPARENT: traceparent, TRACESTATE: STATE}) is None
    (record,) = caplog.records  # the propagator's own, for a long value, never comes
    assert record.name == "otel_graph" and record.levelno == logging.WARNING
    message = record.getMessage()
    assert message.startswith(f"otel_graph: ignoring {TRACEPARENT}=") and reason in message
    if len(traceparent) > 64:  # quoted cut short, and said so
        assert traceparent not in message and f"... ({len(traceparent)} characters)" in message
    else:
        assert repr(traceparent) in message


def test_a_refused_tracestate_is_dropped_and_the_trace_kept():
    parent = launcher_parent(environ={TRACEPARENT: LAUNCHER, TRACESTATE: "x" * 600})
    assert parent is not None
    assert parent.get_span_context().trace_id == int(TRACE_ID, 16)
    assert not parent.get_span_context().trace_state
