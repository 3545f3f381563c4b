"""Cluster processes leaving mid-graph, a scheduler replaced, results that cannot be pickled.

What a cluster does to a running job, and what the trace must then say. Every test runs
``tests/apps/worker_exits.py`` as a user's script (a fresh interpreter configured by
``OTEL_*`` variables) against a real OTLP receiver, and asserts only on what arrives
there. The app talks to the test over stdin/stdout (:class:`AppProcess`), so that the
test can act, or wait on the receiver, at a known point of the job. Three things must
hold each time:

* **The computation ends as it would without otel_graph.** Dask reruns what a lost
  worker held; a task returning something unpicklable fails with Dask's own error,
  compared here with the same compute run before instrumenting.
* **The trace says what happened.** A worker removed under a running compute is an event
  on its ``dask.compute`` span (``dask.worker.retired`` when retired gracefully,
  ``dask.worker.lost`` otherwise); a compute that failed or was given up on is ERROR.
* **No task of the result is missing.** Every key of the graph has a task span under
  the compute's root, whichever worker ran it in the end; and a worker that exits
  gracefully or on SIGTERM delivers what it recorded before going. The metric export
  interval is set to 60 s in those tests, so the victim's task metrics can only have
  come from its exit.

A worker killed with SIGKILL cannot deliver anything more: the spans of what it finished
since its last export are gone. The scheduler's ledger (``otel_graph.cluster.ledger``)
counted those runs, and the client makes ``dask.task.recovered`` spans of them: the
compute's spans account for every task. One test kills once what the victim finished
has reached the receiver (nothing to recover, nothing counted twice), another before the
victim could deliver anything at all.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

import pytest

from conftest import subprocess_env
from otlp_receiver import OtlpReceiver
from ports import free_port
from subprocesses import APPS, wait_for_address, without_otel
from test_distributed import env_for, trace_of

pytest.importorskip("distributed")
pytestmark = pytest.mark.slow  # clusters losing processes, each run to its end

APP = APPS / "worker_exits.py"
ERROR = 2  # OTLP StatusCode.STATUS_CODE_ERROR
#: Any single step of a scenario; the whole file runs in well under a minute.
STEP_S = 30.0
HELD_KEYS = {f"inc-{i}" for i in range(10)} | {"hold-0", "hold-1", "total"}


def sum_keys(prefix: str) -> set[str]:
    return {f"{prefix}-{i}" for i in range(20)} | {f"total-{prefix}"}


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as running:
        yield running


class AppProcess:
    """The app as a running process: its labelled stdout lines as they come, stdin to drive it.

    stderr goes to a file, not a pipe: distributed logs a lot, and a full pipe would
    block the app. The app runs in a session of its own, so that a failed test takes
    its cluster's worker processes down with it.
    """

    def __init__(self, *args: str, env: dict[str, str], log: Path, step_s: float = STEP_S) -> None:
        self._log = log
        self._step_s = step_s
        self._stderr = open(log, "w")
        self.proc = subprocess.Popen([sys.executable, str(APP), *args], env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._stderr, text=True,
                                     start_new_session=True)
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def __enter__(self) -> AppProcess:
        return self

    def __exit__(self, kind: type | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._stderr.close()

    @property
    def stderr(self) -> str:
        self._stderr.flush()
        return self._log.read_text()

    def _next(self, waiting_for: str) -> str | None:
        try:
            return self._queue.get(timeout=self._step_s)
        except queue.Empty:
            raise AssertionError(f"no {waiting_for} within {self._step_s} s; stdout: {self.lines}; "
                                 f"stderr: {self.stderr[-3000:]}") from None

    def expect(self, label: str) -> str:
        """Wait (at most STEP_S) for the line ``LABEL value``; return the value."""
        while True:
            line = self._next(label)
            if line is None:
                raise AssertionError(f"the app ended before {label}; stdout: {self.lines}; "
                                     f"stderr: {self.stderr[-3000:]}")
            self.lines.append(line)
            if line == label or line.startswith(label + " "):
                return line[len(label) + 1:]

    def value(self, label: str) -> str:
        """The value of a line already read (the last one with that label)."""
        for line in reversed(self.lines):
            if line.startswith(label + " "):
                return line[len(label) + 1:]
        raise AssertionError(f"{label} not printed; stdout: {self.lines}")

    def send(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def finish(self) -> None:
        """Read to the end and wait for a clean exit: nothing may hang."""
        while (line := self._next("end of the app")) is not None:
            self.lines.append(line)
        assert self.proc.wait(timeout=self._step_s) == 0, self.stderr[-4000:]

    def assert_no_trace_of_otel_graph(self) -> None:
        """Nothing of ours reached the user: no warning of ours, no traceback through our code."""
        text = self.stderr
        assert "otel_graph:" not in text, text[-4000:]
        assert "/otel_graph/" not in text, text[-4000:]


def roots(receiver: OtlpReceiver) -> list[dict]:
    return [s for s in receiver.spans() if s["name"] == "dask.compute"]


def accounted_spans(receiver: OtlpReceiver, root: dict) -> list[dict]:
    """The spans under a compute that stand for tasks: task spans, aggregates, recovered spans."""
    return [s for s in receiver.spans() if s["parent_span_id"] == root["span_id"]
            and ("dask.task.key" in s["attributes"] or "dask.task.count" in s["attributes"])]


def tasks_in(spans: list[dict]) -> int:
    """Tasks those spans stand for: one a task span, ``dask.task.count`` an aggregate."""
    return sum(s["attributes"].get("dask.task.count", 1) for s in spans)


def recovered_spans(receiver: OtlpReceiver, root: dict) -> list[dict]:
    return [s for s in accounted_spans(receiver, root) if s["attributes"].get("dask.task.recovered")]


def recovered_count(receiver: OtlpReceiver) -> int:
    """Tasks in the recovered spans of every compute."""
    return sum(tasks_in(recovered_spans(receiver, root)) for root in roots(receiver))


def assert_no_traceback_of_ours(stderr: str) -> None:
    # Our warnings are expected here (the collector refused); a traceback through our code is not.
    assert "Traceback" not in stderr or "/otel_graph/" not in stderr, stderr[-4000:]


def task_spans(spans: list[dict], root: dict) -> list[dict]:
    """The task spans under a compute (not its ``dask.compute.progress`` spans)."""
    return [s for s in spans if s["parent_span_id"] == root["span_id"] and "dask.task.key" in s["attributes"]]


def assert_one_trace(receiver: OtlpReceiver, root: dict, keys: set[str]) -> None:
    """Every span of these keys, from any process, hangs under ``root``: a task span, or a
    phase (transfer, spill) of one; none went to another trace or lost its parent."""
    spans = [s for s in receiver.spans() if s["attributes"].get("dask.task.key") in keys]
    tasks = {s["span_id"] for s in task_spans(spans, root)}
    orphans = [(s["name"], s["attributes"]["dask.task.key"]) for s in spans
               if s["trace_id"] != root["trace_id"] or s["parent_span_id"] not in tasks | {root["span_id"]}]
    assert not orphans, orphans


def keys_under(receiver: OtlpReceiver, root: dict) -> list[str]:
    return [s["attributes"]["dask.task.key"] for s in task_spans(receiver.spans(), root)]


def keys_from(receiver: OtlpReceiver, worker: str) -> set[str]:
    return {s["attributes"]["dask.task.key"] for s in receiver.spans()
            if s["resource"].get("dask.worker.id") == worker and "dask.task.key" in s["attributes"]}


def task_runs_counted(receiver: OtlpReceiver, *, recovered: bool | None = None) -> int:
    """Runs in every process's ``dask.task.duration`` histograms (cumulative: each series' latest
    count); with ``recovered``, only those a client recorded for a lost worker, or none of them."""
    latest: dict[tuple, int] = {}
    for point in receiver.metrics():
        if point["name"] != "dask.task.duration":
            continue
        if recovered is not None and bool(point["attributes"].get("dask.task.recovered")) != recovered:
            continue
        key = (point["resource"].get("service.instance.id"), tuple(sorted(point["attributes"].items())))
        latest[key] = max(latest.get(key, 0), point["count"])
    return sum(latest.values())


def runs_delivered_by(receiver: OtlpReceiver, root: dict, worker: str) -> int:
    """Task runs under a compute that a worker delivered spans of (aggregates count their tasks)."""
    return tasks_in([s for s in accounted_spans(receiver, root) if s["resource"].get("dask.worker.id") == worker])


def tasks_counted_by(receiver: OtlpReceiver, worker: str) -> int:
    """Tasks in the ``dask.task.duration`` histograms a worker exported (cumulative: the latest count)."""
    latest: dict[tuple, int] = {}
    for point in receiver.metrics():
        if point["name"] == "dask.task.duration" and point["resource"].get("dask.worker.id") == worker:
            key = tuple(sorted(point["attributes"].items()))
            latest[key] = max(latest.get(key, 0), point["count"])
    return sum(latest.values())


# -- 1. a worker leaves mid-graph ---------------------------------------------------------------
@pytest.mark.parametrize("how", ["retire", "term", "kill"])
def test_a_worker_leaving_mid_graph_is_in_the_trace_and_every_task_is_traced(receiver, tmp_path, how):
    env = env_for(receiver, OTEL_METRIC_EXPORT_INTERVAL="60000")
    with AppProcess("exit", "--how", how, env=env, log=tmp_path / "app.log") as app:
        app.expect("READY")
        victim, victim_keys = app.value("VICTIM"), set(app.value("VICTIM_KEYS").split())
        # The victim has results of its own, so its exit takes something with it.
        assert victim_keys and victim_keys <= HELD_KEYS, victim_keys
        if how == "kill":
            assert receiver.wait_for(lambda r: victim_keys <= keys_from(r, victim), timeout_s=STEP_S)
        app.send("go")
        app.finish()
        assert app.value("RESULT") == "110"
        assert app.value("FLUSHED") == "True"
        app.assert_no_trace_of_otel_graph()

    def complete(r: OtlpReceiver) -> bool:
        return any(HELD_KEYS <= set(keys_under(r, root)) for root in roots(r))

    assert receiver.wait_for(complete, timeout_s=STEP_S), [
        ("untraced", sorted(HELD_KEYS - set(keys_under(receiver, root))), "victim ran", sorted(victim_keys))
        for root in roots(receiver)]
    (root,) = roots(receiver)
    assert root["status_code"] != ERROR, root["status_message"]
    assert root["attributes"]["dask.graph.tasks"] == len(HELD_KEYS)
    removals = [(e["name"], e["attributes"]["dask.worker.id"]) for e in root["events"]
                if e["name"] in ("dask.worker.lost", "dask.worker.retired")]
    expected = "dask.worker.retired" if how == "retire" else "dask.worker.lost"
    assert removals == [(expected, victim)], root["events"]
    tasks = task_spans(receiver.spans(), root)
    assert all(s["status_code"] != ERROR for s in tasks)
    assert HELD_KEYS == {s["attributes"]["dask.task.key"] for s in tasks}
    assert_one_trace(receiver, root, HELD_KEYS)
    if how in ("term", "kill"):
        # What only the victim held (the incs that its own hold-0 needed) was computed again
        # elsewhere, and that run is traced too. (Retiring copies the victim's results instead.)
        ran_by: dict[str, set[str]] = {}
        for span in tasks:
            ran_by.setdefault(span["attributes"]["dask.task.key"], set()).add(span["attributes"]["dask.worker.id"])
        lost = victim_keys & {f"inc-{i}" for i in range(5)}
        assert all(ran_by[key] - {victim} for key in lost), (lost, ran_by)
    # Whatever way the victim left, what it delivered was reported first: nothing counted twice.
    assert recovered_spans(receiver, root) == [], [s["attributes"] for s in recovered_spans(receiver, root)]
    assert not any("dask.task.recovered" in e["attributes"] for e in root["events"])
    if how in ("retire", "term"):
        # Delivered by the victim on its way out: the spans of what it finished last, and its
        # task metrics, which with a 60 s export interval only an exit flush can have sent.
        # They count the same runs. That may be one more than VICTIM_KEYS: a leaving worker
        # lets its running hold-0 finish, and when the release comes before its close has
        # reached otel_graph, that run is traced there too (as well as its rerun elsewhere).
        assert receiver.wait_for(lambda r: victim_keys <= keys_from(r, victim), timeout_s=STEP_S)
        assert receiver.wait_for(lambda r: tasks_counted_by(r, victim) == runs_delivered_by(r, root, victim)
                                 >= len(victim_keys), timeout_s=STEP_S), \
            (tasks_counted_by(receiver, victim), runs_delivered_by(receiver, root, victim), sorted(victim_keys))


def leave_while_refused(receiver: OtlpReceiver, tmp_path: Path, *how: str, env: dict[str, str]
                        ) -> tuple[str, str, set[str]]:
    """The exit scenario with the collector refusing every request until the victim is gone:
    the app's stderr, the victim, and what it had finished."""
    receiver.fail = True
    with AppProcess("exit", *how, env=env, log=tmp_path / "app.log") as app:
        app.expect("READY")
        victim, victim_keys = app.value("VICTIM"), set(app.value("VICTIM_KEYS").split())
        assert victim_keys and victim_keys <= HELD_KEYS, victim_keys
        app.send("go")
        app.expect("GONE")
        receiver.fail = False
        app.finish()
        assert app.value("RESULT") == "110"
        assert app.value("FLUSHED") == "True"
        return app.stderr, victim, victim_keys


