"""NVTX ranges per task and compute, recorded by a real NVTX tool (``nvtx_tool``), no GPU needed.

The app (``apps/nvtx_app.py``) runs under the recorder, which NVTX loads as it loads Nsight
Systems; its spans go to OTLP files. Each task span must have its range: named by the span's
prefix, in the ``dask`` domain, on the thread and in the process the span says ran it, holding
the span's time, with the span's key marked inside it; each compute span its own range, marked
with its trace id and holding its tasks' ranges where they ran in its thread.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from conftest import needs_distributed, subprocess_env
from nvtx_tool import Range, Recorded, attached, build_recorder, read
from otel_graph.telemetry.nvtx_ranges import colour
from subprocesses import run_app

# The tool is a shared library NVTX loads with dlopen, built against headers shipped for Linux.
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the tests' NVTX tool is built for Linux")


@pytest.fixture(scope="session")
def recorder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_recorder(tmp_path_factory.mktemp("nvtx-tool"))


def _spans(out: Path) -> list[dict[str, Any]]:
    spans = []
    for line in (out / "traces.jsonl").read_text(encoding="utf-8").splitlines():
        for resource_spans in json.loads(line)["resourceSpans"]:
            resource = _attributes(resource_spans["resource"].get("attributes"))
            for scope in resource_spans["scopeSpans"]:
                for span in scope["spans"]:
                    span["attrs"] = _attributes(span.get("attributes"))
                    span["pid"] = resource["process.pid"]
                    spans.append(span)
    return spans


def _attributes(items: list[dict[str, Any]] | None) -> dict[str, Any]:
    found = {}
    for item in items or ():
        value = item["value"]
        found[item["key"]] = int(value["intValue"]) if "intValue" in value else next(iter(value.values()))
    return found


class Profiled:
    def __init__(self, run: Any, out: Path) -> None:
        self.run = run
        self.spans = _spans(out)
        self.recorded: Recorded = read(out / "nvtx")
        self.dask = [r for r in self.recorded.ranges if r.domain == "dask"]

    def tasks(self, scheduler: str) -> list[dict[str, Any]]:
        roots = {s["spanId"] for s in self.spans
                 if s["name"] == "dask.compute" and s["attrs"].get("dask.scheduler") == scheduler}
        return [s for s in self.spans if s.get("parentSpanId") in roots and "dask.task.key" in s["attrs"]]

    def range_of(self, span: dict[str, Any]) -> Range:
        key = span["attrs"]["dask.task.key"]
        holding = [r for r in self.dask if r.category == "task" and any(m.message == key for m in r.marks)]
        assert len(holding) == 1, f"{len(holding)} ranges mark task {key}"
        return holding[0]


def _profile(tmp_path: Path, recorder: Path, *args: str, **env: str) -> Profiled:
    out = tmp_path
    environment = subprocess_env(OTEL_TRACES_EXPORTER="otlp_file", OTEL_METRICS_EXPORTER="none",
                                 OTEL_GRAPH_FILE_DIR=str(out), OTEL_GRAPH_MAX_TASK_SPANS="unlimited",
                                 **attached(recorder, out / "nvtx"), **env)
    run = run_app("nvtx_app.py", *args, env=environment, timeout_s=240)
    assert run.value("FLUSHED") == "True"
    return Profiled(run, out)


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory, recorder: Path) -> Profiled:
    return _profile(tmp_path_factory.mktemp("nvtx-local"), recorder, "--schedulers", "sync,threads,processes")


#: A worker process's task spans are timed by distributed (its startstops, less the worker's
#: estimate of its clock's offset from the scheduler's, which moves by milliseconds between
#: heartbeats on a loaded machine); its ranges by the recorder's own clock readings.
WORKER_CLOCK_SLACK_NS = 25_000_000


def _check_task_ranges(profiled: Profiled, scheduler: str, *, expected: int, name: str | None = None,
                       slack_ns: int = 0) -> list[Range]:
    tasks = [s for s in profiled.tasks(scheduler) if name is None or s["name"] == name]
    assert len(tasks) == expected
    found = []
    for span in tasks:
        attrs = span["attrs"]
        held = profiled.range_of(span)
        assert held.kind == "push" and held.message == span["name"] == attrs["dask.task.prefix"]
        assert held.thread == held.end_thread == attrs["thread.id"], "pushed and popped where the task ran"
        assert held.holds(int(span["startTimeUnixNano"]), int(span["endTimeUnixNano"]), slack_ns=slack_ns)
        assert held.colour == colour(span["name"]) and held.colour >> 24 == 0xFF
        [mark] = held.marks
        assert mark.category == "task" and mark.colour == held.colour
        found.append(held)
    return found


def test_sync_tasks_run_in_ranges_nested_in_their_compute(local: Profiled) -> None:
    assert local.run.value("TOOL_SEEN") == "True"
    assert local.recorded.unbalanced == []
    assert local.run.value("RESULT sync") == "6"
    ranges = _check_task_ranges(local, "sync", expected=6)  # 4 load, total, boom
    assert Counter(r.message for r in ranges) == {"load": 4, "total": 1, "boom": 1}
    roots = [s for s in local.spans if s["name"] == "dask.compute" and s["attrs"]["dask.scheduler"] == "sync"]
    computes = [r for r in local.dask if r.category == "compute"]
    for root in roots:
        [compute] = [r for r in computes
                     if any(m.message == f"trace_id={root['traceId'].lower()}" for m in r.marks)]
        assert compute.kind == "start" and compute.message == "dask.compute"
        assert int(root["startTimeUnixNano"]) <= compute.start_ns < compute.end_ns <= int(root["endTimeUnixNano"])
        tasks = [local.range_of(s) for s in local.tasks("sync") if s["traceId"] == root["traceId"]]
        # The sync scheduler runs them in the caller's thread, inside the compute's range.
        assert tasks and all(compute.holds(t.start_ns, t.end_ns) and t.thread == compute.thread for t in tasks)
    # The failed task's range ended all the same, and the user's own ranges nest in each load's.
    [failed] = [r for r in ranges if r.message == "boom"]
    assert failed.end_ns > failed.start_ns
    users = [r for r in local.recorded.ranges if r.domain == "user"]
    loads = [r for r in ranges if r.message == "load"]
    assert len(users) == 4
    for user in users:
        assert sum(load.holds(user.start_ns, user.end_ns) and load.thread == user.thread for load in loads) == 1


def test_pool_threads_push_and_pop_their_own_tasks_ranges(local: Profiled) -> None:
    ranges = _check_task_ranges(local, "threads", expected=24)
    callers = {r.thread for r in local.dask if r.category == "compute"}
    threads = {r.thread for r in ranges}
    assert len(threads) >= 2 and not threads & callers, "ranges on the pool's threads, not the caller's"
    assert all(r.depth == 0 for r in ranges), "a thread's task ranges never nest in one another"


def test_pool_processes_make_ranges_in_their_own_process(local: Profiled) -> None:
    ranges = _check_task_ranges(local, "processes", expected=6)
    parent = {s["pid"] for s in local.spans}
    pool = {r.pid for r in ranges}
    assert pool and not pool & parent
    for span in local.tasks("processes"):
        assert local.range_of(span).pid == int(span["attrs"]["dask.worker.id"])


@needs_distributed
@pytest.mark.slow  # a LocalCluster with worker processes
def test_cluster_workers_run_tasks_in_ranges_turned_on_by_the_clients_option(tmp_path: Path, recorder: Path) -> None:
    # The option only, no variable: the workers learn it from the client's plugin.
    profiled = _profile(tmp_path, recorder, "--schedulers", "cluster")
    assert profiled.run.value("RESULT cluster") == str(sum(i * 2 for i in range(8)))
    assert profiled.recorded.unbalanced == []
    ranges = _check_task_ranges(profiled, "distributed", expected=8, name="nap", slack_ns=WORKER_CLOCK_SLACK_NS)
    workers = {r.pid for r in ranges}
    assert all(profiled.range_of(s).pid == s["pid"] for s in profiled.tasks("distributed")), "where it ran"
    client = {r.pid for r in profiled.dask if r.category == "compute"}
    assert client and not client & workers
    # The async def task: a start/end range on the worker, marked with its key.
    [fetch] = [s for s in profiled.spans if s["name"] == "fetch"]
    held = profiled.range_of(fetch)
    assert held.kind == "start" and held.message == "fetch" and held.pid == fetch["pid"]
    assert held.holds(int(fetch["startTimeUnixNano"]), int(fetch["endTimeUnixNano"]), slack_ns=WORKER_CLOCK_SLACK_NS)


@needs_distributed
def test_in_process_workers_run_tasks_in_ranges_until_uninstrumented(tmp_path: Path, recorder: Path) -> None:
    profiled = _profile(tmp_path, recorder, "--schedulers", "inprocess", "--uninstrument")
    assert profiled.run.value("RESULT inprocess") == str(sum(i * 2 for i in range(8)))
    assert profiled.recorded.unbalanced == []
    ranges = _check_task_ranges(profiled, "distributed", expected=8)
    assert {r.pid for r in ranges} == {s["pid"] for s in profiled.spans}, "all in the one process"
    assert profiled.run.value("RESTORED") == "True", "uninstrument() puts distributed's runners back"


def test_off_nothing_is_imported_and_no_range_made(tmp_path: Path, recorder: Path) -> None:
    # Tool attached, option and variable unset: otel_graph makes no NVTX call at all.
    out = tmp_path
    environment = subprocess_env(OTEL_TRACES_EXPORTER="otlp_file", OTEL_METRICS_EXPORTER="none",
                                 OTEL_GRAPH_FILE_DIR=str(out), **attached(recorder, out / "nvtx"))
    run = run_app("nvtx_app.py", "--how", "variable", "--schedulers", "threads,processes", env=environment)
    assert run.value("NVTX_IMPORTED") == "False"
    # The tool writes its file at the first NVTX call a process makes: there was none.
    assert list((out / "nvtx").glob("nvtx-*.tsv")) == [] and len(_spans(out)) == 24 + 6 + 2


def test_the_variable_turns_ranges_on(tmp_path: Path, recorder: Path) -> None:
    profiled = _profile(tmp_path, recorder, "--how", "variable", "--schedulers", "threads", OTEL_GRAPH_NVTX="true")
    _check_task_ranges(profiled, "threads", expected=24)


def test_no_tool_attached_the_compute_runs_and_is_traced(tmp_path: Path) -> None:
    environment = subprocess_env(OTEL_TRACES_EXPORTER="otlp_file", OTEL_METRICS_EXPORTER="none",
                                 OTEL_GRAPH_FILE_DIR=str(tmp_path), OTEL_GRAPH_NVTX="true")
    run = run_app("nvtx_app.py", "--schedulers", "sync,threads,processes", env=environment)
    assert run.value("TOOL_SEEN") == "False", "no tool: nothing is wrapped"
    assert run.value("RESULT sync") == "6" and run.value("RESULT threads") == str(sum(i * 2 for i in range(24)))
    assert sum(s["name"] == "dask.compute" for s in _spans(tmp_path)) == 4


MISSING = """
import sys
sys.modules["nvtx"] = None  # as if the gpu extra were not installed
import otel_graph
try:
    otel_graph.instrument_scheduler({options})
