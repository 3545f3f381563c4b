"""How a compute's trace context travels from the client to every task on every worker.

Nothing of it is visible to Dask: no task annotation, no change to the graph, to
``Computation`` records or to what other plugins receive. It travels on distributed's own
ordered streams, in messages of otel_graph's own, and only to processes that said they
read them (a stream message nobody handles would close the connection):

1. **client -> scheduler**, just before the ``update-graph`` message that sends a traced
   call's graph, on the same stream: ``{"op": COMPUTE_OP, "note": ..., "sample": key}``.
   The scheduler handles its client streams in order, so the next ``update_graph`` from
   that client is the compute's; ``sample`` (one of the graph's output keys) guards
   against a graph the scheduler refused before its plugins saw it.
2. **on the scheduler**, :class:`Routes` gives every task the update brought, and had no
   note yet, the compute's note (one shared string: a dict entry a task), and drops it
   when the task is forgotten.
3. **scheduler -> worker**: when a task is sent to a worker (``-> processing``, or a
   steal the thief confirmed), the worker's stream gets ``{"op": TASKS_OP, "note": ...,
   "keys": [...]}`` ahead of the ``compute-task`` messages of the same step: one message
   per worker, compute and scheduler step. The worker keeps each task's note until the
   task has run (:func:`take_note`); the scheduler sends it again with every new run.
   Where the worker said something since the last such message, it carries the
   readings that make that a clock exchange (``"clock": [sent, received, replied]``,
   :mod:`.clock`). Only to workers that said they read them (:func:`say_listening`): a worker without
   otel_graph, or of an earlier one, would close its stream on an op it does not know.
   A worker says so once its stream is up, so the first tasks sent to a new worker go
   before: the scheduler keeps their keys and hands their notes over when it hears from
   the worker (:meth:`Routes.heard`), and the worker holds the runs it has no note for
   until then (:func:`awaiting_notes`).

A note (:mod:`.note`) is one short string: the compute span's trace context, its task
span budget, and the caller's clock.
"""

from __future__ import annotations

import logging
import time
import weakref
from typing import Any

from otel_graph.cluster import adapter
from otel_graph.cluster.clock import worker_clock
from otel_graph.cluster.note import traceparent_of

logger = logging.getLogger("otel_graph")

#: Client -> scheduler: the note of the graph that follows on the same stream.
COMPUTE_OP = "otel-graph-compute"
#: Scheduler -> worker: the note of tasks sent to that worker.
TASKS_OP = "otel-graph-tasks"
#: Clients whose next graph has not arrived, at most (a client that vanished mid-send).
_MAX_EXPECTED = 4096
#: Traced tasks a worker that has not yet said it reads their notes may be sent, at most.
_MAX_WAITING = 100_000
#: How long the scheduler keeps the keys of a worker that has not said it reads notes: a
#: worker without otel_graph (or of an earlier one) never says so.
_WAIT_S = 60.0


# -- client -------------------------------------------------------------------------------
def compute_message(note: str, keys: Any) -> dict[str, Any]:
    """What the client sends just before the ``update-graph`` message whose ``keys`` these are;
    ``sent`` (the client's clock, for :mod:`.clock`) is set as it goes."""
    return {"op": COMPUTE_OP, "note": note, "sample": next(iter(keys), None), "sent": None}


