"""dask.distributed end to end: a real LocalCluster with worker processes, exporting to a real OTLP receiver.

Each test runs ``tests/apps/cluster.py`` in a fresh interpreter configured by OTEL_*
variables, as a user would. The client process exports the ``dask.compute`` span and
the scheduler gauges (a LocalCluster's scheduler lives in the client's process); every
worker process exports its own task spans, task metrics and readings.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest

import subprocesses
from otlp_receiver import OtlpReceiver
from subprocesses import stop_all, wait_for_address, without_otel

pytest.importorskip("distributed")

APP = subprocesses.APPS / "cluster.py"
ERROR = 2  # OTLP StatusCode.STATUS_CODE_ERROR


@pytest.fixture
def receiver():
    with OtlpReceiver() as running:
        yield running


def env_for(receiver: OtlpReceiver, **extra: str) -> dict[str, str]:
    """Exporting to ``receiver`` over gRPC, as the cluster's service."""
    return subprocesses.otlp_env(receiver.grpc_endpoint, "grpc", service="cluster-test", **extra)


#: The app run to its end, which must exit cleanly (:func:`subprocesses.run_app`).
run_app = partial(subprocesses.run_app, APP)


def line_of(path: Path, text: str) -> int:
    """The number of the one line of ``path`` that holds ``text``."""
    (number,) = [n for n, line in enumerate(path.read_text().splitlines(), 1) if text in line]
    return number


def trace_of(receiver: OtlpReceiver, *, expect_tasks: int, containing: str | None = None) -> tuple[dict, list[dict]]:
    """A compute span and the spans of its trace, once ``expect_tasks`` task spans are under it.

    With ``containing``, the compute whose tasks include that key (a workload may run
    several computes); otherwise the only one with that many tasks.
    """

    def find(r: OtlpReceiver) -> dict | None:
        spans = r.spans()
        for root in (s for s in spans if s["name"] == "dask.compute"):
            tasks = [s for s in spans if s["parent_span_id"] == root["span_id"] and "dask.task.key" in s["attributes"]]
            keys = {s["attributes"]["dask.task.key"] for s in tasks}
            if len(tasks) >= expect_tasks and (containing is None or containing in keys):
                return root
        return None

    assert receiver.wait_for(lambda r: find(r) is not None, timeout_s=30), [s["name"] for s in receiver.spans()]
    root = find(receiver)
    return root, [s for s in receiver.spans() if s["trace_id"] == root["trace_id"] and s is not root]


def task_spans(spans: list[dict], root: dict) -> list[dict]:
    # Progress spans (a compute running past a second) are children of the root too.
    return [s for s in spans if s["parent_span_id"] == root["span_id"] and "dask.task.prefix" in s["attributes"]]


@pytest.mark.parametrize("order", ["instrument-first", "client-first", "attach"])
def test_every_task_on_every_worker_joins_one_trace(receiver, order):
    args = {"instrument-first": [], "client-first": ["--client-first"],
            "attach": ["--client-first", "--attach"]}[order]
    app = run_app("--parent", "--flush", *args, env=env_for(receiver))
    assert app.value("RESULT") == str(sum(range(1, 21)))
    assert app.value("FLUSHED") == "True"
    workers = app.value("WORKERS").split()
    root, spans = trace_of(receiver, expect_tasks=21)

    # The compute span is the caller's child, in the caller's trace.
    assert root["trace_id"] == app.value("TRACE_ID")
    assert root["parent_span_id"] == app.value("PARENT_SPAN_ID")
    assert root["attributes"]["dask.scheduler"] == "distributed"
    assert root["attributes"]["dask.graph.tasks"] == 21
    assert root["status_code"] != ERROR

    tasks = task_spans(spans, root)
    assert sorted(s["attributes"]["dask.task.key"] for s in tasks) == sorted(
        [f"inc-{i}" for i in range(20)] + ["total"])
    # Both workers ran tasks, each exporting from its own process.
    assert {s["attributes"]["dask.worker.id"] for s in tasks} == set(workers)
    for span in tasks:
        attributes = span["attributes"]
        assert span["name"] == attributes["dask.task.prefix"]
        assert span["resource"]["dask.worker.id"] == attributes["dask.worker.id"]
        assert attributes["dask.worker.name"] in ("0", "1")
        assert attributes["thread.id"] > 0
        assert root["start_ns"] <= span["start_ns"] <= span["end_ns"] <= root["end_ns"]
    instances = {s["resource"]["service.instance.id"] for s in tasks}
    assert len(instances) == 2 and root["resource"]["service.instance.id"] not in instances
    (total,) = [s for s in tasks if s["attributes"]["dask.task.key"] == "total"]
    assert total["attributes"]["dask.task.dependency_count"] == 20
    assert total["attributes"]["dask.task.type"] == "int"
    assert total["attributes"]["code.function.name"] == "sum"
    # The handle's counters include the workers' processes, which exported the task spans.
    stats = json.loads(app.value("STATS"))
    assert stats["worker_processes"] == 2
    assert stats["spans_exported"] >= 22 and stats["spans_undelivered"] == 0