@pytest.mark.parametrize("budget", [None, 4])
def test_a_worker_killed_before_it_delivered_anything_is_accounted_for(receiver, tmp_path, budget):
    """The collector refuses everything until the victim is gone: none of its spans left it.

    Its runs whose results had moved on are not rerun, so only the scheduler's count
    stands for them: recovered spans, per prefix, under the compute, that with the task
    spans account for every task of the graph. With a budget of 4 task spans (2 a worker),
    most runs wait in aggregates a worker emits only when the compute settles there.
    """
    extra = {} if budget is None else {"OTEL_GRAPH_MAX_TASK_SPANS": str(budget)}
    env = env_for(receiver, OTEL_METRIC_EXPORT_INTERVAL="60000", **extra)
    stderr, victim, victim_keys = leave_while_refused(receiver, tmp_path, "--how", "kill", "--now", env=env)
    assert_no_traceback_of_ours(stderr)
    assert not keys_from(receiver, victim), "the victim delivered something: the test proves nothing"
    assert receiver.wait_for(lambda r: recovered_count(r) >= len(victim_keys), timeout_s=STEP_S), \
        (recovered_count(receiver), sorted(victim_keys))
    (root,) = roots(receiver)
    recovered = recovered_spans(receiver, root)
    # Exactly what the victim finished (its hold task never did), by prefix, on its name.
    by_prefix: dict[str, int] = {}
    for key in victim_keys:
        by_prefix[key.split("-")[0]] = by_prefix.get(key.split("-")[0], 0) + 1
    assert {s["attributes"]["dask.task.prefix"]: s["attributes"]["dask.task.count"] for s in recovered} == by_prefix
    assert {s["attributes"]["dask.worker.id"] for s in recovered} == {victim}
    # Its task metrics (export interval 60 s) never left it either: the client recorded them.
    assert receiver.wait_for(lambda r: task_runs_counted(r, recovered=True) == len(victim_keys), timeout_s=STEP_S), \
        task_runs_counted(receiver, recovered=True)
    # The compute span's event for the lost worker says how many of its tasks went with it.
    (lost,) = [e["attributes"] for e in root["events"] if e["name"] == "dask.worker.lost"]
    assert (lost["dask.worker.id"], lost["dask.task.recovered"]) == (victim, len(victim_keys))
    assert all(s["attributes"]["dask.task.duration.sum"] >= 0 for s in recovered)
    assert all(s["start_ns"] <= s["end_ns"] for s in recovered)
    # Every task is accounted for: traced or aggregated where it ran last, or counted with
    # the victim (and a task rerun after the kill, twice).
    assert tasks_in(accounted_spans(receiver, root)) >= len(HELD_KEYS)
    if budget is None:
        traced = set(keys_under(receiver, root))
        assert HELD_KEYS - traced <= victim_keys, (sorted(HELD_KEYS - traced), sorted(victim_keys))


