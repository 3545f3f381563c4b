"""Hostile input: keys, results, exceptions and graphs built to break telemetry (issue 6).

What must hold for each: the computation's result (or its own exception) is unchanged, no
traceback of ours reaches the user, and every span still arrives at a real OTLP receiver,
readable and bounded in size. Conversions are fuzzed with Hypothesis.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import needs_distributed, subprocess_env
from otel_graph.naming import (
    MAX_KEY_CHARS,
    MAX_MESSAGE_CHARS,
    MAX_PREFIX_CHARS,
    MAX_STACK_CHARS,
    key_to_str,
    safe_text,
    task_prefix,
)
from otel_graph.telemetry.events import describe_exception
from otlp_receiver import OtlpReceiver

APPS = Path(__file__).parent / "apps"
pytestmark = pytest.mark.slow  # whole apps on hostile input, plain and instrumented


@pytest.fixture(scope="module", params=["grpc", "http/protobuf"])
def hostile_run(request):
    with OtlpReceiver() as receiver:
        endpoint = receiver.grpc_endpoint if request.param == "grpc" else receiver.http_endpoint
        env = subprocess_env(OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_EXPORTER_OTLP_PROTOCOL=request.param,
                             OTEL_SERVICE_NAME="hostile",
                             OTEL_GRAPH_RESOURCES="false", PYTHONIOENCODING="utf-8",
                             OTEL_GRAPH_MAX_TASK_SPANS="unlimited")  # every hostile task gets its own span
        proc = subprocess.run([sys.executable, str(APPS / "hostile.py")], env=env, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        yield proc, receiver.spans(), receiver.metrics()


def line(proc: subprocess.CompletedProcess, label: str) -> str:
    (found,) = [text for text in proc.stdout.splitlines() if text.startswith(label + " ")]
    return found[len(label) + 1:]


def test_the_computation_is_unharmed_and_nothing_of_ours_is_printed(hostile_run):
    proc, _, _ = hostile_run
    assert line(proc, "RESULT") == "3 True 3 49995000"
    assert line(proc, "RAISED").startswith("ValueError ")
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "RESOURCE_EXHAUSTED" not in proc.stderr, "batches are sized to pass the 4 MB request limit"
    # Of all that, one span cannot be sent: the user's own, whose name no exporter can encode.
    # It is given up on alone, counted, and said once; everything else arrives.
    ours = [text for text in proc.stderr.splitlines() if "otel_graph" in text]
    assert len(ours) == 2, proc.stderr[-3000:]
    assert "cannot take a span" in ours[0] and "1 spans and 0 metric points were not delivered" in ours[1]
    flushed = line(proc, "FLUSHED")
    assert "'spans_undelivered': 1," in flushed and "'points_undelivered': 0" in flushed


def test_every_span_arrives_readable_and_bounded(hostile_run):
    _, spans, _ = hostile_run
    by_key = {s["attributes"].get("dask.task.key"): s for s in spans if s["name"] != "dask.compute"}
    assert "surrogate-\\udcff" in by_key and "fail-\\udcfe" in by_key
    assert by_key["surrogate-\\udcff"]["attributes"]["dask.task.prefix"] == "surrogate"
    weird = by_key["weird"]["attributes"]
    assert weird["dask.task.type"] == "Wéird-ключ"
    assert "dask.task.nbytes" not in by_key["raises"]["attributes"]  # sizeof raised: no size, no failure
    assert "dask.task.nbytes" not in by_key["huge"]["attributes"]  # past int64: no size rather than a lost batch
    long_key = [k for k in by_key if k and k.startswith("kkkk")]
    assert len(long_key) == 1 and len(long_key[0]) < MAX_KEY_CHARS + 64
    assert any(k and k.startswith("(((((") for k in by_key), "the deep key has a span"
    wide = by_key["wide"]["attributes"]
    assert wide["dask.task.dependency_count"] == 10_000 and len(wide["dask.task.dependencies"]) == 32
    failed = by_key["fail-\\udcfe"]
    (event,) = [e for e in failed["events"] if e["name"] == "exception"]
    assert event["attributes"]["exception.message"].startswith("bad \\udcff input xxx")
    assert len(event["attributes"]["exception.message"]) < MAX_MESSAGE_CHARS + 64
    assert len(event["attributes"]["exception.stacktrace"]) < MAX_STACK_CHARS + 64
    roots = [s for s in spans if s["name"] == "dask.compute"]
    assert len(roots) == 3 + 600


def test_a_failure_storm_too_big_for_one_request_still_arrives(hostile_run):
    proc, spans, _ = hostile_run
    assert line(proc, "STORM") == "600"
    storm = [s for s in spans if s["name"] == "storm"]
    assert len(storm) == 600 and all(s["status_code"] == 2 for s in storm)
    sizes = [sum(map(len, e["attributes"].values())) for s in storm for e in s["events"]]
    assert sum(sorted(sizes)[:512]) > 4 * 1024 * 1024, "512 of these spans (one default batch) exceed 4 MB"


def test_metrics_survive_the_same_input(hostile_run):
    _, _, metrics = hostile_run
    prefixes = {p["attributes"].get("dask.task.prefix") for p in metrics if p["name"] == "dask.task.duration"}
    assert {"surrogate", "fail", "wide", "part"} <= prefixes


# -- the same on dask.distributed -----------------------------------------------------------------
@pytest.fixture(scope="module")
def hostile_cluster_runs():
    """``apps/hostile_cluster.py`` run plain, then instrumented against a real receiver."""
    with OtlpReceiver() as receiver:
        env = subprocess_env(OTEL_EXPORTER_OTLP_ENDPOINT=receiver.grpc_endpoint, OTEL_SERVICE_NAME="hostile",
                             OTEL_GRAPH_RESOURCES="false", PYTHONIOENCODING="utf-8",
                             OTEL_GRAPH_MAX_TASK_SPANS="unlimited")
        env["PYTHONPATH"] = os.pathsep.join([str(APPS), env["PYTHONPATH"]])  # the app imports hostile.py
        runs = [subprocess.run([sys.executable, str(APPS / "hostile_cluster.py"), *args], env=env,
                               capture_output=True, text=True, timeout=300) for args in (["--plain"], [])]
        for proc in runs:
            assert proc.returncode == 0, proc.stderr[-3000:]
        yield runs, receiver.spans()


@needs_distributed
def test_on_a_cluster_the_computation_is_unharmed_and_nothing_of_ours_is_printed(hostile_cluster_runs):
    (plain, traced), _ = hostile_cluster_runs
    for label in ("RESULT", "RAISED", "STORM"):
        assert line(traced, label) == line(plain, label)
    assert line(traced, "RESULT") == "3 Wéird-ключ Raises 4 49995000" and line(traced, "STORM") == "200"
    # distributed logs each failure with its traceback, in both runs; none of ours is among them.
    assert f"{os.sep}otel_graph{os.sep}" not in traced.stderr, traced.stderr[-3000:]
    ours = [text for text in traced.stderr.splitlines() if "otel_graph" in text]
    assert len(ours) == 2, ours
    assert "cannot take a span" in ours[0] and "1 spans and 0 metric points were not delivered" in ours[1]
    flushed = line(traced, "FLUSHED")
    assert flushed.startswith("True ") and "'spans_undelivered': 1," in flushed, flushed
    assert "'worker_processes': 2" in flushed


@needs_distributed
def test_on_a_cluster_every_span_arrives_readable_and_bounded(hostile_cluster_runs):
    _, spans = hostile_cluster_runs
    tasks = [s for s in spans if "dask.task.prefix" in s["attributes"]]  # phase spans carry the key too
    by_key = {s["attributes"]["dask.task.key"]: s for s in tasks}
    long_key = [k for k in by_key if k.startswith("kkkk")]
    assert len(long_key) == 1 and len(long_key[0]) < MAX_KEY_CHARS + 64
    assert len(by_key[long_key[0]]["name"]) < MAX_PREFIX_CHARS + 64
    deep = [k for k in by_key if k.startswith("((((")]
    assert len(deep) == 1 and {"('ключ-🔑', 1)", "7", "raises", "user", "wide", "fail-1"} <= set(by_key)
    assert by_key["7"]["attributes"]["dask.task.type"] == "Wéird-ключ"
    wide = by_key["wide"]["attributes"]
    assert wide["dask.task.dependency_count"] == 10_000 and len(wide["dask.task.dependencies"]) == 32
    (event,) = [e for e in by_key["fail-1"]["events"] if e["name"] == "exception"]
    # distributed shortens a long error itself ('Long error message', ...): what it reports is shown.
    assert "bad \\udcff input xxx" in event["attributes"]["exception.message"]
    assert len(event["attributes"]["exception.message"]) < MAX_MESSAGE_CHARS + 64
    assert len(event["attributes"]["exception.stacktrace"]) < MAX_STACK_CHARS + 64
    storm = [s for s in spans if s["name"] == "storm"]
    assert len(storm) == 200 and all(s["status_code"] == 2 for s in storm)
    parts = {k for k in by_key if k.startswith("('part', ")}
    assert len(parts) == 10_000, "every task of the wide graph has its span"


# -- fuzzing the conversions -----------------------------------------------------------------------
keys = st.recursive(
    st.one_of(st.text(), st.binary(), st.integers(), st.floats(allow_nan=True)),
    lambda children: st.tuples(children, children) | st.tuples(children),
    max_leaves=50,
)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(keys)
def test_any_key_becomes_bounded_utf8_text(key):
    text = key_to_str(key)
    text.encode("utf-8")  # never raises
    assert len(text) <= MAX_KEY_CHARS + 64
    prefix = task_prefix(key)
    assert isinstance(prefix, str)
    prefix.encode("utf-8")


_KEY_WORDS = st.sampled_from(["inc", "x", "", "_(x)", "abcdefab", "5f3c", "d6770bcb", "ab", "fa12", "Hello", "é",
                              "<a.b object at 0x1", "a,b", "ae05086432ca935f6eba409a8ecd4896", "1", "-", "x" * 200,
                              "ünï", "(x"])


@settings(max_examples=1000, deadline=None)
@given(st.lists(_KEY_WORDS | st.text(max_size=12), min_size=1, max_size=5).map("-".join) | st.text())
def test_a_string_keys_prefix_is_dask_key_split(key):
    # task_prefix takes a shortcut for "name-<token>" keys: it must answer as key_split does.
    from dask.utils import key_split

    from otel_graph.naming import MAX_PREFIX_CHARS, bounded_text

    expected = key_split.__wrapped__(key)
    if len(expected) > MAX_PREFIX_CHARS or not expected.isascii():
        expected = bounded_text(expected, MAX_PREFIX_CHARS)
    assert task_prefix(key) == expected
    assert task_prefix((key, 0)) == expected


@settings(max_examples=300, deadline=None)
@given(st.text(),
       st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1, max_size=20))
def test_any_exception_is_described_in_bounded_utf8(message, name):
    kind = type(name, (Exception,), {})
    info = describe_exception(kind(message))
    for field in info:
        field.encode("utf-8")
    assert len(info.message) <= MAX_MESSAGE_CHARS + 64


@given(st.text())
def test_safe_text_keeps_what_utf8_can_carry(text):
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        assert safe_text(text) != text
        safe_text(text).encode("utf-8")
    else:
        assert safe_text(text) == text


annotations = st.one_of(
    st.from_regex(r"\A[0-9a-fA-F-]{0,60}(;[0-9+-]{0,30})?\Z"),  # near-traceparents
    st.integers(0, 5000).map(lambda digits: f"00-{'1' * 32}-{'2' * 16}-01;{'9' * digits}"),  # budgets of any length
    st.text(), st.none(), st.integers(), st.binary(),
    st.dictionaries(st.sampled_from(["traceparent", "budget", "other"]),
                    st.one_of(st.text(), st.integers(), st.none(), st.lists(st.integers()))),
)


@settings(max_examples=400, deadline=None)
@given(annotations)
def test_any_task_annotation_is_read_or_ignored(note):
    # A worker reads the compute's context from each task's annotation, which a user could
    # also set: whatever it holds, reading it never raises.
    from otel_graph.cluster.note import budget_of, parent_context, traceparent_of

    context = parent_context(note)
    assert context is None or (context.trace_id and context.span_id and context.is_remote)
    budget = budget_of(note)
    assert budget is None or (isinstance(budget, int) and budget >= 0)
    assert traceparent_of(note) is None or isinstance(traceparent_of(note), str)


BROKEN_DISTRIBUTED = """
import threading

