"""The telemetry reference cannot drift: ``otel_graph.conventions`` names what is emitted.

Two ways round, twice:

* in the source, every string that reads as a telemetry name (``dask.task.key``,
  ``process.cpu.utilization``...) is catalogued, and every catalogued name is in the
  source outside the catalogue;
* in what real computes send (sync, threads, processes, a LocalCluster with worker
  processes; OTLP files read back as they are written), every span kind, attribute, event
  and metric is catalogued, metrics with their unit, kind and description; and everything
  catalogued arrives, but for the few :data:`NOT_MADE_HERE` says cannot be made here.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from conftest import subprocess_env
from otel_graph import conventions
from otel_graph.conventions import ATTRIBUTES, EVENTS, METRICS, RESOURCE, SPANS

PACKAGE = Path(conventions.__file__).parent
_NAME = re.compile(r"(dask|otel|otel_graph|process|system|hw|code|thread|error|exception|cpu|service|host)"
                   r"(\.[a-z0-9_]+)+")
#: Strings of that shape that are not telemetry: modules and loggers.
NOT_TELEMETRY = {"dask.local", "dask.threaded", "dask.multiprocessing", "dask.distributed", "otel_graph.gpu",
                 "otel_graph.otlp_fast", "otel_graph.resources", "otel_graph.dask_span_ids"}
#: The catalogue's dotted names (an event named ``exception`` is too plain a word to look for).
CATALOGUED = {name for name in (*ATTRIBUTES, *METRICS, *EVENTS, *RESOURCE, *(span.name for span in SPANS.values()))
              if _NAME.fullmatch(name)}


def _is_module(text: str) -> bool:
    parts = text.split(".")
    return parts[0] == "otel_graph" and (PACKAGE.parent.joinpath(*parts).with_suffix(".py").is_file()
                                         or PACKAGE.parent.joinpath(*parts).is_dir())


def _strings_in_source(*, emitters_only: bool = False) -> dict[str, list[str]]:
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "conventions.py" or (emitters_only and path.parent.name == "report"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)):
                text = node.value.decode("latin-1") if isinstance(node.value, bytes) else node.value
                if _NAME.fullmatch(text) and text not in NOT_TELEMETRY and not _is_module(text):
                    found[text].append(str(path.relative_to(PACKAGE)))
    return found


def test_every_telemetry_name_in_the_source_is_catalogued() -> None:
    found = _strings_in_source()
    assert "dask.task.key" in found and "process.cpu.utilization" in found  # the scan sees them
    missing = {name: where for name, where in found.items() if name not in CATALOGUED}
    assert not missing, f"telemetry names not in otel_graph.conventions: {missing}"


def test_every_catalogued_name_is_used_in_the_source() -> None:
    found = _strings_in_source(emitters_only=True)  # the report reads names; that is no emitting
    unused = sorted(name for name in CATALOGUED if name not in found)
    assert not unused, f"catalogued in otel_graph.conventions, used nowhere: {unused}"


def test_the_catalogue_is_whole() -> None:
    for kind, span in SPANS.items():
        assert set(span.attributes) <= set(ATTRIBUTES), kind
        assert set(span.events) <= set(EVENTS), kind
    for name, event in EVENTS.items():
        assert set(event.attributes) <= set(ATTRIBUTES), name
    for name, metric in METRICS.items():
        assert set(metric.attributes) <= set(ATTRIBUTES), name
        assert metric.instrument in ("histogram", "counter", "up-down counter", "gauge"), name
    used = {a for s in SPANS.values() for a in s.attributes} | {a for e in EVENTS.values() for a in e.attributes} \
        | {a for m in METRICS.values() for a in m.attributes}
    assert sorted(set(ATTRIBUTES) - used) == [], "an attribute no span, event or metric carries"


#: What a real compute emits here, made to cover the catalogue: every scheduler, a failure,
#: the span budget (4), progress spans, 2,001 prefixes (past the metrics' 2,000), and on a
#: LocalCluster with two worker processes a transfer between them, retries, a distributed
#: span, a cancelled and a dropped future, and a worker retired during a compute.
SCRIPT = r"""
import time
import dask
import distributed
import otel_graph

handle = otel_graph.instrument_scheduler(max_task_spans=4, progress_interval_s=0.3, drain_interval_s=0.2)

def inc(x):
    return x + 1

def fail(x):
    raise ValueError(f"no {x}")

def slow(x, s=0.3):
    time.sleep(s)
    return x

dask.compute(dask.delayed(inc)(1), scheduler="sync")
try:
    dask.delayed(fail)(dask.delayed(inc)(1)).compute(scheduler="sync")
except ValueError:
    pass