def test_task_metrics_and_readings_come_from_every_worker(receiver):
    app = run_app("--flush", env=env_for(receiver))
    workers = set(app.value("WORKERS").split())
    trace_of(receiver, expect_tasks=21)

    def points(name: str) -> list[dict]:
        return [p for p in receiver.metrics() if p["name"] == name]

    def all_in(r: OtlpReceiver) -> bool:
        durations = [p for p in r.metrics() if p["name"] == "dask.task.duration"
                     and p["attributes"].get("dask.scheduler") == "distributed"]
        per_worker = {}
        for point in durations:
            key = (point["resource"]["dask.worker.id"], point["attributes"]["dask.task.prefix"])
            per_worker[key] = max(per_worker.get(key, 0), point["count"])
        return sum(per_worker.values()) == 21

    assert receiver.wait_for(all_in, timeout_s=30)
    readers = {p["resource"].get("dask.worker.id") for p in points("process.cpu.utilization")}
    assert workers <= readers
    assert {p["attributes"]["dask.task.state"] for p in points("dask.scheduler.tasks")} >= {"memory"}
    assert max(p["value"] for p in points("dask.scheduler.workers")) == 2
    states = {(p["attributes"]["dask.worker.id"], p["attributes"]["dask.memory.state"])
              for p in points("dask.worker.memory.usage")}
    assert {(w, s) for w in workers for s in ("managed", "unmanaged", "spilled")} <= states
    assert {p["attributes"]["dask.worker.id"] for p in points("dask.worker.memory.limit")} == workers

    # Each worker reports its own delivery: the spans it exported (and none undelivered).
    def delivered(r: OtlpReceiver) -> bool:
        exported = {p["resource"].get("dask.worker.id") for p in r.metrics()
                    if p["name"] == "otel.sdk.exporter.span.exported" and not p["attributes"] and p["value"] > 0}
        return workers <= exported

    assert receiver.wait_for(delivered, timeout_s=30)
    assert not [p for p in points("otel.sdk.exporter.span.exported")
                if p["attributes"].get("error.type") and p["value"] > 0]


def test_failed_task_carries_the_workers_exception(receiver):
    app = run_app("--workload", "fail", "--flush", env=env_for(receiver))
    assert app.value("FAILED").startswith("ValueError bad input 2")
    root, spans = trace_of(receiver, expect_tasks=2)
    (boom,) = [s for s in task_spans(spans, root) if s["name"] == "boom"]
    assert boom["status_code"] == ERROR
    assert boom["attributes"]["error.type"] == "ValueError"
    (event,) = [e for e in boom["events"] if e["name"] == "exception"]
    assert event["attributes"]["exception.type"] == "ValueError"
    assert event["attributes"]["exception.message"] == "bad input 2"
    # The worker's stack as distributed gave it, then the exception. Its frames name file, line
    # and function; whether a source line follows is up to how the function was pickled (by
    # value, cloudpickle may name its file "<dynamic-code>", whose source no one can read).
    stack = event["attributes"]["exception.stacktrace"]
    frames = re.findall(r'^  File "[^"]+", line (\d+), in (\w+)$', stack, flags=re.MULTILINE)
    assert frames and frames[-1] == (str(line_of(APP, 'raise ValueError(f"bad input {x}")')), "boom"), stack
    assert stack.endswith("\nValueError: bad input 2"), stack
    assert root["status_code"] == ERROR and root["attributes"]["error.type"] == "ValueError"


def test_transfer_between_workers_is_a_phase_with_source_and_bytes(receiver):
    app = run_app("--workload", "transfer", "--flush", env=env_for(receiver))
    assert app.value("RESULT") == str(2_000_000 * 3)
    workers = app.value("WORKERS").split()
    root, spans = trace_of(receiver, expect_tasks=1, containing="total-ab")
    (summed,) = [s for s in task_spans(spans, root) if s["attributes"]["dask.task.key"] == "total-ab"]
    assert summed["attributes"]["dask.worker.id"] == workers[1]
    (transfer,) = [s for s in spans if s["name"] == "transfer" and s["parent_span_id"] == summed["span_id"]]
    assert transfer["attributes"]["dask.transfer.source"] == workers[0]
    assert transfer["attributes"]["dask.transfer.bytes"] == 2_000_000
    assert transfer["end_ns"] <= summed["start_ns"] + 50_000_000


