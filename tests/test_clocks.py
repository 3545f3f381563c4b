"""One timeline per trace: a cluster whose clocks disagree still draws causal traces.

A cluster started from the command line (``dask scheduler``, two ``dask worker`` named
``fast`` and ``skewed``), each process's wall clock shifted as asked by
``tests/skewed_clock/sitecustomize.py`` (its ``time.time``/``time.time_ns`` only), and
a client script that runs the chain ``chain-a -> chain-b -> chain-c -> chain-d`` on
fast, skewed, fast, skewed in one compute. Everything is asserted on the spans and
points that arrive at a real OTLP receiver.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import TypeVar

import pytest

import subprocesses
from otlp_receiver import OtlpReceiver
from subprocesses import stop_all, wait_for_address

pytest.importorskip("distributed")

SKEWED = Path(__file__).resolve().parent / "skewed_clock"
CHAIN = ("chain-a", "chain-b", "chain-c", "chain-d")
ON_SKEWED = {"chain-b", "chain-d"}
#: What a correction may be off by, besides the uncertainty a span states, on one machine.
MARGIN_S = 0.002
T = TypeVar("T")
run_app = partial(subprocesses.run_app, subprocesses.APPS / "cluster.py")


def skewed(env: dict[str, str], skew_s: float) -> dict[str, str]:
    """``env`` for a process whose wall clock is ``skew_s`` ahead (behind, if negative)."""
    if not skew_s:
        return env
    return {**env, "PYTHONPATH": f"{SKEWED}:{env['PYTHONPATH']}", "SKEWED_CLOCK_S": str(skew_s)}


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as running:
        yield running


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator:
    """Starts ``dask scheduler`` and workers ``fast`` and ``skewed``; yields the starter."""
    procs: list[subprocess.Popen] = []

    def start(env: dict[str, str], *, skew_s: float) -> str:
        scheduler_file = tmp_path / "scheduler.json"
        with open(tmp_path / "scheduler.log", "w") as log:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "distributed.cli.dask_scheduler", "--scheduler-file", str(scheduler_file),
                 "--host", "127.0.0.1", "--port", "0", "--dashboard-address", ":0"],
                env=env, stdout=log, stderr=subprocess.STDOUT))
        address = wait_for_address(scheduler_file, procs[0])
        for name, shift in (("fast", 0.0), ("skewed", skew_s)):
            with open(tmp_path / f"{name}.log", "w") as log:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "distributed.cli.dask_worker", address, "--nthreads", "1",
                     "--name", name, "--no-dashboard", "--memory-limit", "1GB"],
                    env=skewed(env, shift), stdout=log, stderr=subprocess.STDOUT))
        return address

    start.logs = tmp_path  # type: ignore[attr-defined]
    yield start
    stop_all(procs)


def chain_trace(receiver: OtlpReceiver) -> tuple[dict, dict[str, dict]]:
    """The chain's compute span, and its task spans by key, once all four arrived."""

    def find(r: OtlpReceiver) -> tuple[dict, dict[str, dict]] | None:
        spans = r.spans()
        tasks = {s["attributes"]["dask.task.key"]: s for s in spans if s["attributes"].get("dask.task.key") in CHAIN
                 and "dask.task.prefix" in s["attributes"]}
        roots = [s for s in spans if s["name"] == "dask.compute"]
        if len(tasks) < len(CHAIN) or not roots:
            return None
        (root,) = [s for s in roots if s["span_id"] == tasks["chain-a"]["parent_span_id"]]
        return root, tasks

    return arrived(receiver, find)


def arrived(receiver: OtlpReceiver, find: Callable[[OtlpReceiver], T | None]) -> T:
    """What ``find`` reads off the receiver, once it finds it (within a minute)."""
    assert receiver.wait_for(lambda r: find(r) is not None, timeout_s=60), sorted(s["name"] for s in receiver.spans())
    found = find(receiver)
    assert found is not None
    return found


def tolerance_ns(*spans: dict) -> int:
    """How far apart two clocks' readings may be: the uncertainties the spans state, and a margin."""
    return int((sum(s["attributes"].get("dask.clock.uncertainty", 0.0) for s in spans) + MARGIN_S) * 1e9)


def assert_causal(root: dict, tasks: dict[str, dict]) -> None:
    for earlier, later in zip(CHAIN, CHAIN[1:], strict=False):
        a, b = tasks[earlier], tasks[later]
        assert b["start_ns"] >= a["end_ns"] - tolerance_ns(a, b), \
            f"{later} starts {(a['end_ns'] - b['start_ns']) / 1e9:.3f} s before {earlier} ends"
    for key, task in tasks.items():
        slack = tolerance_ns(task)
        assert root["start_ns"] - slack <= task["start_ns"] <= task["end_ns"] <= root["end_ns"] + slack, \
            f"{key} starts {task['start_ns'] - root['start_ns']} ns into its compute, " \
            f"ends {root['end_ns'] - task['end_ns']} ns before its end"


def clock_offsets(receiver: OtlpReceiver, worker_name: str) -> list[float]:
    return [p["value"] for p in receiver.metrics() if p["name"] == "dask.clock.offset"
            and p["resource"].get("dask.worker.name") == worker_name]


