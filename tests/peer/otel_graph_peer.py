"""A pytest plugin that instruments the test session, for a peer's suite run instrumented.

``python -m pytest -p otel_graph_peer ...`` (with this directory on ``PYTHONPATH``) calls
``otel_graph.instrument_scheduler()`` once, before any test is collected, exactly as a
user would at start-up; the ``OTEL_*`` variables the runner sets say where it exports.
At the end it flushes and writes what it delivered to ``$OTEL_GRAPH_PEER_STATS``, one file
per process (``.<xdist worker id>`` appended in pytest-xdist's workers, which run the
tests), so the runner can show that the run was instrumented for real.
"""

from __future__ import annotations

import json
import os
from typing import Any

_handle: Any = None


def pytest_configure(config: Any) -> None:
    global _handle
    import otel_graph

    _handle = otel_graph.instrument_scheduler()


def pytest_unconfigure(config: Any) -> None:
    if _handle is None:
        return
    _handle.flush(30.0)
    path = os.environ.get("OTEL_GRAPH_PEER_STATS")
    worker = getattr(config, "workerinput", {}).get("workerid")
    if path and worker:
        path = f"{path}.{worker}"
    if path:
        with open(path, "w", encoding="utf-8") as out:
            json.dump(_handle.stats(), out)