def test_a_worker_closing_with_its_spans_undelivered_says_so_and_nothing_is_recovered(receiver, tmp_path):
    """A worker that closes gracefully while the collector refuses: its last report says it is
    closing, so what it could not deliver is its own to deliver on its way out (as here, the
    collector being back by then) or to count as undelivered, and the scheduler's ledger
    recovers none of it: nothing is counted twice."""
    env = env_for(receiver, OTEL_METRIC_EXPORT_INTERVAL="60000")
    stderr, victim, victim_keys = leave_while_refused(receiver, tmp_path, "--how", "close", env=env)
    # Delivered by the victim's exit once the collector took requests again, or counted.
    assert victim_keys <= keys_from(receiver, victim) or "were not delivered by exporter otlp" in stderr
    assert receiver.wait_for(lambda r: any(HELD_KEYS - {"hold-0"} <= set(keys_under(r, root)) for root in roots(r)),
                             timeout_s=STEP_S)
    (root,) = roots(receiver)
    assert recovered_spans(receiver, root) == [], [s["attributes"] for s in recovered_spans(receiver, root)]


def test_a_worker_killed_mid_graph_leaves_a_trace_that_counts_every_run(receiver, tmp_path):
    """3,001 tasks on three workers, one SIGKILLed a third of the way: the compute's task
    spans, aggregates and recovered spans count exactly the runs the scheduler accepted
    (the victim's, those it took with it included, and every rerun).

    distributed itself, without otel_graph too, sometimes stalls ~25 s after such a kill
    before the compute goes on (1 run in 10 here): hence the longer wait for each line.
    """
    with AppProcess("accounted", env=env_for(receiver, OTEL_METRIC_EXPORT_INTERVAL="60000"),
                    log=tmp_path / "app.log", step_s=90.0) as app:
        app.finish()
        stderr = app.stderr
    assert app.value("RESULT") == str(sum(range(1500)))
    assert app.value("FLUSHED") == "True"
    assert_no_traceback_of_ours(stderr)
    runs, victim = int(app.value("RUNS")), app.value("VICTIM")

    def counted(r: OtlpReceiver) -> tuple[int, int]:
        (root,) = roots(r) or [None]
        if root is None:
            return 0, 0
        recovered = recovered_spans(r, root)
        assert {s["attributes"]["dask.worker.id"] for s in recovered} <= {victim}
        return tasks_in(accounted_spans(r, root)), tasks_in(recovered)

    assert receiver.wait_for(lambda r: counted(r)[0] >= runs, timeout_s=STEP_S), (counted(receiver), runs)
    total, recovered = counted(receiver)
    assert total == runs and runs > 3001, (total, runs)
    # And the task metrics of every process, the lost worker's runs recorded by the client.
    assert receiver.wait_for(lambda r: task_runs_counted(r) == runs, timeout_s=STEP_S), (
        task_runs_counted(receiver), runs)
    assert task_runs_counted(receiver, recovered=True) > 0
    (root,) = roots(receiver)
    (lost,) = [e["attributes"] for e in root["events"] if e["name"] == "dask.worker.lost"]
    assert lost["dask.task.recovered"] == recovered
    # Past its share of the budget, the victim held its runs in aggregates until the compute
    # would settle: only the ledger's count can stand for them.
    assert recovered > 0


