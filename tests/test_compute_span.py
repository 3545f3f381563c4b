"""The ``dask.compute`` span where otel_graph built the SDK (``otel_graph.telemetry.compute_span``):
made as ``tracer.start_span`` would make it, read back from a real OTLP receiver."""

from __future__ import annotations

import subprocess
import sys

import pytest
from opentelemetry import context, trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

from subprocesses import otlp_env
from test_exporters_env import receiver  # noqa: F401

APP = r"""
import dask, otel_graph
from opentelemetry import trace
handle = otel_graph.instrument_scheduler(resources=False)
tracer = trace.get_tracer("app")
def inc(x): return x + 1
def boom(x): raise ValueError("no " + "x" * 500)
with tracer.start_as_current_span("request") as request:
    print("RESULT", dask.compute(*[dask.delayed(inc)(i) for i in range(3)], scheduler="sync"))
    print("REQUEST", format(request.get_span_context().span_id, "016x"), flush=True)
try:
    dask.delayed(boom)(1).compute(scheduler="threads")
except ValueError:
    print("FAILED", flush=True)
for i in range(COMPUTES):
    dask.delayed(inc)(i).compute(scheduler="sync")
print("FLUSHED", handle.flush(timeout_s=30), flush=True)
"""


def run(receiver, computes: int = 0, **env: str) -> str:  # noqa: F811
    proc = subprocess.run([sys.executable, "-c", APP.replace("COMPUTES", str(computes))],
                          env=otlp_env(receiver.grpc_endpoint, "grpc", OTEL_METRICS_EXPORTER="none", **env),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "FLUSHED True" in proc.stdout, proc.stderr[-3000:]
    return proc.stdout


def test_the_compute_span_nests_under_the_callers_span_and_carries_its_failure(receiver):  # noqa: F811
    out = run(receiver, OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT="100")
    (request_id,) = [line.split()[1] for line in out.splitlines() if line.startswith("REQUEST")]
    spans = receiver.spans()
    (request,) = [s for s in spans if s["name"] == "request"]
    ok, failed = sorted((s for s in spans if s["name"] == "dask.compute"), key=lambda s: s["start_ns"])
    assert request["span_id"] == request_id
    assert ok["parent_span_id"] == request_id and ok["trace_id"] == request["trace_id"]
    fingerprint = ok["attributes"].pop("dask.graph.fingerprint")
    assert len(fingerprint) == 16 and int(fingerprint, 16) >= 0
    assert ok["attributes"] == {"dask.scheduler": "sync", "dask.compute.name": "request", "dask.graph.tasks": 3}
    assert ok["status_code"] == 0
    assert sorted(s["name"] for s in spans if s["parent_span_id"] == ok["span_id"]) == ["inc"] * 3
    assert not failed["parent_span_id"] and failed["trace_id"] != ok["trace_id"]  # no span around it: a new trace
    assert failed["status_code"] == 2 and failed["attributes"]["error.type"] == "ValueError"
    (event,) = failed["events"]
    assert event["name"] == "exception" and event["attributes"]["exception.type"] == "ValueError"
    assert len(event["attributes"]["exception.message"]) == 100  # the span limits hold for it too
    assert failed["end_ns"] > failed["start_ns"]


def test_the_provider_sampler_decides_for_each_compute_and_its_tasks_follow(receiver):  # noqa: F811
    run(receiver, computes=200, OTEL_TRACES_SAMPLER="traceidratio", OTEL_TRACES_SAMPLER_ARG="0.5")
    spans = receiver.spans()
    roots = {s["span_id"]: s for s in spans if s["name"] == "dask.compute"}
    tasks = [s for s in spans if s["name"] == "inc"]
    assert 40 < len(roots) < 170, len(roots)  # of 202 computes, about half
    assert all(t["parent_span_id"] in roots for t in tasks)  # no task span without its compute
    per_root: dict[str, int] = {}
    for task in tasks:
        per_root[task["parent_span_id"]] = per_root.get(task["parent_span_id"], 0) + 1
    assert all(per_root.get(span_id, 0) >= 1 for span_id, root in roots.items()
               if root["attributes"].get("dask.scheduler") == "sync")


FLAGS = r"""
import dask, otel_graph
from opentelemetry import propagate, trace
handle = otel_graph.instrument_scheduler(resources=False)
def carrier(x):
    headers = {}
    propagate.inject(headers)  # in the task: its parent, whose flags are the compute's
    return headers["traceparent"]
print("TASK", dask.delayed(carrier)(1).compute(scheduler="sync"))
with trace.get_tracer("app").start_as_current_span("request"):
    headers = {}
    propagate.inject(headers)
    print("SDK", headers["traceparent"])
    print("NESTED", dask.delayed(carrier)(1).compute(scheduler="sync"))
"""


def file_env(directory) -> dict[str, str]:
    """otel_graph's own SDK with a span exporter (its light root spans need one)."""
    from conftest import subprocess_env

    return subprocess_env(OTEL_TRACES_EXPORTER="otlp_file", OTEL_METRICS_EXPORTER="none",
                          OTEL_GRAPH_FILE_DIR=str(directory))


def test_the_compute_span_carries_the_trace_flags_the_sdk_would(tmp_path):
    proc = subprocess.run([sys.executable, "-c", FLAGS], capture_output=True, text=True, timeout=60,
                          env=file_env(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = dict(line.split() for line in proc.stdout.splitlines())
    flags = {name: value.rsplit("-", 1)[1] for name, value in seen.items()}
    # A compute of its own (a new trace) and one under the SDK's span: flags as the SDK's own
    # root span has them (sampled, and random trace id where the SDK sets that flag).
    assert flags["TASK"] == flags["SDK"] == flags["NESTED"], seen
    assert seen["NESTED"].split("-")[1] == seen["SDK"].split("-")[1]  # the same trace


OWN_PROCESSOR = r"""
import dask, otel_graph
from opentelemetry import trace
from opentelemetry.sdk.trace import SpanProcessor
handle = otel_graph.instrument_scheduler(resources=False)
class Seen(SpanProcessor):
    started, ended = [], []
    def on_start(self, span, parent_context=None): self.started.append(span.name)
    def on_end(self, span): self.ended.append(span.name)
print("BEFORE", dask.delayed(sum)([1, 2]).compute(scheduler="sync"))
trace.get_tracer_provider().add_span_processor(Seen())
print("AFTER", dask.delayed(sum)([1, 2]).compute(scheduler="sync"))
print("FLUSHED", handle.flush(timeout_s=30))
print("STARTED", ",".join(Seen.started))
print("ENDED", ",".join(sorted(Seen.ended)))
"""


def test_a_processor_the_application_adds_sees_the_compute_span_start_and_end(tmp_path):
    """otel_graph's light root span skips on_start; once an application adds a processor of
    its own to the provider otel_graph built, computes take the SDK's start_span again."""
    proc = subprocess.run([sys.executable, "-c", OWN_PROCESSOR], capture_output=True, text=True, timeout=60,
                          env=file_env(tmp_path))
    assert proc.returncode == 0 and "FLUSHED True" in proc.stdout, proc.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    assert lines["STARTED"] == "dask.compute"
    assert lines["ENDED"] == "dask.compute,sum"


PARENTS = {
    "none": None,
    "local sampled": SpanContext(7, 8, False, TraceFlags(1), TraceState([("k", "v")])),
    "local unsampled": SpanContext(7, 8, False, TraceFlags(0)),
    "remote sampled": SpanContext(7, 8, True, TraceFlags(1), TraceState([("k", "v")])),
    "remote unsampled": SpanContext(7, 8, True, TraceFlags(0), TraceState([("k", "v")])),
}


@pytest.mark.parametrize("parent", list(PARENTS))
def test_the_default_samplers_decision_is_made_as_it_makes_it(parent: str) -> None:
    """With the SDK's default sampler, a root span is decided without asking it: the same
    decision, flags and trace state as asking it."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    from otel_graph.telemetry.compute_span import start_compute_span
    from otel_graph.telemetry.spans import DirectEmitter

    emitter = DirectEmitter(TracerProvider(), InstrumentationScope("test"))
    assert emitter.follows_parent
    made = []
    token = context.attach(trace.set_span_in_context(NonRecordingSpan(PARENTS[parent])) if PARENTS[parent]
                           else context.Context())
    try:
        for follows in (True, False):
            emitter.follows_parent = follows
            span = start_compute_span(emitter, "dask.compute", start_ns=1, attributes={"dask.scheduler": "sync"})
            made.append(span)
    finally:
        context.detach(token)
    fast, asked = (s.get_span_context() for s in made)
    assert (fast.trace_flags, fast.trace_state, made[0].is_recording()) == \
        (asked.trace_flags, asked.trace_state, made[1].is_recording())
    assert made[0].is_recording() == (parent in ("none", "local sampled", "remote sampled"))
    if PARENTS[parent] is not None:
        assert fast.trace_id == asked.trace_id == 7


def test_other_samplers_are_asked() -> None:
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, DEFAULT_ON, ParentBased, TraceIdRatioBased

    from otel_graph.export.sdk_internals import follows_parent

    assert follows_parent(DEFAULT_ON) and follows_parent(ParentBased(ALWAYS_ON))
    assert not any(follows_parent(s) for s in (ALWAYS_ON, ParentBased(ALWAYS_OFF), TraceIdRatioBased(0.5),
                                               ParentBased(ALWAYS_ON, remote_parent_not_sampled=ALWAYS_ON)))


def test_the_ids_are_those_the_providers_id_generator_would_give() -> None:
    """A root span's ids are drawn as the SDK's RandomIdGenerator draws them (seeded alike, the
    same ids as the SDK's own start_span), and come from any other generator by asking it."""
    import random

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.id_generator import IdGenerator
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    from otel_graph.telemetry.compute_span import start_compute_span
    from otel_graph.telemetry.spans import DirectEmitter

    provider = TracerProvider()
    emitter = DirectEmitter(provider, InstrumentationScope("test"))
    assert emitter.draws_ids
    token = context.attach(context.Context())  # no current span: a new trace
    try:
        random.seed(11)
        ours = start_compute_span(emitter, "dask.compute", start_ns=1, attributes={}).get_span_context()
        random.seed(11)
        sdk = provider.get_tracer("test").start_span("dask.compute").get_span_context()

        class Counting(IdGenerator):
            def __init__(self) -> None:
                self.last = 0

            def generate_span_id(self) -> int:
                self.last += 1
                return self.last

            def generate_trace_id(self) -> int:
                return 0xABC

        other = DirectEmitter(TracerProvider(id_generator=Counting()), InstrumentationScope("test"))
        assert not other.draws_ids
        counted = start_compute_span(other, "dask.compute", start_ns=1, attributes={}).get_span_context()
    finally:
        context.detach(token)
    assert (ours.trace_id, ours.span_id) == (sdk.trace_id, sdk.span_id)
    # Made as the tuple it is, not by its constructor: the same SpanContext, field for field.
    assert type(ours) is type(sdk) and tuple(ours) == tuple(sdk) and ours.is_valid
    assert (counted.trace_id, counted.span_id) == (0xABC, 1)


def test_the_context_helpers_follow_a_runtime_context_put_in_place_later(monkeypatch: pytest.MonkeyPatch) -> None:
    """otel_graph reads and sets OpenTelemetry's context through its ContextVar; an application
    may replace the runtime context once running (Sentry's integration does), and from then on
    what otel_graph attaches must be what the API reads, and the reverse."""
    from opentelemetry.context.contextvars_context import ContextVarsRuntimeContext

    from otel_graph.telemetry.task_context import attach_context, current_context, detach_context

    monkeypatch.setattr(context, "_RUNTIME_CONTEXT", ContextVarsRuntimeContext())
    mine = context.Context({"k": 1})
    token = attach_context(mine)
    try:
        assert context.get_current() is mine and current_context() is mine
    finally:
        detach_context(token)
    assert context.get_current() is not mine
    theirs = context.attach(context.Context({"k": 2}))
    try:
        assert current_context() is context.get_current()
    finally:
        context.detach(theirs)


def test_a_root_under_a_parent_with_trace_state_has_the_context_the_sdk_gives() -> None:
    """Made as the tuple it is (the layout checked at import holds for this release), a root's
    context under a remote parent with trace state equals the SDK's but for its span id."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState, set_span_in_context

    from otel_graph.telemetry.compute_span import _AS_TUPLE, start_compute_span
    from otel_graph.telemetry.spans import DirectEmitter

    assert _AS_TUPLE  # else a release changed SpanContext's layout: the constructor is used
    provider = TracerProvider()
    parent = SpanContext(0xABCDEF, 0x1234, True, TraceFlags(TraceFlags.SAMPLED), TraceState([("vendor", "on")]))
    under = set_span_in_context(NonRecordingSpan(parent))
    ours = start_compute_span(DirectEmitter(provider, InstrumentationScope("test")), "dask.compute", start_ns=1,
                              attributes={}, context=under).get_span_context()
    sdk = provider.get_tracer("test").start_span("dask.compute", context=under).get_span_context()
    assert type(ours) is SpanContext and ours.is_valid and not ours.is_remote
    assert (ours.trace_id, ours.trace_flags, ours.trace_state) == (sdk.trace_id, sdk.trace_flags, sdk.trace_state)
    assert ours.trace_state is parent.trace_state and ours.span_id not in (0, parent.span_id)