dask.get({f"x{i}": (inc, i) for i in range(2001)}, [f"x{i}" for i in range(2001)])
parts = [dask.delayed(slow)(i) for i in range(12)]  # 2.4 s on two threads: progress spans
dask.delayed(sum)(parts).compute(scheduler="threads", num_workers=2)
dask.compute(*[dask.delayed(inc)(i) for i in range(3)], scheduler="processes", num_workers=2)

with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster, \
        distributed.Client(cluster) as client:
    a, b = sorted(client.scheduler_info()["workers"])
    with distributed.span("catalogue"):
        x = client.submit(inc, 1, key="inc-a", workers=[a], retries=2)
        assert client.submit(inc, x, key="inc-b", workers=[b]).result() == 3
    try:
        with distributed.span("refused"):
            raise KeyError("refused")
    except KeyError:
        pass
    assert sum(client.gather(client.map(inc, range(12), key=[f"many-{i}" for i in range(12)]))) == 78
    failed = client.submit(fail, 1, key="fail-1")
    distributed.wait(failed)
    cancelled = client.submit(slow, 1, 5, key="slow-cancelled")
    cancelled.cancel()
    dropped = client.compute(dask.delayed(slow)(2, dask_key_name="slow-dropped"))
    del dropped
    running = client.submit(slow, 3, 2, key="slow-running", workers=[a])
    time.sleep(0.5)
    client.retire_workers([b])
    assert running.result() == 3
    time.sleep(1.5)  # a metric export with the scheduler's gauges and fine metrics
    assert handle.flush(timeout_s=30)