import dask
import otel_graph

for attempt in (1, 2):
    handle = otel_graph.instrument_scheduler(resources=False)
print("SAME", handle is otel_graph.instrument_scheduler())
print("RESULT", dask.get({"a": (abs, -1), "b": (abs, "a")}, "b"))
print("FLUSHED", handle.flush(timeout_s=30))
handle.uninstrument()
print("TRACKERS", sum(t.name == "otel-graph-tracker" and t.is_alive() for t in threading.enumerate()))
try:
    otel_graph.instrument_scheduler(client=object())
except ImportError as exc:
    print("WITH_CLIENT", type(exc).__name__)
import dask.local
print("UNWRAPPED", not hasattr(dask.local.get_async, "__wrapped__"))
"""


def test_a_distributed_that_does_not_import_leaves_the_local_schedulers_traced_once(tmp_path):
    """An installed dask.distributed that fails to import (a version that does not match
    dask's): the local schedulers are traced, once however often one instruments, and a call
    that must have distributed raises, leaving Dask unwrapped."""
    broken = tmp_path / "distributed"
    broken.mkdir()
    (broken / "__init__.py").write_text('raise ImportError("distributed 0.0 needs dask==0.0 (simulated)")\n')
    with OtlpReceiver() as receiver:
        env = subprocess_env(OTEL_EXPORTER_OTLP_ENDPOINT=receiver.grpc_endpoint, OTEL_SERVICE_NAME="broken")
        env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
        proc = subprocess.run([sys.executable, "-c", BROKEN_DISTRIBUTED], env=env, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
        for label, value in [("SAME", "True"), ("RESULT", "1"), ("FLUSHED", "True"), ("TRACKERS", "0"),
                             ("WITH_CLIENT", "ImportError"), ("UNWRAPPED", "True")]:
            assert line(proc, label) == value, proc.stdout
        assert "dask.distributed does not import" in proc.stderr and "Traceback" not in proc.stderr
        spans = receiver.spans()
        assert [s["name"] for s in spans if s["name"] == "dask.compute"] == ["dask.compute"]
        assert sorted(s["attributes"]["dask.task.key"] for s in spans if "dask.task.key" in s["attributes"]) == \
            ["a", "b"]


IN_PROCESS_CLUSTER_THEN_OUTAGE = """
import sys
import time

import dask
import otel_graph
from distributed import Client, LocalCluster

handle = otel_graph.instrument_scheduler(resources=False)
with LocalCluster(n_workers=1, processes=False, dashboard_address=":0") as cluster, Client(cluster) as client:
    print("RESULT", client.get({"a": (abs, -1)}, "a"), flush=True)
print("CLOSED", flush=True)
sys.stdin.readline()  # the test's collector refuses from here on
ends = time.monotonic() + 3.0
while time.monotonic() < ends:  # a workload that goes on, making spans all the while
    dask.get({"b": (abs, -2)}, "b")
    time.sleep(0.05)
print("DONE", flush=True)
"""


@needs_distributed
def test_closing_an_in_process_cluster_leaves_the_process_s_exporter_backing_off(tmp_path):
    """A worker of a LocalCluster(processes=False) exports through the process's own pipeline;
    its teardown asked that pipeline the exit's question, which cuts retry backoffs for good:
    the process then retried a refusing collector ~10 times a second for the rest of its life."""
    with OtlpReceiver() as receiver:
        env = subprocess_env(OTEL_EXPORTER_OTLP_ENDPOINT=receiver.grpc_endpoint, OTEL_SERVICE_NAME="inproc",
                             OTEL_METRICS_EXPORTER="none")
        proc = subprocess.Popen([sys.executable, "-c", IN_PROCESS_CLUSTER_THEN_OUTAGE], env=env, text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        watchdog = threading.Timer(120, proc.kill)  # a hung child ends its reads, and the test
        watchdog.start()
        try:
            assert proc.stdout.readline().strip() == "RESULT 1"
            assert proc.stdout.readline().strip() == "CLOSED"
            receiver.fail = True
            proc.stdin.write("go\n")
            proc.stdin.flush()
            assert proc.stdout.readline().strip() == "DONE"
            refused = receiver.refused.get("traces", 0)
            # Backing off (1, 2 s...) makes 1-3 tries in the 3 s; without backoff, ~30.
            assert 1 <= refused <= 6, refused
        finally:
            watchdog.cancel()
            proc.kill()
            proc.communicate(timeout=60)


def test_a_partial_made_its_own_function_is_named_without_hanging():
    # A partial's __setstate__ lets it be its own function; naming walks partials down to a
    # function, and must stop. (Calling one crashes Python itself: only naming is tried here.)
    import threading
    from functools import partial

    from dask._task_spec import Task

    from otel_graph.telemetry.function_names import function_names

    looped = partial(print)
    looped.__setstate__((looped, (), {}, None))
    named: list[object] = []
    worker = threading.Thread(target=lambda: named.append(function_names(Task("x", looped, 1))), daemon=True)
    worker.start()
    worker.join(10)
    assert not worker.is_alive() and len(named) == 1


RAISING_COMPUTE_HISTOGRAM = """
import dask
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import otel_graph


class RaisingHistogram:
    def record(self, *args, **kwargs):
        raise RuntimeError("an application's histogram that raises")


class Meter:
    def __init__(self, inner):
        self._inner = inner

    def create_histogram(self, name, *args, **kwargs):
        made = self._inner.create_histogram(name, *args, **kwargs)
        return RaisingHistogram() if name == "dask.compute.duration" else made

    def __getattr__(self, attribute):
        return getattr(self._inner, attribute)


class Provider:
    def __init__(self, inner):
        self._inner = inner

    def get_meter(self, *args, **kwargs):
        return Meter(self._inner.get_meter(*args, **kwargs))


def boom(x):
    raise ValueError("boom")


reader = InMemoryMetricReader()
meters = MeterProvider(metric_readers=[reader])
# Spans through otel_graph's own SDK (encoded as they are made), metrics through the application's.
handle = otel_graph.instrument_scheduler(meter_provider=Provider(meters), resources=False)
try:
    dask.get({"a": (abs, -1), "b": (abs, "a"), "c": (boom, "b")}, "c")
except ValueError:
    pass
print("FLUSHED", handle.flush(timeout_s=10))
counts = {point.attributes["dask.task.prefix"]: point.count
          for resource in reader.get_metrics_data().resource_metrics
          for scope in resource.scope_metrics for metric in scope.metrics
          if metric.name == "dask.task.duration" for point in metric.data.data_points}
print("COUNTS", sorted(counts.items()))
"""


def test_a_compute_histogram_that_raises_leaves_each_task_run_counted_once():
    # A compute's duration is recorded after its task runs, in one fold: that raising must
    # neither lose the runs nor record them a second time.
    with OtlpReceiver() as receiver:
        env = subprocess_env(OTEL_EXPORTER_OTLP_ENDPOINT=receiver.grpc_endpoint, OTEL_SERVICE_NAME="raising",
                             OTEL_METRICS_EXPORTER="none")
        proc = subprocess.run([sys.executable, "-c", RAISING_COMPUTE_HISTOGRAM], env=env, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert line(proc, "FLUSHED") == "True", proc.stdout
        assert line(proc, "COUNTS") == "[('a', 1), ('b', 1), ('c', 1)]", proc.stdout
        # The compute's root still ended, once.
        assert receiver.wait_for(lambda r: any(s["name"] == "dask.compute" for s in r.spans()), timeout_s=10)
        roots = [s for s in receiver.spans() if s["name"] == "dask.compute"]
        assert len(roots) == 1