@pytest.mark.slow
@pytest.mark.parametrize("skew_s", [3.0, -3.0])
def test_a_worker_whose_clock_is_off_draws_on_the_callers_timeline(receiver, cluster, skew_s):
    env = subprocesses.otlp_env(receiver.grpc_endpoint, service="clocks")
    address = cluster(env, skew_s=skew_s)
    app = run_app("--scheduler", address, "--wait-workers", "2", "--workload", "chain", "--flush", env=env)
    assert app.value("RESULT") == "4"
    root, tasks = chain_trace(receiver)
    assert_causal(root, tasks)
    for key, task in tasks.items():
        attributes = task["attributes"]
        expected = -skew_s if key in ON_SKEWED else 0.0
        assert abs(attributes["dask.clock.correction"] - expected) <= attributes["dask.clock.uncertainty"] + MARGIN_S
        assert attributes["dask.clock.uncertainty"] < 0.05, "a few ms on one machine"
    # Each process says how far its clock is from the scheduler's.
    assert receiver.wait_for(lambda r: clock_offsets(r, "skewed") and clock_offsets(r, "fast"), timeout_s=30)
    assert all(abs(value - skew_s) < 0.05 for value in clock_offsets(receiver, "skewed"))
    assert all(abs(value) < 0.05 for value in clock_offsets(receiver, "fast"))


@pytest.mark.slow
@pytest.mark.parametrize("skew_s", [3.0, -3.0])
def test_a_client_whose_clock_is_off_keeps_its_own_timeline(receiver, cluster, skew_s):
    env = subprocesses.otlp_env(receiver.grpc_endpoint, service="clocks")
    address = cluster(env, skew_s=0.0)
    app = run_app("--scheduler", address, "--wait-workers", "2", "--workload", "chain", "--flush",
                  env=skewed(env, skew_s))
    assert app.value("RESULT") == "4"
    root, tasks = chain_trace(receiver)
    assert_causal(root, tasks)
    for task in tasks.values():
        attributes = task["attributes"]
        assert abs(attributes["dask.clock.correction"] - skew_s) <= attributes["dask.clock.uncertainty"] + MARGIN_S

    def client_offsets(r: OtlpReceiver) -> list[float]:
        return [p["value"] for p in r.metrics() if p["name"] == "dask.clock.offset"
                and "dask.worker.name" not in p["resource"]]

    assert receiver.wait_for(lambda r: client_offsets(r), timeout_s=30)
    assert all(abs(value - skew_s) < 0.05 for value in client_offsets(receiver))


@pytest.mark.slow
def test_a_compute_a_task_starts_on_a_skewed_worker_is_drawn_on_the_callers_timeline(receiver, cluster):
    env = subprocesses.otlp_env(receiver.grpc_endpoint, service="clocks")
    address = cluster(env, skew_s=3.0)
    app = run_app("--scheduler", address, "--wait-workers", "2", "--workload", "nested-skewed", "--flush", env=env)
    assert app.value("RESULT") == "6"

    def find(r: OtlpReceiver) -> tuple[dict, dict, list[dict]] | None:
        spans = r.spans()
        outer = [s for s in spans if s["attributes"].get("dask.task.key") == "outer-0"]
        inner = [s for s in spans if str(s["attributes"].get("dask.task.key", "")).startswith("inner-")]
        if not outer or len(inner) < 3:
            return None
        (nested,) = [s for s in spans if s["name"] == "dask.compute" and s["span_id"] == inner[0]["parent_span_id"]]
        return outer[0], nested, inner

    outer, nested, inner = arrived(receiver, find)
    # Made on the skewed worker, moved back by its 3 s: inside the task that started it.
    assert abs(nested["attributes"]["dask.clock.correction"] + 3.0) <= nested["attributes"]["dask.clock.uncertainty"] \
        + MARGIN_S
    slack = tolerance_ns(outer, nested)
    assert outer["start_ns"] - slack <= nested["start_ns"] <= nested["end_ns"] <= outer["end_ns"] + slack, \
        f"the nested compute starts {(nested['start_ns'] - outer['start_ns']) / 1e9:.3f} s into its task"
    for task in inner:  # ran on fast, placed by the note the nested compute carried
        slack = tolerance_ns(nested, task)
        assert nested["start_ns"] - slack <= task["start_ns"] <= task["end_ns"] <= nested["end_ns"] + slack


