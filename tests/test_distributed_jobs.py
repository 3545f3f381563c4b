"""A dask.distributed job's failed tasks and output bytes: counted by the scheduler, as its workers measured.

The unit tests drive :class:`ComputeTotals` as the scheduler plugin does; the end-to-end
test runs ``tests/apps/cluster.py --workload jobs`` (a real LocalCluster with worker
processes) and reads each named job's compute metrics as they arrive over OTLP, against
the task spans the workers sent.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest

import subprocesses
from otel_graph.cluster.compute_totals import ComputeTotals, Totals
from otlp_receiver import OtlpReceiver

ERROR, SUCCESS = "error", "success"
ERROR_STATUS = 2  # OTLP StatusCode.STATUS_CODE_ERROR


def test_a_compute_is_done_when_its_last_output_settles() -> None:
    totals = ComputeTotals()
    assert totals.expect("n1", "client-a", ["out-1", "out-2"]) is None
    totals.ran("n1", failed=False, nbytes=100)
    totals.ran("n1", failed=True, nbytes=-1)
    totals.ran("n1", failed=False, nbytes=-1)  # a size the worker could not measure
    totals.ran("unknown-note", failed=False, nbytes=7)
    assert totals.settled("out-1") == []
    totals.ran("n1", failed=False, nbytes=20)
    assert totals.settled("out-2") == [Totals("n1", "client-a", 1, 120)]
    assert len(totals) == 0 and totals.awaited == {}
    totals.ran("n1", failed=False, nbytes=5)  # a straggler after the end counts nowhere
    assert totals.settled("out-2") == []


def test_nothing_to_run_is_done_at_once_and_a_shared_output_ends_both() -> None:
    totals = ComputeTotals()
    assert totals.expect("n1", "a", []) == Totals("n1", "a", 0, 0)
    assert totals.expect("n2", "a", ["shared"]) is None and totals.expect("n3", "b", ["shared", "own"]) is None
    totals.ran("n2", failed=False, nbytes=8)
    assert totals.settled("shared") == [Totals("n2", "a", 0, 8)]
    assert totals.settled("own") == [Totals("n3", "b", 0, 0)]


def test_a_second_update_of_a_running_compute_joins_its_tally() -> None:
    totals = ComputeTotals()
    totals.expect("n1", "a", ["x"])
    totals.ran("n1", failed=False, nbytes=3)
    totals.expect("n1", "a", ["y", "x"])  # x is awaited already: counted once
    assert totals.settled("x") == []
    assert totals.settled("y") == [Totals("n1", "a", 0, 3)]


def test_an_output_that_errs_first_sends_what_was_counted_and_the_rest_follows() -> None:
    totals = ComputeTotals()
    totals.expect("n1", "a", ["bad", "good"])
    totals.ran("n1", failed=False, nbytes=10)
    totals.ran("n1", failed=True, nbytes=-1)
    # The client's get raises here: its failure is in what it hears.
    assert totals.settled("bad", erred=True) == [Totals("n1", "a", 1, 10)]
    totals.ran("n1", failed=False, nbytes=5)
    assert totals.settled("good") == [Totals("n1", "a", 0, 5)]


def test_only_the_first_failed_output_sends_a_part() -> None:
    totals = ComputeTotals()
    totals.expect("n1", "a", ["bad-1", "bad-2", "last"])
    totals.ran("n1", failed=True, nbytes=-1)
    assert totals.settled("bad-1", erred=True) == [Totals("n1", "a", 1, 0)]
    totals.ran("n1", failed=True, nbytes=-1)
    assert totals.settled("bad-2", erred=True) == []  # a thousand failed chunks: one part, not a thousand
    assert totals.settled("last", erred=True) == [Totals("n1", "a", 1, 0)]


def test_tallies_are_bounded_and_a_gone_clients_are_dropped() -> None:
    totals = ComputeTotals(max_computes=2)
    for n in range(3):
        totals.expect(f"n{n}", "a" if n else "b", [f"k{n}", "shared"])
    assert len(totals) == 2 and "k0" not in totals.awaited and totals.awaited["shared"] == ["n1", "n2"]
    totals.client_gone("a")
    assert len(totals) == 0 and totals.awaited == {}
    assert totals.settled("k1") == []


# -- a real cluster -----------------------------------------------------------------------------------------------
pytest.importorskip("distributed")
run_app = partial(subprocesses.run_app, "cluster.py")
JOBS = ("sum-job", "fail-job", "fail-first-job", "map-job", "persist-job", "persisted-job", "held-job", "cancel-job")


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as running:
        yield running


def _points(receiver: OtlpReceiver) -> dict[tuple[str, str, str], dict[str, Any]]:
    """The latest point of each compute metric, by (metric, job, compute outcome)."""
    latest = {}
    for point in receiver.metrics():
        if point["name"].startswith("dask.compute."):
            attributes = point["attributes"]
            latest[(point["name"], attributes["dask.compute.name"], attributes["dask.task.outcome"])] = point
    return latest


def _task_bytes(receiver: OtlpReceiver, job: str, outcome: str) -> int | None:
    """The results' bytes the task spans of the job's compute of that outcome say; None until they all came."""
    spans = receiver.spans()
    roots = [s for s in spans if s["name"] == "dask.compute" and s["attributes"].get("dask.compute.name") == job
             and (s["status_code"] == ERROR_STATUS) == (outcome == ERROR)]
    if len(roots) != 1:
        return None
    (root,) = roots
    tasks = [s for s in spans if s["parent_span_id"] == root["span_id"] and "dask.task.prefix" in s["attributes"]]
    if len(tasks) < root["attributes"]["dask.graph.tasks"]:
        return None
    return sum(s["attributes"].get("dask.task.nbytes", 0) for s in tasks if s["status_code"] != ERROR_STATUS)


def test_each_jobs_failed_tasks_and_output_bytes_are_the_schedulers_count(receiver: OtlpReceiver) -> None:
    env = subprocesses.otlp_env(receiver.grpc_endpoint, "grpc", service="jobs-test",
                                OTEL_GRAPH_MAX_TASK_SPANS="unlimited")
    app = run_app("--workload", "jobs", "--flush", env=env, timeout_s=180)
    assert app.value("RESULT") == "jobs"

    def arrived(r: OtlpReceiver) -> bool:
        points = _points(r)
        return all(any(key[1] == job for key in points) for job in JOBS) and \
            ("dask.compute.output.size", "cancel-job", SUCCESS) in points

    assert receiver.wait_for(arrived, timeout_s=30), sorted(_points(receiver))
    points = _points(receiver)

    def total(metric: str, job: str, outcome: str = SUCCESS) -> float:
        point = points[(f"dask.compute.{metric}", job, outcome)]
        assert point["count"] == 1, (metric, job, outcome)
        return point["sum"]

    def spans_say(job: str, outcome: str = SUCCESS) -> int:
        assert receiver.wait_for(lambda r: _task_bytes(r, job, outcome) is not None, timeout_s=30), (job, outcome)
        return _task_bytes(receiver, job, outcome) or 0

    # Chunks of 100x100 float64 and what was made of them, as the workers measured each.
    assert total("failed_tasks", "sum-job") == 0 and total("output.size", "sum-job") == spans_say("sum-job") > 80_000
    # boom raised on inc-0's result: one failure, inc-0's int the only result.
    assert total("failed_tasks", "fail-job", ERROR) == 1
    assert total("output.size", "fail-job", ERROR) == spans_say("fail-job", ERROR) > 0
    # Two outputs, one failed at once: get raised then, with the failure counted.
    assert total("failed_tasks", "fail-first-job", ERROR) == 1
    # One of ten failed; the nine others' ints.
    assert total("failed_tasks", "map-job", ERROR) == 1
    assert total("output.size", "map-job", ERROR) == spans_say("map-job", ERROR) > 0
    assert total("output.size", "persist-job") == spans_say("persist-job") >= 16 * 80_000  # the 16 chunks kept
    # The same keys again: nothing ran, and the compute says so (0, not unknown).
    assert total("failed_tasks", "persisted-job") == 0 and total("output.size", "persisted-job") == 0
    # Its results held by the client already, the compute ended before the scheduler took its graph.
    assert total("duration", "held-job") >= 0
    assert not {("dask.compute.tasks", "held-job", SUCCESS), ("dask.compute.failed_tasks", "held-job", SUCCESS),
                ("dask.compute.output.size", "held-job", SUCCESS)} & set(points)
    (held,) = [s for s in receiver.spans() if s["attributes"].get("dask.compute.name") == "held-job"]
    assert "dask.graph.tasks" not in held["attributes"] and "dask.graph.fingerprint" not in held["attributes"]
    # A compute the client cancelled ended before the scheduler let go of its task: unknown, not 0.
    assert total("duration", "cancel-job", ERROR) > 0 and total("tasks", "cancel-job", ERROR) == 1
    assert ("dask.compute.failed_tasks", "cancel-job", ERROR) not in points
    assert ("dask.compute.output.size", "cancel-job", ERROR) not in points
    assert total("output.size", "cancel-job") == spans_say("cancel-job") > 0  # the short nap that ran