def test_spilling_is_counted_in_full_and_shows_on_tasks(receiver):
    app = run_app("--workload", "spill", "--memory-limit", "1GB", "--flush", env=env_for(receiver))
    assert app.value("RESULT") == str(4_000_000 * sum(range(20)))
    root, spans = trace_of(receiver, expect_tasks=21)

    def spilled(r: OtlpReceiver, direction: str) -> float:
        latest: dict[str, float] = {}
        for point in r.metrics():
            if point["name"] == "dask.worker.spill.io" and point["attributes"]["dask.spill.direction"] == direction:
                worker = point["attributes"]["dask.worker.id"]
                latest[worker] = max(latest.get(worker, 0.0), point["value"])
        return sum(latest.values())

    # Most of the 20 blocks of 4 MB went to disk, and the final sum read them back.
    assert receiver.wait_for(lambda r: spilled(r, "write") >= 40e6 and spilled(r, "read") >= 40e6, timeout_s=30)
    by_id = {s["span_id"]: s for s in spans}
    # Per task, distributed times a spill only above 5 ms: reading back 40+ MB for the sum is.
    assert any(s["name"] == "disk-read" for s in spans), sorted({s["name"] for s in spans})
    for span in spans:
        if span["name"] in ("disk-write", "disk-read"):
            task = by_id[span["parent_span_id"]]
            assert task["parent_span_id"] == root["span_id"]
            assert span["attributes"]["dask.task.key"] == task["attributes"]["dask.task.key"]


def test_persist_is_one_trace_ended_when_its_futures_finish(receiver):
    app = run_app("--workload", "persist", "--flush", env=env_for(receiver))
    assert app.value("RESULT") == "3"

    def persisted(r: OtlpReceiver) -> bool:
        return any(s["name"] == "add" for s in r.spans())

    assert receiver.wait_for(persisted, timeout_s=30)
    (add,) = [s for s in receiver.spans() if s["name"] == "add"]
    (root,) = [s for s in receiver.spans() if s["span_id"] == add["parent_span_id"]]
    assert root["name"] == "dask.compute" and root["attributes"]["dask.graph.tasks"] == 1
    assert root["end_ns"] >= add["end_ns"]


@pytest.mark.slow
def test_a_killed_worker_appears_in_the_trace(receiver):
    app = run_app("--workload", "kill", "--flush", env=env_for(receiver))
    assert app.value("FAILED").startswith("KilledWorker")

    def ended(r: OtlpReceiver) -> bool:
        return any(s["name"] == "dask.compute" for s in r.spans())

    assert receiver.wait_for(ended, timeout_s=30)
    (root,) = [s for s in receiver.spans() if s["name"] == "dask.compute"]
    assert root["status_code"] == ERROR
    assert root["attributes"]["error.type"] == "distributed.scheduler.KilledWorker"
    lost = [e for e in root["events"] if e["name"] == "dask.worker.lost"]
    assert lost and lost[0]["attributes"]["dask.worker.id"] in app.value("WORKERS").split()


def test_span_budget_is_shared_between_workers_and_every_task_is_counted(receiver):
    run_app("--workload", "many", "--flush", env=env_for(receiver, OTEL_GRAPH_MAX_TASK_SPANS="40"))

    def counted(r: OtlpReceiver) -> bool:
        roots = [s for s in r.spans() if s["name"] == "dask.compute"]
        if not roots:
            return False
        children = [s for s in r.spans() if s["parent_span_id"] == roots[0]["span_id"]]
        return sum(s["attributes"].get("dask.task.count", 1) for s in children) >= 200

    assert receiver.wait_for(counted, timeout_s=30)
    (root,) = [s for s in receiver.spans() if s["name"] == "dask.compute"]
    children = task_spans(receiver.spans(), root)
    assert (sum(s["attributes"].get("dask.task.count", 1) for s in children)
            == root["attributes"]["dask.graph.tasks"] == 200)
    plain = [s for s in children if "dask.task.count" not in s["attributes"]]
    per_worker: dict[str, int] = {}
    for span in plain:
        per_worker[span["attributes"]["dask.worker.id"]] = per_worker.get(span["attributes"]["dask.worker.id"], 0) + 1
    # Each of the 2 workers may spend 20: 40 in all, however the tasks were spread.
    assert 0 < len(plain) <= 40 and max(per_worker.values()) <= 20, per_worker


