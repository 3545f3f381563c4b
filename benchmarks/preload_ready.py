"""A preload that says when the preloads before it are done: ``READY`` on stderr, for
:mod:`preload_start`, which gives it last on ``dask scheduler``'s command line."""

from __future__ import annotations

import sys
from typing import Any


async def dask_setup(server: Any) -> None:
    print("READY", file=sys.stderr, flush=True)
