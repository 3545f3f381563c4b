"""A preload that says when its server is running: ``READY`` on stderr, for :mod:`preload_start`.

A scheduler starts its plugins (otel_graph's among them) after its preloads, and is
running once they have started; so this waits for the status, not for its turn.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

_WAITING: list[asyncio.Task[None]] = []  # a task's only reference: the loop keeps weak ones


async def _say_when_running(server: Any) -> None:
    from distributed.core import Status

    while server.status != Status.running:
        await asyncio.sleep(0.001)
    print("READY", file=sys.stderr, flush=True)


async def dask_setup(server: Any) -> None:
    _WAITING.append(asyncio.get_running_loop().create_task(_say_when_running(server)))