def test_a_retried_task_is_marked(receiver):
    app = run_app("--workload", "retry", "--flush", env=env_for(receiver))
    assert app.value("RESULT") == "7"
    root, spans = trace_of(receiver, expect_tasks=2)
    runs = sorted(task_spans(spans, root), key=lambda s: s["start_ns"])
    assert [s["status_code"] == ERROR for s in runs] == [True, False]
    assert all(s["attributes"]["dask.task.retries"] == 1 for s in runs)
    assert "dask.task.attempt" not in runs[0]["attributes"] and runs[1]["attributes"]["dask.task.attempt"] == 2


def test_map_is_one_trace_of_its_tasks(receiver):
    app = run_app("--workload", "map", "--flush", env=env_for(receiver))
    assert app.value("RESULT") == str(sum(range(1, 11)))
    root, spans = trace_of(receiver, expect_tasks=10)
    assert root["attributes"]["dask.graph.tasks"] == 10
    assert sorted(s["attributes"]["dask.task.key"] for s in task_spans(spans, root)) == sorted(
        f"inc-{i}" for i in range(10))


def test_a_compute_started_inside_a_task_on_a_worker_process_nests_in_the_trace(receiver):
    app = run_app("--workload", "nested", "--flush", env=env_for(receiver))
    assert app.value("RESULT") == "6"
    _assert_nested(receiver)


def _assert_nested(receiver: OtlpReceiver) -> None:
    """The ``nested`` workload's three inner tasks under one compute, a child of the outer
    task's span (current while it ran), all in the outer task's trace."""

    def both(r: OtlpReceiver) -> bool:
        return len([s for s in r.spans() if s["name"] == "inner"]) == 3 and any(
            s["name"] == "outer" for s in r.spans())

    assert receiver.wait_for(both, timeout_s=30)
    spans = receiver.spans()
    by_id = {s["span_id"]: s for s in spans}
    (outer,) = [s for s in spans if s["name"] == "outer"]
    outer_compute = by_id[outer["parent_span_id"]]
    inner_computes = {by_id[s["parent_span_id"]]["span_id"] for s in spans if s["name"] == "inner"}
    (inner_compute_id,) = inner_computes
    inner_compute = by_id[inner_compute_id]
    assert inner_compute["name"] == outer_compute["name"] == "dask.compute"
    assert inner_compute["parent_span_id"] == outer["span_id"]
    assert {s["trace_id"] for s in spans if s["name"] in ("inner", "outer", "dask.compute")} == {outer["trace_id"]}


@pytest.mark.slow
def test_the_budget_holds_across_a_workers_quiet_spells(receiver):
    # Tasks of 1.2 s: every worker drain (1 s) between two of them brings nothing, and the
    # compute is settled each time; what is left of its budget must carry over.
    run_app("--workload", "slow", "--flush", env=env_for(receiver, OTEL_GRAPH_MAX_TASK_SPANS="2"))
    root, spans = trace_of(receiver, expect_tasks=1)
    children = task_spans(spans, root)
    assert sum(s["attributes"].get("dask.task.count", 1) for s in children) == 6
    assert len([s for s in children if "dask.task.count" not in s["attributes"]]) <= 2
    # ...and the rest fold into one aggregate per worker, not one per quiet spell.
    assert len([s for s in children if "dask.task.count" in s["attributes"]]) <= 2


@pytest.mark.slow
def test_flush_returns_within_its_timeout_when_a_worker_is_paused(receiver):
    app = run_app("--workload", "pause", "--flush-timeout", "3", env=env_for(receiver))
    assert app.value("FLUSHED") == "False"
    # 3 s for the workers, and a margin for a loaded machine; the app has three clients of the
    # cluster, which were asked one after another, each with the whole timeout (9 s).
    assert float(app.value("FLUSH_SECONDS")) < 8
    assert float(app.value("STATS_SECONDS")) < 8