except otel_graph.ConfigurationError as exc:
    print("REFUSED", exc)
"""


@pytest.mark.parametrize(("options", "env"), [("nvtx=True", {}), ("", {"OTEL_GRAPH_NVTX": "true"})])
def test_missing_binding_is_a_configuration_error_naming_the_variable_and_extra(options: str,
                                                                               env: dict[str, str]) -> None:
    run = subprocess.run([sys.executable, "-c", MISSING.format(options=options)],
                         env=subprocess_env(OTEL_TRACES_EXPORTER="none", OTEL_METRICS_EXPORTER="none", **env),
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "REFUSED OTEL_GRAPH_NVTX=true" in run.stdout and "pip install 'otel-graph[gpu]'" in run.stdout
    assert "Traceback" not in run.stderr


def test_a_bad_value_names_the_variable() -> None:
    from otel_graph.config import load_settings
    from otel_graph.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="OTEL_GRAPH_NVTX='maybe' is not valid"):
        load_settings({"OTEL_GRAPH_NVTX": "maybe"})


FOLDED = """
import dask
import otel_graph
from otel_graph.telemetry import nvtx_ranges
nvtx_ranges.MAX_PREFIXES = 3
otel_graph.instrument_scheduler(nvtx=True)
graph = {f"p{i}-1": (abs, -i) for i in range(6)}
graph[b"raw-\\xff"] = (abs, -7)
graph[("tab\\tname-1", 0)] = (abs, -8)
graph["tab\\tkey-2"] = (abs, -9)
print("RESULT", sum(dask.get(graph, list(graph))))
"""


def test_prefixes_past_the_limit_share_one_name_and_every_key_is_marked(tmp_path: Path, recorder: Path) -> None:
    run = subprocess.run([sys.executable, "-c", FOLDED], env=subprocess_env(
        OTEL_TRACES_EXPORTER="none", OTEL_METRICS_EXPORTER="none", **attached(recorder, tmp_path)),
        capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "RESULT 39" in run.stdout, run.stderr[-3000:]
    recorded = read(tmp_path)
    tasks = [r for r in recorded.ranges if r.category == "task"]
    named = Counter(r.message for r in tasks)
    assert named.pop("(other prefixes)") == 6, "the first three prefixes to run keep their names"
    assert len(named) == 3 and set(named.values()) == {1}
    assert len({r.colour for r in tasks if r.message == "(other prefixes)"}) == 1
    marked = sorted(m.message for r in tasks for m in r.marks)
    # A key is written as dask.task.key writes it; the tool's file shows a tab as a space.
    assert marked == sorted([f"p{i}-1" for i in range(6)] + ["raw-\\xff", "('tab\\tname-1', 0)", "tab key-2"])
