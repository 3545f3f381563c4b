"""Calls on a cluster that may never answer, made with a deadline.

distributed's blocking client calls take no deadline and wait on every worker; a paused
or dying worker must not hang ``flush()``, ``uninstrument()`` or ``Client()``. Each call
runs on a daemon thread of its own; after the deadline otel_graph goes on without it,
with one warning that says what did not answer.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

logger = logging.getLogger("otel_graph")

#: Longest otel_graph waits on a cluster to register, leave or flush before going on.
CLUSTER_TIMEOUT_S = 10.0


def bounded(work: Callable[[], Any], timeout_s: float, what: str) -> tuple[bool, Any]:
    """Run ``work`` on a daemon thread; (True, result) if it finished in time, else (False, None).

    distributed's blocking client calls take no deadline and wait on every worker; a
    paused or dying worker must not hang ``flush()``, ``uninstrument()`` or ``Client()``.
    """
    return bounded_all([work], timeout_s, what)[0]


def bounded_all(works: Sequence[Callable[[], Any]], timeout_s: float, what: str) -> list[tuple[bool, Any]]:
    """:func:`bounded` for several calls (one per client) side by side, within one ``timeout_s``
    in all: one after another, each with its own, made a stuck cluster cost it once per client."""
    outcomes: list[list[Any]] = [[] for _ in works]

    def run(work: Callable[[], Any], outcome: list[Any]) -> None:
        try:
            outcome.append((True, work()))
        except Exception as exc:  # reported below, by type only
            outcome.append((False, exc))

    threads = [threading.Thread(target=run, args=(work, outcome), name=f"otel-graph-{what}", daemon=True)
               for work, outcome in zip(works, outcomes, strict=False)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout_s
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    results = [outcome[0] if outcome else (False, None) for outcome in outcomes]
    silent = sum(not outcome for outcome in outcomes)
    if silent:  # once per call, not once per client of the same stuck cluster
        clients = f" ({silent} of {len(works)} clients)" if len(works) > 1 else ""
        logger.warning("otel_graph: the cluster did not answer %s within %.0f s%s; going on without waiting",
                       what, timeout_s, clients)
    for ok, value in results:
        if not ok and value is not None:
            logger.warning("otel_graph: %s failed: %s", what, type(value).__name__)
    return [(ok, value if ok else None) for ok, value in results]