assert handle.flush(timeout_s=30)
"""

#: Catalogued, and not made by SCRIPT: what needs a GPU, a worker killed, a spill, a scheduler
#: process with its own SDK, or a failure inside otel_graph. Each is tested where it can be made.
NOT_MADE_HERE = {
    # A worker killed outright (test_worker_exits): its tasks' recovered spans, the event, the runs.
    "span kind": {"recovered"},
    "event": {"dask.worker.lost"},
    "event dask.worker.retired": {"dask.task.recovered"},
    "metric dask.task.duration": {"dask.task.recovered"},
    "task": {"dask.task.attempt"},  # a task retried on the worker it failed on
    # A local compute's tasks that never reported back, a compute open at exit, otel_graph failing.
    "compute": {"dask.graph.tasks_lost", "otel_graph.incomplete", "otel_graph.processing_error"},
    # Where your code calls record_exception() on a compute span, as on the SDK's spans.
    "event exception": {"exception.escaped"},
    # A p2p shuffle's or the memory monitor's sub-parts (gather-dep, get-data and execute have none).
    **{f"metric dask.activity.{unit}": {"dask.activity.phase"} for unit in ("time", "size", "count")},
    "metric": {"hw.gpu.utilization", "hw.gpu.memory.usage", "hw.gpu.memory.limit", "hw.gpu.memory.utilization"},
    "resource": {"dask.scheduler.address"},  # dask scheduler --preload otel_graph
}


#: OTLP/JSON's value fields, as the catalogue names their types.
_TYPES = {"stringValue": "string", "intValue": "int", "doubleValue": "double", "boolValue": "boolean",
          "arrayValue": "string[]"}


def _attrs(items: list[dict] | None) -> dict[str, str]:
    """name -> the catalogue's name for its value's type."""
    return {item["key"]: _TYPES.get(next(iter(item["value"])), "?") for item in items or ()}


def _mistyped(attributes: dict[str, str], where: str) -> list[str]:
    # A catalogue type may name two ("boolean; int on events"): either is allowed.
    allowed = {name: set(re.findall(r"string\[\]|string|int|double|boolean", ATTRIBUTES[name].type))
               for name in attributes if name in ATTRIBUTES}
    return [f"{where}: {name} is {kind}, catalogued {ATTRIBUTES[name].type}" for name, kind in attributes.items()
            if name in allowed and kind not in allowed[name]]


def _kind(name: str, attributes: dict) -> str:
    if name == "dask.compute":
        return "compute"
    if name == "dask.compute.progress":
        return "progress"
    if "dask.task.recovered" in attributes:
        return "recovered"
    if "dask.task.aggregate" in attributes:
        return "aggregate"
    if "dask.task.prefix" in attributes:
        return "task"
    if "dask.task.key" in attributes:
        return "phase"
    if "dask.span.id" in attributes:
        return "distributed-span"
    return f"unknown span {name!r} {sorted(attributes)}"


_INSTRUMENT = {"histogram": "histogram", "gauge": "gauge"}


@pytest.mark.slow  # a LocalCluster with worker processes, about 20 s
def test_what_real_computes_emit_is_the_catalogue(tmp_path: Path) -> None:
    env = subprocess_env(OTEL_TRACES_EXPORTER="otlp_file", OTEL_METRICS_EXPORTER="otlp_file",
                         OTEL_GRAPH_FILE_DIR=str(tmp_path), OTEL_METRIC_EXPORT_INTERVAL="300")
    run = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=240)
    assert run.returncode == 0, run.stderr[-4000:]

    seen: dict[str, set[str]] = defaultdict(set)
    problems: list[str] = []
    for line in (tmp_path / "traces.jsonl").read_text(encoding="utf-8").splitlines():
        for resource_spans in json.loads(line)["resourceSpans"]:
            seen["resource"] |= set(_attrs(resource_spans["resource"].get("attributes")))
            for scope in resource_spans["scopeSpans"]:
                for span in scope["spans"]:
                    attributes = _attrs(span.get("attributes"))
                    kind = _kind(span["name"], attributes)
                    if kind not in SPANS:
                        problems.append(kind)
                        continue
                    seen["span kind"].add(kind)
                    seen[kind] |= set(attributes)
                    problems += _mistyped(attributes, f"{kind} span")
                    prefix = next((item["value"]["stringValue"] for item in span["attributes"]
                                   if item["key"] == "dask.task.prefix"), None)
                    if kind == "task" and span["name"] not in (prefix, "(other prefixes)"):
                        problems.append(f"task span named {span['name']!r}, prefix {prefix!r}")
                    if kind == "phase" and span["name"] not in ("transfer", "disk-read", "disk-write"):
                        problems.append(f"phase span named {span['name']!r}")
                    problems += [f"{kind} span carries {a}" for a in set(attributes) - set(SPANS[kind].attributes)]
                    for event in span.get("events", ()):
                        name = event["name"]
                        seen["event"].add(name)
                        if name not in SPANS[kind].events:
                            problems.append(f"{kind} span has event {name}")
                            continue
                        extra = set(_attrs(event.get("attributes"))) - set(EVENTS[name].attributes)
                        problems += [f"event {name} carries {a}" for a in extra]
                        seen[f"event {name}"] |= set(_attrs(event.get("attributes")))
                        problems += _mistyped(_attrs(event.get("attributes")), f"event {name}")
    for line in (tmp_path / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
        for resource_metrics in json.loads(line)["resourceMetrics"]:
            seen["resource"] |= set(_attrs(resource_metrics["resource"].get("attributes")))
            for scope in resource_metrics["scopeMetrics"]:
                for metric in scope["metrics"]:
                    name = metric["name"]
                    if name not in METRICS:
                        problems.append(f"metric {name} not catalogued")
                        continue
                    entry = METRICS[name]
                    data_kind = next(k for k in ("histogram", "sum", "gauge") if k in metric)
                    instrument = _INSTRUMENT.get(data_kind) or (
                        "counter" if metric["sum"].get("isMonotonic") else "up-down counter")
                    if (instrument, metric.get("unit", ""), metric.get("description", "")) != \
                            (entry.instrument, entry.unit, entry.brief):
                        problems.append(f"metric {name} is {instrument} in {metric.get('unit')!r}: "
                                        f"{metric.get('description')!r}")
                    seen["metric"].add(name)
                    for point in metric[data_kind]["dataPoints"]:
                        typed = _attrs(point.get("attributes"))
                        problems += [f"metric {name} carries {a}" for a in set(typed) - set(entry.attributes)]
                        problems += _mistyped(typed, f"metric {name}")
                        seen[f"metric {name}"] |= set(typed)
    assert not problems, sorted(set(problems))
    # Which of its units an activity reports by a heartbeat depends on what ran before it:
    # the three fine-metric counters share their attributes.
    activity = [f"metric dask.activity.{unit}" for unit in ("time", "size", "count")]
    for each in activity:
        seen[each] = set().union(*(seen[other] for other in activity))

    # The resource: what otel_graph sets, and the SDK's own telemetry.sdk.*.
    assert {a for a in seen["resource"] if not a.startswith("telemetry.sdk.")} <= set(RESOURCE)
    expected = {
        "span kind": set(SPANS),
        "event": set(EVENTS),
        "metric": set(METRICS),
        "resource": set(RESOURCE),
        **{kind: set(span.attributes) for kind, span in SPANS.items()},
        **{f"event {name}": set(event.attributes) for name, event in EVENTS.items()},
        **{f"metric {name}": set(metric.attributes) for name, metric in METRICS.items()},
    }
    whole = {*NOT_MADE_HERE["span kind"], *(f"event {e}" for e in NOT_MADE_HERE["event"]),
             *(f"metric {m}" for m in NOT_MADE_HERE["metric"])}
    unmade = {what: sorted(names - seen[what] - NOT_MADE_HERE.get(what, set()))
              for what, names in expected.items() if what not in whole}
    unmade = {what: names for what, names in unmade.items() if names}
    assert not unmade, f"catalogued but not emitted: {unmade}"
