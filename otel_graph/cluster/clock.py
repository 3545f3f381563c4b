"""One timeline per trace: how far apart the clocks of a cluster's processes are.

Hosts' clocks disagree, by milliseconds under NTP and by seconds without it. A trace is
drawn on one timeline, that of its *caller*: the process whose ``dask.compute`` span is
the trace's root. A worker's span times are moved onto it in two steps:

* **worker -> scheduler**: measured on the messages worker and scheduler exchange
  anyway: what a worker says (its ``sent`` clock, :func:`.adapter.say_to_scheduler`)
  comes back with the scheduler's next task notes to it (:mod:`.propagation`), and
  :func:`worker_clock` keeps the estimate. distributed's own (``Worker.scheduler_delay``)
  is measured around a registration message the worker takes a while to build, and can
  be a tenth of a second off, with no bound said.
* **scheduler -> caller**: measured by the client on the messages it sends anyway.

Both are NTP-style. :class:`ClockEstimate` takes exchanges of four readings: one side
sends at ``t0`` (its clock), the scheduler receives at ``t1`` and answers at ``t2`` (its
clock), the answer arrives at ``t3``. The offset (that side's clock minus the
scheduler's) is ``((t0 - t1) + (t3 - t2)) / 2``, and the true offset lies within half the
round trip, ``((t3 - t0) - (t2 - t1)) / 2``, of it, however unevenly the two ways were
delayed. The client's exchanges are joining the cluster (:func:`.scheduler.join_cluster`)
and every traced compute (its context out, the scheduler's ``graph`` event back).

The client puts its estimate in every compute's note (:mod:`.note`), as a
:class:`Reading` that names the process it was taken in; a worker adds the note's offset
less its own to its runs' times. A worker in the caller's own process (an in-process
cluster) has the caller's clock, so its times stay as they are, without either
estimate's error. :func:`placement` is that rule, for task spans and for the
``dask.compute`` span of a compute that a task starts. Spans carry what was applied:
``dask.clock.correction`` (seconds added to the worker's own clock) and
``dask.clock.uncertainty`` (seconds either way). ``OTEL_GRAPH_CLOCK=local`` keeps each
process's own clock instead.

Of several exchanges the estimate is the one with the smallest error bound, the bound
growing with age at :data:`DRIFT` (NTP's allowance for a clock's drift). An exchange
whose interval does not overlap the estimate's means a clock stepped (a suspended VM, an
administrator): the older exchanges are dropped, and the compute sent meanwhile may be
off by the step.

>>> clock = ClockEstimate()
>>> clock.add(sent=10.000, received=13.004, replied=13.005, returned=10.010, now=0.0)
>>> clock.estimate_ns(now=0.0)  # the scheduler 3 s ahead: (offset, uncertainty) in ns
(-2999500000, 4500000)
>>> clock.add(sent=11.000, received=14.001, replied=14.001, returned=11.002, now=1.0)  # a quicker exchange
>>> clock.estimate_ns(now=1.0)
(-3000000000, 1000000)
"""

from __future__ import annotations

import secrets
import threading
import time
import weakref
from typing import Any, NamedTuple, Protocol

from opentelemetry.metrics import Observation

from otel_graph.conventions import observe

#: How fast an exchange's error bound grows with its age, in seconds a second (NTP's
#: PHI): a clock that drifts 15 ppm is off by 54 ms after an hour.
DRIFT = 15e-6
#: Exchanges kept per scheduler, the newest.
_KEPT = 8


#: This interpreter's name in a :class:`Reading`. A forked child keeps it, as it keeps
#: the clock.
PROCESS = secrets.token_hex(6)


class Reading(NamedTuple):
    """A process's clock minus its scheduler's, as a compute's note carries it."""

    offset_ns: int
    uncertainty_ns: int  # either way
    process: str  # the :data:`PROCESS` of the process whose clock it is


class _Exchange(NamedTuple):
    offset_s: float  # caller minus scheduler
    bound_s: float  # half the round trip, at the time it was taken
    taken: float  # time.monotonic()


class ClockEstimate:
    """The offset of this process's clock from one scheduler's (this minus the scheduler), from exchanges.

    Thread-safe: exchanges come from the client's event loop, estimates are read by
    whatever thread opens a compute.
    """

    def __init__(self) -> None:
        self._exchanges: list[_Exchange] = []
        self._lock = threading.Lock()

    def add(self, *, sent: float, received: float, replied: float, returned: float,
            now: float | None = None) -> None:
        """One exchange: ``sent``/``returned`` on this process's clock, ``received``/``replied`` on the scheduler's."""
        round_trip = (returned - sent) - (replied - received)
        if not (round_trip >= 0 and replied >= received):  # NaN fails too
            return  # a clock stepped during the exchange, or a reading was not what it says
        taken = time.monotonic() if now is None else now
        exchange = _Exchange(((sent - received) + (returned - replied)) / 2, round_trip / 2, taken)
        with self._lock:
            best = self._best(taken)
            if best is not None and abs(exchange.offset_s - best.offset_s) > \
                    exchange.bound_s + best.bound_s + DRIFT * (taken - best.taken):
                self._exchanges.clear()  # the intervals do not meet: a clock stepped
            self._exchanges.append(exchange)
            del self._exchanges[:-_KEPT]

    def exchanged(self, readings: Any, returned: float) -> None:
        """:meth:`add` from a message's ``[sent, received, replied]``, where they are all there
        (an earlier otel_graph on the other side sends none)."""
        if isinstance(readings, (list, tuple)) and len(readings) == 3 and all(type(r) is float for r in readings):
            self.add(sent=readings[0], received=readings[1], replied=readings[2], returned=returned)

    def _best(self, now: float) -> _Exchange | None:
        if not self._exchanges:
            return None
        return min(self._exchanges, key=lambda e: e.bound_s + DRIFT * (now - e.taken))

    def offset_s(self, *, now: float | None = None) -> float | None:
        """This process's clock minus the scheduler's; None before any exchange."""
        with self._lock:
            best = self._best(time.monotonic() if now is None else now)
        return None if best is None else best.offset_s

    def estimate_ns(self, *, now: float | None = None) -> tuple[int, int] | None:
        """(:meth:`offset_s`, how far the true offset may lie from it either way) in integer
        nanoseconds, read together; None before any exchange."""
        now = time.monotonic() if now is None else now
        with self._lock:
            best = self._best(now)
        if best is None:
            return None
        return round(best.offset_s * 1e9), round((best.bound_s + DRIFT * (now - best.taken)) * 1e9)


