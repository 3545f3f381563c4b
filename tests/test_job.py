"""A compute's job identity (otel_graph.telemetry.job): names and graph fingerprints."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from conftest import subprocess_env
from otel_graph.telemetry.job import OTHER_NAMES, Names, current_name, fingerprint, graph_shape, name

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


def test_names_past_the_limit_are_folded_and_counted() -> None:
    names = Names(limit=2)
    assert [names.label(job) for job in ["a", "b", "c", "a", "d"]] == ["a", "b", OTHER_NAMES, "a", OTHER_NAMES]
    assert names.folded == 2
