"""A background thread's passes: on request, on a kick, or every interval; and the wait for one.

Both places that turn records into telemetry off the caller's thread (the local
:class:`~otel_graph.telemetry.tracker.Tracker`, and a dask.distributed worker's
:class:`~otel_graph.cluster.task_spans.WorkerTelemetry`) run the same loop: a thread that
sleeps until it is asked for a pass, or kicked because work piles up, or its interval
is up; and callers (a flush) that ask for a pass and wait for the one that covers their
ask. :class:`Passes` is that loop, and the owner's pass is a plain function.

Asks are counted: each :meth:`Passes.request` takes the next number, and a pass covers
every ask made before it started. A caller waits for ``completed`` to reach its number,
never past its deadline, and never on a thread that is gone (never started, as in a
process forked from the owner's, or ended by :meth:`Passes.stop`).

Every method but :meth:`Passes.start` and :meth:`Passes.after_fork` is called holding :attr:`Passes.wake`, the owner's
condition: the owner keeps its own state under the same lock, and its other waiters are
woken by the same notifications.

>>> import threading
>>> seen = []
>>> passes = Passes(lambda *, full, asked: seen.append((full, asked)), wake=threading.Condition(),
...                 interval_s=3600, name="example")
>>> passes.start()
>>> with passes.wake:
...     passes.wait(passes.request(), deadline=None)
True
>>> seen
[(True, True)]
>>> with passes.wake:
...     passes.stop()
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


def _idle() -> bool:
    return False


class Passes:
    """The thread that runs ``body(full=..., asked=...)``, and the count of passes asked for and done.

    A pass is ``asked`` when a :meth:`request` came since the last one began (a flush: it
    should leave nothing behind), and ``full`` unless it was only :meth:`kick`-ed, with its
    interval not yet up: the owner then does only what the kick was for. The interval runs
    from the start of the last full pass, or with ``rest=True`` from the end of the last pass,
    whatever it was: a thread that shares its process with the work it follows (a worker's
    tasks) then never runs pass after pass. A body that raises ends the thread: the owner
    catches what it must go on after.
    """

    def __init__(self, body: Callable[..., None], *, wake: threading.Condition, interval_s: float,
                 name: str, rest: bool = False) -> None:
        self.wake = wake
        self.requested = 0
        self.completed = 0
        #: Set by :meth:`kick`, cleared as a pass begins.
        self.kicked = False
        self.stopping = False
        self._body = body
        self._interval_s = interval_s
        self._rest = rest
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def start(self) -> None:
        self._thread.start()

    def request(self, *, wake_all: bool = True) -> int:
        """Ask for a pass (holding :attr:`wake`); the number whose completion covers it.
        ``wake_all=False`` wakes one waiter, the thread where no caller waits on the condition."""
        self.requested += 1
        if wake_all:
            self.wake.notify_all()
        else:
            self.wake.notify()
        return self.requested

    def kick(self) -> None:
        """Wake the thread for a pass before its interval (holding :attr:`wake`)."""
        self.kicked = True
        # notify() might wake another waiter (a flush), not the thread.
        self.wake.notify_all()

    def wait(self, target: int, *, deadline: float | None, busy: Callable[[], bool] = _idle) -> bool | None:
        """Holding :attr:`wake`, wait for pass ``target`` to complete and ``busy()`` to say no more.

        True once they have; False past ``deadline`` (of ``time.monotonic()``; None: none);
        None when the thread is gone first, which no wait outlives.
        """
        while self.completed < target or busy():
            if not self._thread.is_alive():
                return None
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            # Woken by every pass's end; the bound re-reads the thread's liveness now and then.
            self.wake.wait(0.5 if remaining is None else min(remaining, 0.5))
        return True

    def stop(self) -> None:
        """No pass begins after this (holding :attr:`wake`): the thread returns, its pass done."""
        self.stopping = True
        self.wake.notify_all()

    def after_fork(self, wake: threading.Condition) -> None:
        """In a process forked from the owner's: the thread did not come along (a wait returns
        at once), and the owner's new condition replaces one whose lock a thread of the parent's
        may have held at the fork."""
        self.wake = wake

    def _run(self) -> None:
        wake, interval = self.wake, self._interval_s
        last = time.monotonic()
        while True:
            with wake:
                if self.requested == self.completed and not self.kicked and not self.stopping:
                    wake.wait(max(0.0, last + interval - time.monotonic()))
                if self.stopping:
                    return
                target, kicked, self.kicked = self.requested, self.kicked, False
                asked = target != self.completed
            # Woken for no ask and no kick (its interval, or an owner's waiter handing it the
            # CPU): a full pass.
            full = asked or not kicked or time.monotonic() - last >= interval
            if full:
                last = time.monotonic()
            self._body(full=full, asked=asked)
            if self._rest:
                last = time.monotonic()
            with wake:
                self.completed = target
                wake.notify_all()