# -- 2. restarts ----------------------------------------------------------------------------------
def assert_traced_completely(receiver: OtlpReceiver, prefix: str) -> tuple[dict, list[dict]]:
    """The compute of ``sum_graph(prefix)``: one trace, one span per task, no error."""
    root, spans = trace_of(receiver, expect_tasks=21, containing=f"total-{prefix}")
    tasks = task_spans(spans, root)
    assert sorted(s["attributes"]["dask.task.key"] for s in tasks) == sorted(sum_keys(prefix))
    assert_one_trace(receiver, root, sum_keys(prefix))
    assert root["status_code"] != ERROR, root["status_message"]
    assert root["attributes"]["dask.graph.tasks"] == 21
    return root, tasks


def test_client_restart_between_two_computes(receiver, tmp_path):
    with AppProcess("restart", env=env_for(receiver), log=tmp_path / "app.log") as app:
        app.finish()
        app.assert_no_trace_of_otel_graph()
    workers_before, workers_after = (line.split()[1:] for line in app.lines if line.startswith("WORKERS "))
    assert app.value("RESULT_BEFORE") == app.value("RESULT_AFTER") == "210"
    assert app.value("FLUSHED") == "True"
    root_before, before = assert_traced_completely(receiver, "before")
    root_after, after = assert_traced_completely(receiver, "after")
    # The restart took the old workers down after they delivered: nothing was recovered.
    assert recovered_spans(receiver, root_before) == recovered_spans(receiver, root_after) == []
    # The future it cancelled, which the user still held, ends its compute as cancelled
    # (a restart clears the client's references too: it read as a release, a success).
    assert app.value("HELD") == "cancelled"
    (held,) = [r for r in roots(receiver) if r not in (root_before, root_after)]
    assert held["status_code"] == 2, held
    assert [e["attributes"]["dask.task.key"] for e in held["events"] if e["name"] == "dask.future.cancelled"] == \
        ["held-0"]
    # The second compute ran on the new worker processes, which got the plugin from the scheduler.
    assert set(workers_before).isdisjoint(workers_after)
    assert {s["attributes"]["dask.worker.id"] for s in before} <= set(workers_before)
    assert {s["attributes"]["dask.worker.id"] for s in after} <= set(workers_after)


