"""What dask's repository-root ``conftest.py`` gives its suite, which dask's wheel does not ship.

Loaded in both runs of the wheel's tests (``dask_root.toml`` names it): slow and array-expr
tests skipped, as in dask's CI without ``--runslow`` or ``--runarrayexpr``; asynchronous
clients allowed a synchronous fallback for the session; dask's helpers' asserts rewritten.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.register_assert_rewrite("dask.array.utils", "dask.dataframe.utils", "dask.bag.utils")


def pytest_runtest_setup(item: pytest.Item) -> None:
    if "slow" in item.keywords:
        pytest.skip("need --runslow option to run")
    if "array_expr" in item.keywords:
        pytest.skip("need --runarrayexpr option to run")


@pytest.fixture(autouse=True, scope="session")
def allow_distributed_async_clients() -> Iterator[Any]:
    import dask

    with dask.config.set({"admin.async-client-fallback": "sync"}):
        yield
