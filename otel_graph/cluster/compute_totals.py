"""On the scheduler: each traced compute's failed tasks and result bytes, for its job's metrics.

A dask.distributed compute's tasks run on the workers, so the client that submitted it
cannot count them, and no worker sees all of them; the scheduler does. Each compute's
``dask.compute.failed_tasks`` and ``dask.compute.output.size`` points
(:mod:`otel_graph.telemetry.job`) come from a tally the scheduler plugin keeps here:

* a graph update from an instrumented client, with the compute's note
  (:mod:`.propagation`), opens one :class:`_Tally` for the note, and waits for the
  update's output keys that are not in memory or erred already (:meth:`ComputeTotals.expect`);
* every run of one of the compute's tasks that ends (``processing -> memory|erred``) adds
  a failure or its result's bytes (``TaskState.nbytes``, as the worker measured them) to
  the tally (:meth:`ComputeTotals.ran`): a dict lookup a run;
* when the last output key it waits for settles (in memory, erred, or forgotten: the
  client cancelled), the tally is done (:meth:`ComputeTotals.settled`) and the plugin
  sends it to the submitting client only. It goes out before the scheduler tells the
  client of that key (the report goes at the end of the scheduler's step, the tally in
  it, on the same stream), so the client has it when the compute's call returns. The
  first output that errs before the others settle sends what was counted so far at
  once, and the rest follows when they do: ``dask.compute`` or a ``get`` raises at its
  first failed output, and its failure must be in what its client heard.
* outputs in memory or erred already when the update comes settle at once: the tally
  (zeros) goes out in the same scheduler step as the reports of those outputs, just
  after them (distributed reports them before its plugins hear of the update). The
  client handles one step's messages in one go, before anything waiting on its futures
  runs, so it still has the tally in time.

A task that several computes share counts for the one whose graph brought it (the note
it was given); a run done again (its worker lost) counts again, as it ran again; a task
that fails and is retried (``retries=``) is no failure. A compute of several graph
updates gets one tally per update, which its client adds up, as it adds the parts an
erred output sends. Tallies are bounded: past
:data:`MAX_COMPUTES` open at once the oldest is dropped, and its compute reports its
totals as unknown, never as zero (unless it sent a part at a failed output already:
then what it reports is that part). An output that had failed already when the update
came makes a ``get`` raise at once, before any tally: its totals are unknown.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Any, NamedTuple

#: Computes whose totals the scheduler keeps at once.
MAX_COMPUTES = 4096


class Totals(NamedTuple):
    """A compute's totals (or, at its first failed output, the part counted so far), to send
    to the client that submitted it, which adds them up."""

    note: str
    client: str
    failed: int
    nbytes: int


class _Tally:
    """One compute's counts since it last sent them, and the output keys it waits for."""

    __slots__ = ("client", "keys", "waiting", "failed", "nbytes", "sent_part")

    def __init__(self, client: str) -> None:
        self.client = client
        self.keys: list[Any] = []  # the output keys it waits for
        self.waiting = 0  # of those, yet to settle
        self.sent_part = False  # at its first failed output
        self.failed = 0
        self.nbytes = 0

    def totals(self, note: str) -> Totals:
        return Totals(note, self.client, self.failed, self.nbytes)


class ComputeTotals:
    """The scheduler's open tallies, by compute note, and the output keys they wait for."""

    def __init__(self, *, max_computes: int = MAX_COMPUTES) -> None:
        self._tallies: OrderedDict[str, _Tally] = OrderedDict()
        #: output key -> the notes of the computes waiting for it (usually one).
        self.awaited: dict[Any, list[str]] = {}
        self._max = max_computes

    def __len__(self) -> int:
        return len(self._tallies)

    def expect(self, note: str, client: str, outputs: Iterable[Any]) -> Totals | None:
        """A graph update of the compute with this note, whose ``outputs`` are yet to
        settle; its totals at once (nothing to run) when there are none."""
        done = self._tallies.pop(note, None)  # a compute's earlier update, still running: one tally
        tally = _Tally(client) if done is None else done
        for key in outputs:
            notes = self.awaited.setdefault(key, [])
            if note not in notes:
                notes.append(note)
                tally.keys.append(key)
                tally.waiting += 1
        if not tally.waiting:
            return tally.totals(note)
        self._tallies[note] = tally
        while len(self._tallies) > self._max:
            self._drop(*self._tallies.popitem(last=False))
        return None

    def ran(self, note: str, *, failed: bool, nbytes: int) -> None:
        """A run of one of the compute's tasks ended: a failure, or a result of ``nbytes`` (-1 unknown)."""
        tally = self._tallies.get(note)
        if tally is None:
            return
        if failed:
            tally.failed += 1
        elif nbytes > 0:
            tally.nbytes += nbytes

    def settled(self, key: Any, *, erred: bool = False) -> list[Totals]:
        """An output key is in memory, erred or forgotten: what to send of the computes waiting
        for it. Their totals, for those it ends; for those it does not end but ``erred`` (their
        first failed output), what they counted so far, their tallies going on from zero (a
        call that returns results raises at its first failed output, before the others settle)."""
        sent = []
        for note in self.awaited.pop(key, ()):
            tally = self._tallies.get(note)
            if tally is None:
                continue
            tally.waiting -= 1
            if tally.waiting <= 0:
                del self._tallies[note]
                sent.append(tally.totals(note))
            elif erred and not tally.sent_part:  # once: its other failed outputs' counts follow at the end
                tally.sent_part = True
                sent.append(tally.totals(note))
                tally.failed = tally.nbytes = 0
        return sent

    def client_gone(self, client: str) -> None:
        """The client left the scheduler: nobody is there to send its computes' totals to."""
        for note, tally in list(self._tallies.items()):
            if tally.client == client:
                del self._tallies[note]
                self._drop(note, tally)

    def _drop(self, note: str, tally: _Tally) -> None:
        """Stop waiting for a tally that will never be sent (bounded, or its client gone)."""
        for key in tally.keys:
            notes = self.awaited.get(key)
            if notes is not None and note in notes:
                notes.remove(note)
                if not notes:
                    del self.awaited[key]