def test_workers_export_while_the_job_runs_without_any_flush(receiver):
    """Spans leave a worker every drain interval, without a flush: a live job is visible, and
    a worker killed outright has delivered all but its last interval (the scheduler's ledger
    counts the rest: test_worker_exits.py)."""
    proc = subprocess.Popen([sys.executable, str(APP), "--hold"], env=env_for(receiver), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().startswith("WORKERS")
        assert proc.stdout.readline().startswith("RESULT")
        assert proc.stdout.readline().startswith("HOLDING")
        # Nobody flushes while the app holds: the workers' own drain interval delivers the spans.
        assert receiver.wait_for(lambda r: sum(1 for s in r.spans() if s["name"] in ("inc", "total")) == 21,
                                 timeout_s=15)
    finally:
        proc.communicate("\n", timeout=60)
    assert proc.returncode == 0


# -- clusters started outside Python ------------------------------------------------------------
@pytest.fixture
def external_cluster(tmp_path):
    """Start ``dask scheduler`` and two ``dask worker`` processes; yields a starter."""
    procs: list[subprocess.Popen] = []
    logs = tmp_path / "logs"
    logs.mkdir()

    def start(*, scheduler_env: dict[str, str], worker_env: dict[str, str], preload: bool = False) -> str:
        scheduler_file = tmp_path / "scheduler.json"
        with open(logs / "scheduler.log", "w") as log:
            scheduler = subprocess.Popen(
                [sys.executable, "-m", "distributed.cli.dask_scheduler", "--scheduler-file", str(scheduler_file),
                 "--host", "127.0.0.1", "--port", "0", "--dashboard-address", ":0",
                 *(["--preload", "otel_graph"] if preload else [])],
                env=scheduler_env, stdout=log, stderr=subprocess.STDOUT)
        procs.append(scheduler)
        address = wait_for_address(scheduler_file, scheduler)
        for i in range(2):
            with open(logs / f"worker-{i}.log", "w") as log:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "distributed.cli.dask_worker", address, "--nthreads", "1",
                     "--name", f"w{i}", "--no-dashboard", "--memory-limit", "1GB",
                     *(["--preload", "otel_graph"] if preload else [])],
                    env=worker_env, stdout=log, stderr=subprocess.STDOUT))
        return address

    start.logs = logs  # type: ignore[attr-defined]
    yield start
    stop_all(procs)


@pytest.mark.slow
def test_workers_without_otel_settings_use_the_clients_and_never_log_credentials(receiver, external_cluster):
    client_env = env_for(receiver, OTEL_EXPORTER_OTLP_HEADERS="authorization=Bearer%20s3cret-token")
    # Every log at its most verbose, so that a leak at debug level shows too.
    bare = {**without_otel(client_env), "DASK_LOGGING__DISTRIBUTED": "debug"}
    address = external_cluster(scheduler_env=bare, worker_env=bare)
    app = run_app("--scheduler", address, "--wait-workers", "2", "--flush", "--debug-logs", env=client_env)
    assert app.value("RESULT") == str(sum(range(1, 21)))
    root, spans = trace_of(receiver, expect_tasks=21)
    tasks = task_spans(spans, root)
    assert {s["attributes"]["dask.worker.name"] for s in tasks} == {"w0", "w1"}
    assert {s["resource"]["service.name"] for s in tasks} == {"cluster-test"}
    # The workers' exports carried the client's header, and nothing printed it.
    worker_instances = {s["resource"]["service.instance.id"] for s in tasks}
    assert len(worker_instances) == 2
    assert all(h.get("authorization") == "Bearer s3cret-token" for h in receiver.headers)
    for log in external_cluster.logs.iterdir():
        assert "s3cret" not in log.read_text(), log.name
    assert "s3cret" not in app.stdout + app.stderr


@pytest.mark.slow
def test_preloaded_cluster_exports_with_its_own_settings(receiver, external_cluster):
    own = env_for(receiver, OTEL_SERVICE_NAME="hpc-workers")
    address = external_cluster(scheduler_env=own, worker_env=own, preload=True)
    app = run_app("--scheduler", address, "--wait-workers", "2", "--flush", env=env_for(receiver))
    assert app.value("RESULT") == str(sum(range(1, 21)))
    root, spans = trace_of(receiver, expect_tasks=21)
    assert root["resource"]["service.name"] == "cluster-test"
    assert {s["resource"]["service.name"] for s in task_spans(spans, root)} == {"hpc-workers"}

    def gauged(r: OtlpReceiver) -> bool:
        return any(p["name"] == "dask.scheduler.workers" and p["resource"].get("service.name") == "hpc-workers"
                   for p in r.metrics())

    assert receiver.wait_for(gauged, timeout_s=30), "the preloaded scheduler publishes its gauges"


@pytest.mark.slow
def test_a_preloaded_worker_traces_the_computes_its_tasks_start(receiver, external_cluster):
    # The client's plugin replaces the preloaded one (the scheduler never knew it, so being
    # idempotent does not apply) and takes over what that one started, the capture for
    # computes started inside tasks included: the preloaded plugin must install it itself.
    own = env_for(receiver, OTEL_SERVICE_NAME="hpc-workers")
    address = external_cluster(scheduler_env=own, worker_env=own, preload=True)
    app = run_app("--scheduler", address, "--wait-workers", "2", "--workload", "nested", "--flush",
                  env=env_for(receiver))
    assert app.value("RESULT") == "6"
    _assert_nested(receiver)