# -- scheduler ----------------------------------------------------------------------------
class Routes:
    """The scheduler's side: which note each task has, and handing it to the task's worker."""

    def __init__(self) -> None:
        #: client id -> (sample key, note, the client's and the scheduler's clocks as it
        #: came) of the graph it sends next.
        self._expected: dict[str, tuple[Any, str, Any, float]] = {}
        #: task key -> note, from the update that brought the task until it is forgotten.
        self.notes: dict[Any, str] = {}
        #: Workers that said they read TASKS_OP (:func:`say_listening`), on their current stream.
        self.ready: set[str] = set()
        #: worker -> (since, keys of traced tasks sent there before it said it reads their
        #: notes): handed over when it does, forgotten after :data:`_WAIT_S`.
        self._waiting: dict[str, tuple[float, set[Any]]] = {}
        #: worker -> (stimulus id, note, stream, position, message): the message of this step,
        #: while it is still unsent at that position of the stream's buffer.
        self._open: dict[str, tuple[str, str, Any, int, dict]] = {}
        #: worker -> (its clock as it last said something, the scheduler's as it heard it):
        #: the next TASKS_OP message there completes that clock exchange (:mod:`.clock`).
        self._said_at: dict[str, tuple[float, float]] = {}
        self.handed = 0  # task notes handed to workers
        self.unready = 0  # tasks of a traced compute whose worker could not be handed their note

    def expect(self, client: str, note: Any, sample: Any, *, sent: Any = None) -> None:
        if not isinstance(note, str) or traceparent_of(note) is None:
            return
        self._expected.pop(client, None)
        self._expected[client] = (sample, note, sent, time.time())
        if len(self._expected) > _MAX_EXPECTED:
            self._expected.pop(next(iter(self._expected)))

    def claim(self, client: str, keys: Any, tasks: Any) -> tuple[str, Any, float] | None:
        """The note of this update from ``client``, given to its tasks that have none, with
        when the client sent it (its clock) and the scheduler got it; None if untraced."""
        expected = self._expected.pop(client, None)  # for this update or none: never a later one
        if expected is None:
            return None
        sample, note, sent, received = expected
        try:
            if sample is not None and sample not in keys:
                return None  # the graph it announced was refused before plugins saw it
        except TypeError:
            return None
        notes = self.notes
        for key in tasks:
            if key not in notes:
                notes[key] = note
        return note, sent, received

    def forget(self, key: Any) -> None:
        self.notes.pop(key, None)

    def client_gone(self, client: str) -> None:
        self._expected.pop(client, None)

    def said_at(self, address: str, sent: Any) -> None:
        """The worker at ``address`` said something it sent at ``sent`` (its clock)."""
        if type(sent) is float:
            self._said_at[address] = (sent, time.time())

    def _with_clock(self, address: str, message: dict[str, Any]) -> dict[str, Any]:
        said = self._said_at.pop(address, None) if self._said_at else None
        if said is not None:
            message["clock"] = [*said, time.time()]  # sent, received, replied
        return message

    def hand_over(self, scheduler: Any, key: Any, stimulus_id: str) -> None:
        """Send the task's note to the worker it was just sent to (its stream, ahead of the task)."""
        note = self.notes.get(key)
        if note is None:
            return
        address = adapter.processing_on(scheduler, key)
        if address is None:
            return
        if address not in self.ready:
            self._wait(address, key)
            return
        stream = adapter.worker_stream(scheduler, address)
        if stream is None:
            return
        buffer = adapter.unsent(stream)
        slot = self._open.get(address)
        # Same step, same compute, and the message not yet written (still at its place in
        # the stream's buffer, which is swapped for a new list at every write): one more key.
        if slot is not None and slot[0] == stimulus_id and slot[1] is note and slot[2] is stream \
                and buffer is not None and slot[3] < len(buffer) and buffer[slot[3]] is slot[4]:
            slot[4]["keys"].append(key)
        else:
            message = self._with_clock(address, {"op": TASKS_OP, "note": note, "keys": [key]})
            stream.send(message)
            position = len(buffer) - 1 if buffer is not None and buffer and buffer[-1] is message else -1
            self._open[address] = (stimulus_id, note, stream, position, message)
        self.handed += 1

    def _wait(self, address: str, key: Any) -> None:
        now = time.monotonic()
        since, keys = self._waiting.setdefault(address, (now, set()))
        if now - since > _WAIT_S:  # it never said so: its tasks run without their context
            if keys:
                logger.warning("otel_graph: worker %s never said it reads task contexts (a worker without "
                               "otel_graph, or of another version): its tasks run without task spans", address)
            self.unready += len(keys) + 1
            keys.clear()
        elif len(keys) < _MAX_WAITING:
            keys.add(key)
        else:
            self.unready += 1

    def counted(self, address: str, key: Any, note: str | None) -> str | None:
        """``note``, the note of a run of ``key`` that finished on ``address`` (``notes[key]``),
        if the worker had it (or will): only such a run has spans to deliver, or to lose."""
        if note is None or address in self.ready:
            return note
        waiting = self._waiting.get(address)
        return note if waiting is not None and key in waiting[1] else None

    def heard(self, scheduler: Any, address: str) -> None:
        """The worker said it reads TASKS_OP: hand it the notes of the tasks sent there
        before, then say it was heard (a worker holds the runs it finds no note for until
        then, and takes their notes once more when it hears this)."""
        if address in self.ready or address not in getattr(scheduler, "workers", ()):
            return
        stream = adapter.worker_stream(scheduler, address)
        if stream is None:
            return
        by_note: dict[str, list[Any]] = {}
        for key in (self._waiting.get(address) or (0.0, ()))[1]:
            note = self.notes.get(key)
            if note is not None:
                by_note.setdefault(note, []).append(key)
        # Ready only once all went: a send that fails (the stream broke) leaves it waiting.
        for note, keys in by_note.items():
            stream.send({"op": TASKS_OP, "note": note, "keys": keys})
        stream.send(self._with_clock(address, {"op": TASKS_OP, "note": None, "keys": [], "heard": True}))
        self._waiting.pop(address, None)
        self.ready.add(address)
        self.handed += sum(len(keys) for keys in by_note.values())

    def worker_gone(self, address: str) -> None:
        self._said_at.pop(address, None)
        self.ready.discard(address)
        self._waiting.pop(address, None)
        self._open.pop(address, None)


