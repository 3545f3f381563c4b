"""A compute's job identity (otel_graph.telemetry.job): names and graph fingerprints."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import needs_distributed, subprocess_env
from otel_graph.telemetry.job import OTHER_NAMES, Names, current_name, fingerprint, graph_shape, name
from otlp_receiver import OtlpReceiver
from subprocesses import otlp_env

SHAPE = """
import dask.array as da
from dask.core import get_dependencies
from otel_graph.telemetry.job import fingerprint, graph_shape
x = da.ones((400, 400), chunks=(100, 100)) * {seed}
graph = dict((x + x.T).sum().__dask_graph__())
print(fingerprint(*graph_shape({{key: get_dependencies(graph, key) for key in graph}})))
"""


def _fingerprint_elsewhere(seed: int, hash_seed: str) -> str:
    run = subprocess.run([sys.executable, "-c", SHAPE.format(seed=seed)], capture_output=True, text=True,
                         timeout=120, env=subprocess_env(PYTHONHASHSEED=hash_seed))
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout.strip()


def test_the_same_shape_on_other_data_has_the_same_fingerprint_in_any_process() -> None:
    prints = {_fingerprint_elsewhere(seed, hash_seed) for seed, hash_seed in ((1, "1"), (2, "2"), (3, "random"))}
    assert len(prints) == 1 and len(prints.pop()) == 16


def test_another_shape_has_another_fingerprint() -> None:
    one = fingerprint(*graph_shape({("load-1", 0): [], ("load-1", 1): [], "total-2": [("load-1", 0), ("load-1", 1)]}))
    same = fingerprint(*graph_shape({("load-9", 0): [], ("load-9", 1): [], "total-8": [("load-9", 0), ("load-9", 1)]}))
    more = fingerprint(*graph_shape({("load-1", i): [] for i in range(3)} | {"total-2": [("load-1", 0)]}))
    unlinked = fingerprint(*graph_shape({("load-1", 0): [], ("load-1", 1): [], "total-2": []}))
    assert one == same and len({one, more, unlinked}) == 3


def test_name_as_context_manager_and_decorator_nests_and_stays_in_its_thread() -> None:
    @name("decorated")
    def job() -> str:
        return current_name(None)

    seen: list[str] = []
    with name("outer"):
        assert current_name("a span") == "outer"
        with name("inner"):
            assert current_name(None) == "inner"
            thread = threading.Thread(target=lambda: seen.append(current_name("other thread's span")))
            thread.start()
            thread.join()
        assert job() == "decorated" and current_name(None) == "outer"
    assert seen == ["other thread's span"]
    with pytest.raises(TypeError, match="non-empty string"):
        name("  ")


def test_without_a_name_the_span_then_the_calling_function_names_the_job() -> None:
    def nightly_etl() -> str:
        return current_name(None)

    assert current_name("user.span") == "user.span"
    assert nightly_etl().endswith("test_without_a_name_the_span_then_the_calling_function_names_the_job."
                                  "<locals>.nightly_etl")


def test_one_name_entered_by_many_threads_at_once_and_an_async_def_decorated() -> None:
    shared = name("shared")
    barrier = threading.Barrier(4)
    seen: list[str] = []
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            with shared:
                barrier.wait(timeout=10)  # all four inside at once
                seen.append(current_name(None))
                barrier.wait(timeout=10)
            seen.append(current_name("after"))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and sorted(seen) == ["after"] * 4 + ["shared"] * 4

    @name("async-job")
    async def job() -> str:
        await asyncio.sleep(0)
        return current_name(None)

    assert asyncio.run(job()) == "async-job"


def test_libraries_that_compute_for_their_users_are_not_the_caller() -> None:
    library = types.ModuleType("xarray.core.dataset")
    exec("from otel_graph.telemetry.job import current_name\n"  # a library's method calling compute()
         "def load():\n    return current_name(None)\n", library.__dict__)
    odd = {"__name__": 42, "current_name": current_name}  # a module whose __name__ is not text
    exec("def run():\n    return current_name(None)\n", odd)

    def nightly() -> str:
        return library.load()

    assert nightly().endswith("test_libraries_that_compute_for_their_users_are_not_the_caller.<locals>.nightly")
    assert odd["run"]() == "42.run"


def test_names_past_the_limit_are_folded_and_counted() -> None:
    names = Names(limit=2)
    assert [names.label(job) for job in ["a", "b", "c", "a", "d"]] == ["a", "b", OTHER_NAMES, "a", OTHER_NAMES]
    assert names.folded == 2


# -- real computes: the identity on the dask.compute span, the name on the compute metrics ----------
APP = Path(__file__).parent / "apps" / "jobs.py"


def _run_job(receiver: OtlpReceiver, *args: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The job's compute span, and the compute metric points it sent (with ``task_bytes``: the
    results' bytes its task spans give, where the job ran them here)."""
    receiver.clear()
    proc = subprocess.run([sys.executable, str(APP), *args], capture_output=True, text=True, timeout=240,
                          env=otlp_env(receiver.grpc_endpoint, "grpc", OTEL_GRAPH_MAX_TASK_SPANS="unlimited"))
    assert proc.returncode == 0 and "FLUSHED True" in proc.stdout, proc.stderr[-3000:]
    (compute,) = [s for s in receiver.spans() if s["name"] == "dask.compute"]
    points = [p for p in receiver.metrics() if p["name"].startswith("dask.compute.")]
    compute["task_bytes"] = sum(s["attributes"].get("dask.task.nbytes", 0) for s in receiver.spans()
                                if s["parent_span_id"] == compute["span_id"])
    return compute, points


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as running:
        yield running


