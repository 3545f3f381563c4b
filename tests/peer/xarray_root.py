"""What xarray's repository-root ``conftest.py`` gives its suite, which xarray's wheel does not ship.

Loaded in both runs of the wheel's tests (``xarray_root.toml`` names it): flaky, network
and mypy tests skipped, as in xarray's CI without ``--run-flaky``, ``--run-network-tests``
or ``--run-mypy``; each test run in a directory of its own with NumPy's random seed 0.
"""

from __future__ import annotations

from typing import Any

import pytest


def pytest_configure(config: pytest.Config) -> None:
    for marker in ("skip_with_dask_array", "xfail_with_dask_array"):
        config.addinivalue_line("markers", f"{marker}: with dask-array as xarray's chunk manager (not used here)")


def pytest_runtest_setup(item: pytest.Item) -> None:
    if "flaky" in item.keywords:
        pytest.skip("set --run-flaky option to run flaky tests")
    if "network" in item.keywords:
        pytest.skip("set --run-network-tests to run test requiring an internet connection")
    if any("mypy" in mark.name for mark in item.own_markers):
        pytest.skip("set --run-mypy option to run mypy tests")


@pytest.fixture(autouse=True)
def add_standard_imports(doctest_namespace: dict[str, Any], tmpdir: Any) -> None:
    import dask
    import numpy as np
    import pandas as pd
    import xarray as xr

    doctest_namespace.update(np=np, pd=pd, xr=xr)
    np.random.seed(0)
    tmpdir.chdir()
    dask.config.set({"dataframe.query-planning": True})