def on_compute(scheduler_ref: weakref.ref, plugin_name: str) -> Any:
    """The scheduler's handler of COMPUTE_OP (left in place: a client may still send one)."""

    def handle(client: str = "", note: Any = None, sample: Any = None, sent: Any = None, **_: Any) -> None:
        try:  # a handler that raises closes the client's stream
            scheduler = scheduler_ref()
            plugin = scheduler.plugins.get(plugin_name) if scheduler is not None else None
            routes = getattr(plugin, "routes", None)
            if isinstance(routes, Routes) and client:
                routes.expect(str(client), note, sample, sent=sent)
        except Exception:
            logger.debug("otel_graph: unreadable compute context", exc_info=True)

    return handle


# -- worker -------------------------------------------------------------------------------
#: worker -> {task key: note}, for the tasks the worker holds.
_WORKER_NOTES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: worker -> the connection to its scheduler on which the scheduler said it heard the worker.
_HEARD: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: worker -> (connection, time.monotonic()) of when it said it reads notes on that connection.
_SAID: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


#: The scheduler's note of what a worker said (:func:`.adapter.say_to_scheduler`): it reads TASKS_OP.
LISTENING = {"reads": [TASKS_OP]}
_SAYING: set[Any] = set()  # asyncio tasks in flight: an unreferenced task may vanish


def say_listening(worker: Any) -> None:
    """Tell the worker's scheduler that it reads TASKS_OP, once its stream is up: a worker
    sets its plugins up before it starts its stream (which may take a while: a scheduler
    not up yet). The scheduler remembers it for the worker's connection, so a scheduler
    plugin registered later learns it too (see ``scheduler._hear_again``)."""
    import asyncio

    async def say() -> None:
        pause = 0.01
        while not adapter.stream_open(worker):
            if adapter.is_closing(worker):
                return
            await asyncio.sleep(pause)  # nothing to wait on: distributed signals no connect
            pause = min(pause * 2, 0.25)
        _SAID[worker] = (adapter.scheduler_connection(worker), time.monotonic())
        adapter.say_to_scheduler(worker, LISTENING)

    task = asyncio.ensure_future(say())
    _SAYING.add(task)
    task.add_done_callback(_SAYING.discard)