@pytest.mark.parametrize("scheduler", ["sync", "threads", "processes",
                                       pytest.param("cluster", marks=needs_distributed)])
def test_every_scheduler_names_and_fingerprints_its_computes(receiver: OtlpReceiver, scheduler: str) -> None:
    named, points = _run_job(receiver, "--scheduler", scheduler, "--name", "nightly-etl", "--seed", "1")
    other_data, _ = _run_job(receiver, "--scheduler", scheduler, "--seed", "2", "--span", "etl-request")
    other_shape, failed_points = _run_job(receiver, "--scheduler", scheduler, "--seed", "1", "--fail")
    fingerprint = named["attributes"]["dask.graph.fingerprint"]
    assert len(fingerprint) == 16 and other_data["attributes"]["dask.graph.fingerprint"] == fingerprint
    assert other_shape["attributes"]["dask.graph.fingerprint"] != fingerprint  # one task more: check
    assert named["attributes"]["dask.compute.name"] == "nightly-etl"
    assert other_data["attributes"]["dask.compute.name"] == "etl-request"
    assert other_shape["attributes"]["dask.compute.name"] == "__main__.nightly_etl"
    by_metric = {p["name"]: p for p in points}
    duration = by_metric["dask.compute.duration"]
    assert duration["attributes"]["dask.compute.name"] == "nightly-etl" and duration["count"] == 1
    tasks = by_metric["dask.compute.tasks"]
    assert tasks["attributes"] == duration["attributes"] and tasks["count"] == 1
    assert tasks["sum"] == named["attributes"]["dask.graph.tasks"] > 16
    failed_run = {p["name"]: p for p in failed_points}
    assert failed_run["dask.compute.duration"]["attributes"]["dask.task.outcome"] == "error"
    # On a cluster, counted by the scheduler; the workers' task spans say the same.
    assert by_metric["dask.compute.failed_tasks"]["sum"] == 0
    assert by_metric["dask.compute.output.size"]["sum"] == named["task_bytes"] > 100 * 100 * 8
    assert failed_run["dask.compute.failed_tasks"]["sum"] == 1  # check raised; the rest ran
    assert failed_run["dask.compute.failed_tasks"]["attributes"]["dask.task.outcome"] == "error"


def test_a_large_computes_totals_are_those_of_its_task_spans(receiver: OtlpReceiver) -> None:
    # 1,600 chunks: drained a slice at a time while it runs, not whole at its end.
    compute, points = _run_job(receiver, "--scheduler", "threads", "--size", "4000", "--name", "large")
    by_metric = {p["name"]: p for p in points}
    attributes = compute["attributes"]
    assert attributes["dask.graph.tasks"] > 1000 and len(attributes["dask.graph.fingerprint"]) == 16
    assert by_metric["dask.compute.tasks"]["sum"] == compute["attributes"]["dask.graph.tasks"]
    assert by_metric["dask.compute.output.size"]["sum"] == compute["task_bytes"] > 4000 * 4000 * 8