class Clocks:
    """A client process's :class:`ClockEstimate` of each scheduler, by its address."""

    def __init__(self) -> None:
        self._by_scheduler: dict[str, ClockEstimate] = {}

    def exchanged(self, scheduler: str, readings: Any, returned: float) -> None:
        """An exchange with ``scheduler`` (:meth:`ClockEstimate.exchanged`)."""
        self._by_scheduler.setdefault(scheduler, ClockEstimate()).exchanged(readings, returned)

    def offset_s(self, scheduler: str) -> float | None:
        clock = self._by_scheduler.get(scheduler)
        return None if clock is None else clock.offset_s()

    def reading(self, scheduler: str) -> Reading | None:
        """This process's clock against ``scheduler``'s, for a note; None before any exchange."""
        clock = self._by_scheduler.get(scheduler)
        estimate = None if clock is None else clock.estimate_ns()
        return None if estimate is None else Reading(*estimate, PROCESS)

    def offsets(self) -> list[tuple[str, float]]:
        """(scheduler, this process's clock minus its) for each scheduler measured."""
        return [(scheduler, offset) for scheduler, clock in list(self._by_scheduler.items())
                if (offset := clock.offset_s()) is not None]


#: worker -> its clock against its scheduler's (:func:`worker_clock`).
_BY_WORKER: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def worker_clock(worker: Any) -> ClockEstimate:
    """The worker's clock against its scheduler's, from the exchanges on its stream (:mod:`.propagation`)."""
    clock = _BY_WORKER.get(worker)  # a ClockEstimate made only once: most calls find it
    return clock if clock is not None else _BY_WORKER.setdefault(worker, ClockEstimate())


def known_worker_clock(worker: Any) -> ClockEstimate | None:
    return _BY_WORKER.get(worker)


def placement(caller: Reading | None, here: tuple[int, int] | None) -> tuple[int, dict[str, float]]:
    """How to put this process's times for a compute on its caller's timeline: the
    nanoseconds to add, and the ``dask.clock.*`` attributes that say so (empty: none
    applied). ``caller`` is the note's reading; ``here``, this worker's clock minus the
    scheduler's and its uncertainty, in ns, as it is now: the caller's clock minus this
    one's is the note's offset less it. In the caller's own process it is the caller's
    clock: nothing to move, nothing uncertain.

    >>> placement(Reading(-3_000_000_000, 1_000_000, "elsewhere"), (0, 500_000))
    (-3000000000, {'dask.clock.correction': -3.0, 'dask.clock.uncertainty': 0.0015})
    >>> placement(Reading(-3_000_000_000, 1_000_000, "elsewhere"), None)  # not measured here yet
    (0, {})
    """
    if caller is not None and caller.process == PROCESS:
        return 0, {"dask.clock.correction": 0.0, "dask.clock.uncertainty": 0.0}
    if caller is None or here is None:
        return 0, {}
    shift_ns = caller.offset_ns - here[0]
    return shift_ns, {"dask.clock.correction": shift_ns / 1e9,
                      "dask.clock.uncertainty": (caller.uncertainty_ns + here[1]) / 1e9}


def worker_placement(worker: Any, caller: Reading | None) -> tuple[int, dict[str, float]]:
    """:func:`placement` for ``worker``, with its estimate as it is now."""
    clock = known_worker_clock(worker) if worker is not None else None
    return placement(caller, clock.estimate_ns() if clock is not None else None)


class Offsets(Protocol):
    def offsets(self) -> list[tuple[str, float]]:
        """(scheduler address, this process's clock minus that scheduler's), for each one measured."""
        ...


#: meter provider -> what its ``dask.clock.offset`` gauge reads (held weakly): a client's
#: :class:`Clocks` and a worker process's workers may share a process (an in-process
#: cluster), and a provider gets the gauge once.
_READERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def observe_offsets(meter_provider: Any, source: Offsets) -> None:
    """Publish ``source.offsets()`` as ``dask.clock.offset`` on ``meter_provider``, beside
    what the provider's gauge reads already; for as long as ``source`` lives."""
    readers = _READERS.get(meter_provider)
    if readers is not None:
        readers.add(source)
        return
    readers = _READERS[meter_provider] = weakref.WeakSet([source])

    def callback(options: Any) -> list[Observation]:
        points = []
        for reader in list(readers):
            try:
                points += [Observation(offset, {"dask.scheduler.address": scheduler})
                           for scheduler, offset in reader.offsets()]
            except Exception:  # a changed internal costs the reading, never the export
                continue
        return points

    from otel_graph.telemetry.process_state import SCOPE

    observe(meter_provider.get_meter(SCOPE.name, SCOPE.version), "dask.clock.offset", [callback])