@pytest.mark.slow
def test_spans_a_tasks_own_code_starts_on_a_skewed_worker_are_drawn_on_the_callers_timeline(receiver, cluster):
    env = subprocesses.otlp_env(receiver.grpc_endpoint, service="clocks")
    address = cluster(env, skew_s=3.0)
    app = run_app("--scheduler", address, "--wait-workers", "2", "--workload", "user-spans-skewed", "--flush",
                  env=env)
    assert app.value("RESULT") == "4"

    def find(r: OtlpReceiver) -> list[tuple[dict, dict, dict]] | None:
        spans = r.spans()
        by_id = {s["span_id"]: s for s in spans}
        found = []
        for step in (s for s in spans if s["name"] == "user.step"):
            task = by_id.get(step["parent_span_id"])
            root = by_id.get(task["parent_span_id"]) if task is not None else None
            if root is None:
                return None
            found.append((root, task, step))
        return found if len(found) == 2 else None

    for root, task, step in arrived(receiver, find):
        key = task["attributes"]["dask.task.key"]
        expected = -3.0 if key == "traced-skewed" else 0.0
        attributes = step["attributes"]
        assert abs(attributes["dask.clock.correction"] - expected) <= attributes["dask.clock.uncertainty"] + MARGIN_S
        # Moved as its task was, by the estimate as it stood when each was placed.
        assert abs(attributes["dask.clock.correction"] - task["attributes"]["dask.clock.correction"]) \
            <= attributes["dask.clock.uncertainty"] + MARGIN_S
        slack = tolerance_ns(task, step)
        assert task["start_ns"] - slack <= step["start_ns"] <= step["end_ns"] <= task["end_ns"] + slack, \
            f"{key}'s span starts {(step['start_ns'] - task['start_ns']) / 1e9:.3f} s into its task"
        assert root["start_ns"] - slack <= step["start_ns"] <= step["end_ns"] <= root["end_ns"] + slack
        (event,) = step["events"]
        assert step["start_ns"] < event["time_ns"] < step["end_ns"], "its events moved with it"
        # Moved, and otherwise as it was made.
        assert event["name"] == "halfway" and event["attributes"] == {"step": 1}
        assert step["kind"] == 3 and step["attributes"]["user.x"] == 1  # SPAN_KIND_CLIENT
        assert (step["status_code"], step["status_message"]) == (2, "on purpose")
        assert step["links"] == [{"trace_id": f"{0xABC:032x}", "span_id": f"{0xDEF:016x}",
                                  "attributes": {"why": "test"}}]
        assert step["scope"] == "user-code" and step["resource"]["dask.worker.name"] in ("fast", "skewed")


@pytest.mark.slow
def test_local_clocks_are_kept_when_asked(receiver, cluster):
    env = subprocesses.otlp_env(receiver.grpc_endpoint, service="clocks", OTEL_GRAPH_CLOCK="local")
    address = cluster(env, skew_s=3.0)
    app = run_app("--scheduler", address, "--wait-workers", "2", "--workload", "chain", "--flush", env=env)
    assert app.value("RESULT") == "4"
    _, tasks = chain_trace(receiver)
    # Raw times: the skewed worker's spans sit 3 s late, and say nothing was corrected.
    a, b, c = (tasks[key] for key in CHAIN[:3])
    assert 2.5e9 < b["start_ns"] - a["end_ns"] < 3.5e9
    assert 2.5e9 < b["end_ns"] - c["start_ns"] < 3.5e9
    assert not any("dask.clock.correction" in task["attributes"] for task in tasks.values())


@pytest.mark.slow
def test_local_clocks_leave_the_spans_a_tasks_own_code_starts_as_they_were_made(receiver, cluster):
    env = subprocesses.otlp_env(receiver.grpc_endpoint, service="clocks", OTEL_GRAPH_CLOCK="local")
    address = cluster(env, skew_s=3.0)
    app = run_app("--scheduler", address, "--wait-workers", "2", "--workload", "user-spans-skewed", "--flush",
                  env=env)
    assert app.value("RESULT") == "4"

    def find(r: OtlpReceiver) -> dict[str, tuple[dict, dict]] | None:
        spans = r.spans()
        by_id = {s["span_id"]: s for s in spans}
        pairs = {by_id[s["parent_span_id"]]["attributes"]["dask.task.key"]: (by_id[s["parent_span_id"]], s)
                 for s in spans if s["name"] == "user.step" and s["parent_span_id"] in by_id}
        return pairs if len(pairs) == 2 else None

    pairs = arrived(receiver, find)
    for task, step in pairs.values():
        assert "dask.clock.correction" not in step["attributes"]
        assert task["start_ns"] <= step["start_ns"] <= step["end_ns"] <= task["end_ns"], "one clock: the worker's"
    # Raw times: the skewed worker's span sits about 3 s after the fast one's, which ran beside it.
    fast, skewed = pairs["traced-fast"][1], pairs["traced-skewed"][1]
    assert 2.0e9 < skewed["start_ns"] - fast["start_ns"] < 4.0e9


@pytest.mark.slow
def test_a_clock_that_jumps_mid_compute_loses_nothing(receiver, cluster):
    env = subprocesses.otlp_env(receiver.grpc_endpoint, service="clocks")
    address = cluster(env, skew_s=0.5)
    # chain-b steps the skewed worker's clock a second ahead while the compute runs.
    app = run_app("--scheduler", address, "--wait-workers", "2", "--workload", "chain-jump", "--flush", env=env)
    assert app.value("RESULT") == "4"
    assert app.value("FLUSHED") == "True"
    root, tasks = chain_trace(receiver)
    assert set(tasks) == set(CHAIN)
    assert all(task["end_ns"] >= task["start_ns"] for task in tasks.values())
    for log in cluster.logs.glob("*.log"):
        assert "Traceback" not in log.read_text(), log.name
