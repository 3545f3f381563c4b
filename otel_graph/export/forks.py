"""A process forked from an instrumented one: otel_graph's parts there stand down, and say so once.

Exporters cannot cross ``os.fork`` (``multiprocessing``'s default start method on
Linux): the child's copy of a gRPC channel or of an HTTP connection pool shares the
parent's sockets (gRPC without its fork support can hang in the child), the child's
copies of the queues hold the parent's spans, which the parent delivers, and the threads
that would drain them did not come along. Left as they were, a forked child that ran
computes would keep every compute's record, graph included, and export nothing, then
spend seconds at exit on the parent's copies.

So each part made before the fork (:func:`stands_down` registers it) is told, in the
child, that it was forked (``_after_fork_in_child``; no lock is taken there: one may have
been held by a thread that does not exist in the child). There a compute runs untraced,
a span or metric export is counted as undelivered and never sent, and the exit hook
leaves the parent's data alone. The first of these is said once, in a warning. Parts made
in the child itself work as anywhere else; but the child cannot instrument again (its
global providers are the parent's): start it with ``spawn`` or ``forkserver`` and
instrument there.

>>> import os
>>> class Part:
...     forked = False
...     def _after_fork_in_child(self):
...         self.forked = True
>>> part = stands_down(Part())
>>> pid = os.fork()
>>> if pid == 0:
...     os._exit(0 if part.forked else 1)
>>> os.waitpid(pid, 0)[1], part.forked
(0, False)
"""

from __future__ import annotations

import logging
import os
import weakref
from typing import TypeVar

logger = logging.getLogger("otel_graph")

_T = TypeVar("_T")
_PARTS: weakref.WeakSet = weakref.WeakSet()
_WARNED = [False]


def stands_down(part: _T) -> _T:
    """Have ``part._after_fork_in_child()`` called in each child forked after this."""
    _PARTS.add(part)
    return part


def forked_child_drops(what: str) -> None:
    """Say once, in a forked child, that telemetry made there is not exported."""
    if _WARNED[0]:
        return
    _WARNED[0] = True
    logger.warning("otel_graph: this process was forked from an instrumented one, whose exporters cannot be "
                   "shared across a fork: %s here are not traced or exported (spans and metric points made "
                   "here are counted as undelivered). Start it with multiprocessing's 'spawn' or 'forkserver' "
                   "and instrument there", what)


def _after_fork_in_child() -> None:
    _WARNED[0] = False
    for part in list(_PARTS):
        try:
            part._after_fork_in_child()
        except Exception:  # never fail a fork for telemetry's sake
            pass


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_after_fork_in_child)