def heard_listening(payload: Any) -> bool:
    """Whether what a worker said (:func:`.adapter.say_to_scheduler`) says it reads TASKS_OP."""
    return isinstance(payload, dict) and TASKS_OP in (payload.get("reads") or ())


def listen_on_worker(worker: Any) -> None:
    """Read TASKS_OP on ``worker``'s stream from now on (idempotent; never removed)."""
    if worker in _WORKER_NOTES:
        return
    notes: dict[Any, str] = {}
    _WORKER_NOTES[worker] = notes
    worker_ref = weakref.ref(worker)

    def handle(note: Any = None, keys: Any = (), heard: Any = False, clock: Any = None, **_: Any) -> None:
        returned = time.time()
        worker = worker_ref()
        if heard is True and worker is not None:
            _HEARD[worker] = adapter.scheduler_connection(worker)
        if clock is not None and worker is not None:
            worker_clock(worker).exchanged(clock, returned)
        if not isinstance(note, str):
            return
        try:
            if worker is not None and len(notes) > 2 * adapter.task_count(worker) + 10_000:
                _prune(worker, notes)  # before these keys: their tasks come after this message
            for key in keys:
                notes[key] = note
        except Exception:  # a malformed message costs its notes, never the worker's stream
            logger.debug("otel_graph: unreadable task notes", exc_info=True)

    adapter.add_stream_handler(worker, TASKS_OP, handle)


def _prune(worker: Any, notes: dict[Any, str]) -> None:
    """Drop notes of tasks the worker no longer holds: tasks released before they ran.

    Not when the worker forgets a task: a note handed over for a task's next run can reach
    the worker ahead of the message that frees the task's last one (the scheduler sends
    notes as it decides, its other messages at the end of the step).
    """
    held = adapter.held_keys(worker)
    for key in [key for key in list(notes) if key not in held]:
        del notes[key]


def awaiting_notes(worker: Any, *, within_s: float) -> bool:
    """Whether notes of tasks already run may still come: the scheduler has not said, on
    the current connection, that it heard the worker read them (from then on every task's
    note comes ahead of the task), and the worker said so less than ``within_s`` ago, or
    is about to. A scheduler silent for longer reads no notes (no plugin of ours)."""
    connection = adapter.scheduler_connection(worker)
    if connection is None or _HEARD.get(worker) is connection:
        return False
    said = _SAID.get(worker)
    # Not said yet on this connection: it is about to (say_listening polls for the stream).
    return said is None or said[0] is not connection or time.monotonic() - said[1] < within_s


def note_of(worker: Any, key: Any) -> str | None:
    notes = _WORKER_NOTES.get(worker)
    return notes.get(key) if notes is not None else None


def take_note(worker: Any, key: Any) -> str | None:
    """The note of a task that just ran, which the worker keeps no longer."""
    notes = _WORKER_NOTES.get(worker)
    return notes.pop(key, None) if notes else None


def current_task_note() -> str | None:
    """The note of the task running on this thread, when called from inside a task."""
    found = adapter.current_task(default=None)
    return note_of(*found) if found is not None else None


def seal_env(env: dict[str, str]) -> bytes:
    """The client's ``OTEL_*`` settings as they travel inside a plugin: compressed.

    distributed logs whole messages at DEBUG, pickled plugins included; compressed, the
    settings (exporter headers carry credentials) never appear there as text. This keeps
    them out of logs; it is not encryption (secure the cluster's comms with TLS for that).

    >>> unseal_env(seal_env({"OTEL_EXPORTER_OTLP_HEADERS": "authorization=secret"}))
    {'OTEL_EXPORTER_OTLP_HEADERS': 'authorization=secret'}
    >>> b"secret" in seal_env({"OTEL_EXPORTER_OTLP_HEADERS": "authorization=secret"})
    False
    """
    import json
    import zlib

    return zlib.compress(json.dumps(env).encode(), 9)


def unseal_env(sealed: bytes) -> dict[str, str]:
    import json
    import zlib

    try:
        env = json.loads(zlib.decompress(sealed))
    except Exception:
        return {}
    return {str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else {}