class CommandLineCluster:
    """``dask scheduler`` and ``dask worker`` processes, with no OTEL_* settings of their own.

    The scheduler can be killed and started again on the same address (distributed's
    listeners reuse the address at once); distributed's workers exit when they lose
    their scheduler, so new ones are started, as a supervisor would.
    """

    def __init__(self, directory: Path, env: dict[str, str], *, preload: bool = False) -> None:
        self._directory = directory
        self._env = env
        self._preload = ["--preload", "otel_graph"] if preload else []
        self._procs: list[subprocess.Popen] = []
        self.scheduler: subprocess.Popen | None = None
        self.port = free_port()  # it starts again on its address: a port no other test is given

    def _spawn(self, args: list[str], log: str) -> subprocess.Popen:
        with open(self._directory / log, "w") as out:
            proc = subprocess.Popen([sys.executable, "-m", *args], env=self._env, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        self._procs.append(proc)
        return proc

    def start_scheduler(self) -> str:
        scheduler_file = self._directory / f"scheduler-{len(self._procs)}.json"
        self.scheduler = self._spawn(
            ["distributed.cli.dask_scheduler", "--scheduler-file", str(scheduler_file), "--host", "127.0.0.1",
             "--port", str(self.port), "--dashboard-address", ":0", *self._preload],
            f"scheduler-{len(self._procs)}.log")
        address = wait_for_address(scheduler_file, self.scheduler)
        self.port = int(address.rsplit(":", 1)[1])
        return address

    def start_workers(self, address: str, count: int = 2) -> None:
        for i in range(count):
            self._spawn(["distributed.cli.dask_worker", address, "--nthreads", "1", "--name", f"w{i}",
                         "--no-dashboard", "--memory-limit", "1GB", *self._preload], f"worker-{len(self._procs)}.log")

    def kill_scheduler(self) -> None:
        self.scheduler.kill()
        self.scheduler.wait(timeout=STEP_S)

    def close(self) -> None:
        for proc in reversed(self._procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self._procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # with the nanny's worker process
                proc.wait()


def test_a_preloaded_worker_killed_before_it_delivered_is_accounted_for(receiver, tmp_path):
    """The HPC way: ``dask scheduler|worker --preload otel_graph``, each process with its own
    OTEL_* settings, and an instrumented client. A worker SIGKILLed (as by the OOM killer)
    before the collector took anything of it: the preloaded scheduler's ledger counted its
    runs, and the client recovers them."""
    env = env_for(receiver, OTEL_METRIC_EXPORT_INTERVAL="60000")
    cluster = CommandLineCluster(tmp_path, env, preload=True)
    try:
        address = cluster.start_scheduler()
        cluster.start_workers(address)
        stderr, victim, victim_keys = leave_while_refused(receiver, tmp_path, "--how", "kill", "--now",
                                                          "--scheduler", address, env=env)
    finally:
        cluster.close()
    assert_no_traceback_of_ours(stderr)
    assert not keys_from(receiver, victim)
    assert receiver.wait_for(lambda r: recovered_count(r) == len(victim_keys), timeout_s=STEP_S), \
        (recovered_count(receiver), sorted(victim_keys))


def test_a_scheduler_killed_and_started_again_on_its_address(receiver, tmp_path):
    client_env = env_for(receiver)
    cluster = CommandLineCluster(tmp_path, without_otel(client_env))
    try:
        address = cluster.start_scheduler()
        cluster.start_workers(address)
        with AppProcess("reconnect", "--scheduler", address, env=client_env, log=tmp_path / "app.log") as app:
            app.expect("READY")
            assert_traced_completely(receiver, "before")
            cluster.kill_scheduler()
            assert cluster.start_scheduler() == address
            cluster.start_workers(address)
            app.send("go")
            app.finish()
            app.assert_no_trace_of_otel_graph()
    finally:
        cluster.close()
    assert app.value("RESULT_BEFORE") == app.value("RESULT_AFTER") == "210"
    assert app.value("FLUSHED") == "True"
    workers_before, workers_after = (line.split()[1:] for line in app.lines if line.startswith("WORKERS "))
    # The new scheduler knows nothing of otel_graph: the client must put the plugins on it again.
    _, after = assert_traced_completely(receiver, "after")
    assert {s["attributes"]["dask.worker.id"] for s in after} <= set(workers_after)
    assert set(workers_before).isdisjoint(workers_after)


# -- 3. results that cannot be pickled --------------------------------------------------------
def failed_roots(receiver: OtlpReceiver) -> list[dict]:
    return [r for r in roots(receiver) if r["status_code"] == ERROR]


def test_an_unpicklable_result_on_the_processes_scheduler(receiver, tmp_path):
    with AppProcess("unpicklable", "--scheduler", "processes", env=env_for(receiver),
                    log=tmp_path / "app.log") as app:
        app.finish()
        app.assert_no_trace_of_otel_graph()
    # Dask's own error, the same with otel_graph as without.
    assert app.value("TRACED_ERROR") == app.value("PLAIN_ERROR") == "TypeError: cannot pickle '_thread.lock' object"
    assert app.value("AFTER") == "210"
    assert app.value("FLUSHED") == "True"
    assert_traced_completely(receiver, "after")
    (failed,) = failed_roots(receiver)
    assert failed["attributes"]["error.type"] == "TypeError"
    assert failed["attributes"]["dask.scheduler"] == "processes"
    tasks = {s["attributes"]["dask.task.key"]: s for s in task_spans(receiver.spans(), failed)}
    # The task that made the lock is the one that failed (its result could not leave the
    # pool's process); Dask stops at that error, so the incs reported are those that ran.
    assert tasks["lock-0"]["status_code"] == ERROR
    assert tasks["lock-0"]["attributes"]["error.type"] == "TypeError"
    assert "inc-0" in tasks
    assert all(span["status_code"] != ERROR for key, span in tasks.items() if key != "lock-0")


def test_an_unpicklable_result_on_distributed(receiver, tmp_path):
    with AppProcess("unpicklable", "--scheduler", "distributed", env=env_for(receiver),
                    log=tmp_path / "app.log") as app:
        app.finish()
        app.assert_no_trace_of_otel_graph()
    workers = app.value("WORKERS").split()
    # Moving the lock to the client fails with distributed's own error, as without otel_graph.
    assert app.value("TRACED_ERROR") == app.value("PLAIN_ERROR")
    assert app.value("TRACED_ERROR").startswith("TypeError: Could not serialize object of type lock")
    assert app.value("AFTER") == app.value("LAST") == "210"
    assert app.value("FLUSHED") == "True"
    assert_traced_completely(receiver, "after")
    _, last = assert_traced_completely(receiver, "last")
    assert {s["attributes"]["dask.worker.id"] for s in last} == {workers[0]}

    def settled(r: OtlpReceiver) -> bool:
        return len(failed_roots(r)) == 2 and any("lock-1" in keys_under(r, root) for root in roots(r))

    assert receiver.wait_for(settled, timeout_s=STEP_S), [(s["status_code"], s["events"]) for s in roots(receiver)]
    gathered = next(r for r in failed_roots(receiver) if "lock-0" in keys_under(receiver, r))
    assert gathered["attributes"]["error.type"] == "TypeError"
    assert gathered["attributes"]["dask.graph.tasks"] == 5
    # On the worker the task itself succeeded (it made a lock); the error came when it had to leave.
    tasks = {s["attributes"]["dask.task.key"]: s for s in task_spans(receiver.spans(), gathered)}
    assert set(tasks) == {"lock-0", "inc-0", "inc-1", "inc-2", "inc-3"}
    assert tasks["lock-0"]["status_code"] != ERROR and tasks["lock-0"]["attributes"]["dask.task.type"] == "lock"
    # The lock needed on the other worker: distributed retries that transfer for ever, the
    # user gives up and cancels, and the compute that waited on it ends as an error.
    (moved,) = [r for r in failed_roots(receiver) if r["span_id"] != gathered["span_id"]]
    assert not keys_under(receiver, moved)
    if app.value("TRANSFER") == "TimeoutError":
        assert [e["attributes"]["dask.task.key"] for e in moved["events"]
                if e["name"] == "dask.future.cancelled"] == ["use-1"]
    else:  # a distributed that fails the transfer instead: the task's error is the compute's
        assert app.value("TRANSFER") != "finished"
    made = next(r for r in roots(receiver) if "lock-1" in keys_under(receiver, r))
    assert made["status_code"] != ERROR
    (lock_span,) = task_spans(receiver.spans(), made)
    assert lock_span["attributes"]["dask.worker.id"] == workers[0]


FORKED_CHILD = r"""
import os, signal
from otel_graph.cluster import process

process._deliver_on_sigterm()  # as in a worker process of its own
assert signal.getsignal(signal.SIGTERM) is process._on_sigterm
ready, tell = os.pipe()
never, _ = os.pipe()
pid = os.fork()
if pid == 0:  # a task's own multiprocessing pool, say
    os.write(tell, b"x")
    os.read(never, 1)
    os._exit(0)
os.read(ready, 1)
with open(f"/proc/{pid}/status") as status:
    caught = [int(line.split()[1], 16) for line in status if line.startswith("SigCgt:")][0]
print("CAUGHT", bool(caught >> (signal.SIGTERM - 1) & 1), flush=True)
os.kill(pid, signal.SIGTERM)
_, how = os.waitpid(pid, 0)
print("ENDED", os.WTERMSIG(how) if os.WIFSIGNALED(how) else None, flush=True)
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
def test_a_child_forked_from_a_worker_gets_the_default_sigterm_back():
    # The worker's SIGTERM handler is Python, which runs only when the main thread gets
    # the GIL, and the child has none of the threads delivery needs: the kernel's default
    # action, seen in the child's caught-signals mask, ends it as it would without us.
    proc = subprocess.run([sys.executable, "-c", FORKED_CHILD], capture_output=True, text=True, timeout=60,
                          env=subprocess_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "CAUGHT False" in proc.stdout, "the child kept the worker's handler"
    assert f"ENDED {int(signal.SIGTERM)}" in proc.stdout
