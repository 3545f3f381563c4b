"""Every read of dask.distributed internals, in one place.

distributed's docs say worker and scheduler state "change without deprecation", so
nothing else in otel_graph touches them: when a release moves a field, this module is
the one to fix. Checked against distributed 2026.8:

* ``WorkerPlugin.transition`` gets only ``(key, start, finish)``; the task's record is
  ``worker.state.tasks[key]``: ``startstops``, ``nbytes``, ``type``, ``annotations``,
  ``dependencies``/``dependents``, ``exception``/``traceback_text``, ``run_spec``;
  the thread that ran it is ``worker.state.threads[key]``.
* ``compute`` and ``transfer`` start/stops are on the *scheduler's* clock (the
  worker adds ``worker.scheduler_delay``); ``disk-read``/``disk-write`` are on the
  worker's own. :func:`task_run` puts them all back on the worker's clock.
* transfers are logged with their bytes in ``worker.transfer_incoming_log``.
* the worker's stream to the scheduler is ``worker.batched_stream`` (a ``BatchedSend``:
  ``comm`` while connected, ``close()`` sends what it holds first; ``buffer``, the list
  of messages not yet written, replaced by a new list at every write).
* the scheduler's ``keep-alive`` stream handler takes any keywords and ignores them.
* streams: every ``Server`` dispatches stream messages by ``op`` through its
  ``stream_handlers`` dict, in order, awaiting each; an op it has no handler for closes
  the stream. The scheduler's stream to each worker is ``stream_comms[address]``; the
  client's to the scheduler is ``scheduler_comm``, a new ``BatchedSend`` at each connect.
* events: the scheduler's ``_broker._topics[name]`` (``subscribers``: client ids) and
  ``send_all``; the client handles ``{"op": "event", "topic", "event": (time, msg)}``.
* scheduler: ``task_prefixes[*].states`` (current counts), ``workers[*].memory`` (a
  ``MemoryState``) and ``workers[*].memory_limit``; ``SchedulerPlugin.transition``'s
  keywords for ``processing -> memory|erred`` (the worker's message: ``worker``,
  ``startstops``), ``tasks[key].processing_on`` and ``.prefix.name``; a confirmed steal
  is the event ``("confirm", key, state, victim, thief, stimulus_id)`` on the
  ``stealing`` topic, after the task was sent to the thief.
* client: ``_scheduler_identity`` (``n_workers``, and ``id``, which changes when the
  client reconnects to a scheduler started anew), ``_state`` of a future, ``_started``.
* fine performance metrics: ``Scheduler.cumulative_worker_metrics`` (keys ``(context,
  *parts, activity, unit)``), and by span in ``extensions["spans"].spans[id].
  _cumulative_worker_metrics`` for the ``execute`` and ``p2p`` contexts.

Every function here tolerates a missing field by returning less, never by raising.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from itertools import islice
from typing import Any, NamedTuple

from otel_graph.naming import MAX_DEPENDENCIES, safe_text

from otel_graph.telemetry.events import ErrorInfo, describe_exception

logger = logging.getLogger("otel_graph")

#: Entries of a worker's transfer log searched, newest first, for the transfer that fetched a
#: dependency: it is recent when its task's phases are read.
_TRANSFER_LOOKBACK = 64


class Phase(NamedTuple):
    """A non-compute part of a task's run: fetching its inputs, or spilling."""

    action: str  # transfer | disk-read | disk-write
    start_ns: int
    end_ns: int
    source: str | None  # the worker a transfer came from
    nbytes: int | None


class TaskRun(NamedTuple):
    """What a worker knows about one finished run of a task, as plain values.

    One flat record per run (TaskEvent's fields first, so the span budget and the task
    metrics take it as it is): a worker may hold thousands between two drains.
    """

    key: Any
    start_ns: int
    end_ns: int
    worker: str  # the worker's address
    thread: int
    nbytes: int
    type_name: str
    error: ErrorInfo | None
    note: Any  # the compute's note (:mod:`.propagation`); None for an untraced task
    retries: int
    phases: tuple[Phase, ...]
    dependencies: tuple[Any, ...]
    dependency_count: int
    dependent_count: int
    run_spec: Any  # None once `functions` has been read from it
    functions: str | None = None
    attempt: int = 1  # 1 + earlier failed runs of this key in its compute here; set by the worker


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def worker_identity(worker: Any) -> tuple[str, str]:
    """(address, name) of a worker."""
    name = getattr(worker, "name", None)  # often the integer 0: falsy, but a name
    return safe_text(str(getattr(worker, "address", "") or "")), "" if name is None else safe_text(str(name))


def task_run(worker: Any, key: Any, *, note: Any, address: str) -> TaskRun | None:
    """Read a task that just left ``executing``; None if the worker no longer has it."""
    ts = worker.state.tasks.get(key)
    if ts is None:
        return None
    from distributed.metrics import time as worker_time  # the clock distributed stamps startstops with

    now = worker_time()
    delay = getattr(worker, "scheduler_delay", 0.0) or 0.0
    start = end = None
    # startstops is one list across retries of the task: keep the phases that led up to
    # the last compute (since the one before it) and those after it (its disk-write).
    leading: list[Phase] = []
    since: list[Phase] = []
    for entry in ts.startstops or ():
        action = entry.get("action")
        on_worker_clock = action in ("disk-read", "disk-write")
        offset = 0.0 if on_worker_clock else delay
        began, ended = entry["start"] - offset, entry["stop"] - offset
        if action == "compute":
            start, end = began, ended
            leading, since = since, []
        elif action in ("transfer", "disk-read", "disk-write"):
            source = entry.get("source")
            nbytes = _transfer_bytes(worker, entry) if action == "transfer" else None
            since.append(Phase(action, _ns(began), _ns(ended), source, nbytes))
    phases = leading + since
    if start is None:
        return None  # it never ran here (cancelled before executing)
    # The worker stamped the compute with the scheduler_delay of when it began; a heartbeat may
    # have changed it since. Read as ending after now, it ended that much earlier: else its
    # span could end after the compute that waited for it (the client's root of a persist).
    excess = end - now
    if excess > 0:
        start, end, shift = start - excess, end - excess, _ns(excess)
        phases = [p if p.action in ("disk-read", "disk-write") else
                  p._replace(start_ns=p.start_ns - shift, end_ns=p.end_ns - shift) for p in phases]
    annotations = ts.annotations or {}
    dependencies = ts.dependencies
    return TaskRun(
        key=key, start_ns=_ns(start), end_ns=_ns(end), worker=address,
        thread=int(worker.state.threads.get(key, 0) or 0),
        nbytes=int(ts.nbytes) if ts.nbytes is not None else -1,
        type_name=_type_name(ts.type),
        error=_error(ts) if ts.state == "error" else None,
        note=note,
        retries=int(annotations.get("retries") or 0),
        phases=tuple(phases),
        dependencies=tuple(dep.key for dep in islice(dependencies, MAX_DEPENDENCIES)),
        dependency_count=len(dependencies),
        dependent_count=len(ts.dependents),
        run_spec=ts.run_spec,
    )


def _type_name(kind: Any) -> str:
    if kind is None:
        return ""
    return getattr(kind, "__qualname__", None) or str(kind)


def _error(ts: Any) -> ErrorInfo:
    exception = getattr(ts.exception, "data", ts.exception)
    if isinstance(exception, (bytes, bytearray, memoryview)):
        # The worker keeps the exception pickled (distributed.core.error_message); it made
        # these bytes itself from the task's own exception and checked that they load.
        try:
            import pickle

            exception = pickle.loads(exception)
        except Exception:
            exception = None
    if isinstance(exception, BaseException):
        # The core's naming and bounds; the stack is the worker's text (this copy has none).
        described = describe_exception(exception)
        type_name, message = described.type_name, described.message
    else:
        text = ts.exception_text or ""
        type_name, message = text.split("(", 1)[0] or "Exception", text
    stack = ts.traceback_text or ""
    return ErrorInfo(type_name, message, f"{stack}{type_name}: {message}")


def _transfer_bytes(worker: Any, entry: dict) -> int | None:
    log = getattr(worker, "transfer_incoming_log", None)
    if not log:
        return None
    # The log holds the same (scheduler-clock) start; the transfer is recent, so look back a little.
    for record in islice(reversed(log), _TRANSFER_LOOKBACK):
        if record.get("start") == entry["start"] and record.get("who") == entry.get("source"):
            return int(record.get("total", 0))
    return None


def spill_totals(worker: Any) -> dict[tuple[str, str], float]:
    """Spilling since the worker started: {(disk-write|disk-read, bytes|count|seconds): total}.

    From ``worker.digests_total``, whose keys end in ``(..., activity, unit)``; summed
    over what caused it (executing a task, gathering dependencies, ...).
    """
    totals: dict[tuple[str, str], float] = {}
    for key, value in dict(worker.digests_total).items():
        if isinstance(key, tuple) and len(key) >= 2 and key[-2] in ("disk-write", "disk-read"):
            pair = (key[-2], key[-1])
            totals[pair] = totals.get(pair, 0.0) + float(value)
    return totals


def watch_futures(client: Any, futures: Iterable[Any], settled: Any, *, done: Any) -> None:
    """Call ``settled(key, status, error)`` once per future: finished, error, cancelled, or
    released; then ``done()``. All on the client's loop, one after another.

    Waits on each future's shared state (``future._state``), never on the future: holding
    the future would keep its key alive on the cluster after the user dropped it. A key
    the client let go of (every future of it dropped) has its state cancelled, with no
    reference left: that settles as ``released``; a key cancelled by a restart of the
    scheduler stays ``cancelled``. One coroutine on the client's loop waits on the
    states in turn (all must end before the compute does): a watcher per future (a
    callback handed to the loop, a finalizer and a lock each) made ``map`` of 2,000
    tasks take 0.14-0.32 s instead of 0.005 s, and held ~4 kB per pending future.
    """
    watched = [(future._state, future.key) for future in futures]

    async def wait_all() -> None:
        for state, key in watched:
            try:
                await state.wait()
            except Exception:  # the client closed under us: the future is gone either way
                settled(key, "cancelled", None)
                continue
            status, error = state.status, state.exception
            if status == "cancelled" and not client.refcount.get(key) and \
                    getattr(error, "reason", None) != "scheduler-restart":
                status = "released"
            settled(key, status, error if status == "error" and isinstance(error, BaseException) else None)
        done()

    client.loop.add_callback(wait_all)


def stream_open(worker: Any) -> bool:
    """Whether the worker's stream to the scheduler is up (``Worker.batched_send`` drops
    messages silently while it is not)."""
    comm = getattr(getattr(worker, "batched_stream", None), "comm", None)
    return comm is not None and not comm.closed()


def scheduler_connection(worker: Any) -> Any:
    """The connection under the worker's stream to its scheduler (a new one at every
    reconnect); None while there is none."""
    return getattr(getattr(worker, "batched_stream", None), "comm", None)


def say_to_scheduler(worker: Any, payload: Any) -> None:
    """Send ``payload`` to the worker's scheduler, from any thread, in order with the
    worker's own messages (as ``Worker.log_event`` does), as a ``keep-alive`` message
    (``{"op": "keep-alive", "otel_graph": payload}``): every scheduler handles that op,
    and ignores what it carries unless otel_graph's plugin reads it
    (:func:`read_worker_says`). Dropped while the worker is not connected."""
    message = {"op": "keep-alive", WORKER_SAYS: payload}
    if getattr(worker, "thread_id", None) == threading.get_ident():
        worker.batched_send(message)
    else:
        worker.loop.add_callback(worker.batched_send, message)


def close_stream(worker: Any, *, timeout_s: float) -> Any:
    """An awaitable that sends what the worker's stream to the scheduler holds, then closes
    it (``BatchedSend.close``); None when there is no stream."""
    stream = getattr(worker, "batched_stream", None)
    if stream is None or getattr(stream, "comm", None) is None:
        return None
    return stream.close(timeout=timeout_s)


def is_closing(worker: Any) -> bool:
    """True while a worker shuts down (not when a plugin is merely replaced or removed)."""
    status = getattr(getattr(worker, "status", None), "name", "")
    return status in ("closing", "closed", "closing_gracefully", "failed")


def scheduler_address(client: Any) -> str:
    scheduler = getattr(client, "scheduler", None)
    return str(getattr(scheduler, "address", "") or "")


def scheduler_id(client: Any) -> str | None:
    """The id of the scheduler the client last identified (``Scheduler-<uuid>``, one per scheduler process).

    From ``client._scheduler_identity``, which the client refreshes on (re)connecting
    and on calls such as ``scheduler_info`` or ``wait_for_workers``: no round trip.
    """
    identity = getattr(client, "_scheduler_identity", None) or {}
    value = identity.get("id") if hasattr(identity, "get") else None
    return str(value) if value else None


def chain_async_start(client: Any, then: Any) -> bool:
    """Make ``await Client(asynchronous=True)`` also await ``then()`` once the client is up.

    An asynchronous client starts in ``client._started``, which ``__await__`` awaits.
    """
    import asyncio

    started = getattr(client, "_started", None)
    if started is None:
        return False

    async def chained() -> Any:
        result = await started
        await then()
        return result

    client._started = asyncio.ensure_future(chained())
    return True


def current_task(*, default: Any = None) -> tuple[Any, Any] | Any:
    """(worker, key) of the task running on this thread, when called from inside a task."""
    try:
        from distributed.worker import get_worker, thread_state

        key = getattr(thread_state, "key", None)
        return (get_worker(), key) if key is not None else default
    except Exception:
        return default


def task_count(worker: Any) -> int:
    return len(worker.state.tasks)


def held_keys(worker: Any) -> Any:
    """The keys of the tasks a worker holds (a live view: test membership, do not keep)."""
    return worker.state.tasks


def add_stream_handler(server: Any, op: str, handler: Any) -> bool:
    """Handle ``op`` on the server's streams (``Server.stream_handlers``); an existing one stays.

    True if the server now handles ``op``. A handler is never taken away: a message of an
    op nobody handles makes the server close the stream it came on.
    """
    handlers = getattr(server, "stream_handlers", None)
    if not isinstance(handlers, dict):
        return False
    handlers.setdefault(op, handler)
    return True


#: The keyword a worker's ``keep-alive`` message carries otel_graph's payload in.
WORKER_SAYS = "otel_graph"


def read_worker_says(scheduler: Any, reader: Any) -> bool:
    """Wrap the scheduler's ``keep-alive`` handler (which takes and ignores anything) so
    that ``reader(worker, payload)`` gets what workers say with :func:`say_to_scheduler`.
    Idempotent; True if the scheduler now reads them. Left in place: workers may still say."""
    handlers = getattr(scheduler, "stream_handlers", None)
    original = handlers.get("keep-alive") if isinstance(handlers, dict) else None
    if original is None:
        return False
    if getattr(original, "otel_graph_reader", None) is not None:
        return True

    def keep_alive(*args: Any, **kwargs: Any) -> Any:
        payload = kwargs.pop(WORKER_SAYS, None)
        if payload is not None:
            try:
                reader(kwargs.get("worker"), payload)
            except Exception:  # what a worker says costs its telemetry, never the stream
                logger.debug("otel_graph: could not read what a worker said", exc_info=True)
        return original(*args, **kwargs)

    keep_alive.otel_graph_reader = reader  # type: ignore[attr-defined]
    handlers["keep-alive"] = keep_alive
    return True


def handles(server: Any, op: str) -> bool:
    return op in (getattr(server, "stream_handlers", None) or {})


# -- scheduler ------------------------------------------------------------------------------
def task_states(scheduler: Any) -> dict[str, int]:
    """Tasks the scheduler holds now, by state: O(prefixes), not O(tasks).

    From ``TaskPrefix.states`` (current counts). Not ``TaskPrefix.state_counts``: those
    count every task that ever passed through a state.
    """
    totals: dict[str, int] = {}
    for prefix in list(scheduler.task_prefixes.values()):
        for state, count in dict(prefix.states).items():
            if state != "forgotten":  # zeros too: a dashboard line at 0, not "no data"
                totals[state] = totals.get(state, 0) + count
    return totals


class FinishedRun(NamedTuple):
    """A run the scheduler just accepted as finished (``processing -> memory|erred``)."""

    note: Any  # the compute's note (:mod:`.propagation`); None for an untraced task
    prefix: str
    start_s: float  # its compute phase, on the scheduler's clock
    stop_s: float


def finished_run(scheduler: Any, key: Any, details: dict, *, note: Any) -> FinishedRun | None:
    """From ``SchedulerPlugin.transition``'s keywords (the worker's ``task-finished`` or
    ``task-erred`` message: ``worker``, ``startstops``); None for a task the scheduler no longer has."""
    ts = scheduler.tasks.get(key)
    if ts is None:
        return None
    start = stop = None
    for entry in details.get("startstops") or ():
        if isinstance(entry, dict) and entry.get("action") == "compute":
            start, stop = entry.get("start"), entry.get("stop")
    if not isinstance(start, (int, float)) or not isinstance(stop, (int, float)):
        import time

        start = stop = time.time()
    return FinishedRun(note, str(ts.prefix.name), float(start), float(stop))


def processing_on(scheduler: Any, key: Any) -> str | None:
    """The address of the worker a task was sent to; None if it is not processing."""
    ts = scheduler.tasks.get(key)
    ws = getattr(ts, "processing_on", None) if ts is not None else None
    return getattr(ws, "address", None)


def publish(scheduler: Any, topic: str, msg: Any) -> None:
    """Send ``msg`` to the clients subscribed to ``topic``, as an event of it, without the
    scheduler keeping it: ``Scheduler.log_event`` would also store it (``get_events()``,
    the dashboard) and pass it to every scheduler plugin. The message is the one distributed's
    event broker sends (``{"op": "event", "topic", "event": (time, msg)}``)."""
    topics = getattr(getattr(scheduler, "_broker", None), "_topics", None)
    if not isinstance(topics, dict):
        scheduler.log_event(topic, msg)  # a distributed without the broker: seen, not lost
        return
    found = topics.get(topic)  # .get: the defaultdict must not grow a topic nobody wants
    subscribers = getattr(found, "subscribers", None)
    if not subscribers:
        return
    event = {"op": "event", "topic": topic, "event": (time.time(), msg)}
    scheduler.send_all({client: [event] for client in list(subscribers)}, worker_msgs={})


def worker_state(scheduler: Any, address: str) -> Any:
    """The scheduler's ``WorkerState`` of a worker: a new one each time the worker
    (re)connects; None once it is gone."""
    workers = getattr(scheduler, "workers", None)
    return workers.get(address) if workers is not None else None


def worker_stream(scheduler: Any, address: str) -> Any:
    """The scheduler's stream to a worker (a ``BatchedSend``); None once it is gone."""
    return scheduler.stream_comms.get(address)


def unsent(stream: Any) -> list | None:
    """The list of messages a ``BatchedSend`` holds and has not written yet (it is swapped for
    a new one at every write); None where that is not readable."""
    buffer = getattr(stream, "buffer", None)
    return buffer if isinstance(buffer, list) else None


def stolen(msg: Any) -> tuple[Any, str] | None:
    """(key, thief) from a ``stealing`` event of a confirmed steal; None for any other."""
    if isinstance(msg, (tuple, list)) and len(msg) >= 5 and msg[0] == "confirm" and isinstance(msg[4], str):
        return msg[1], msg[4]
    return None


def scheduler_stream(client: Any) -> Any:
    """The client's stream to its scheduler (a new one at every reconnect); None if not connected."""
    return getattr(client, "scheduler_comm", None)


class WorkerMemory(NamedTuple):
    address: str
    name: str
    managed: int
    unmanaged: int
    spilled: int
    limit: int


def worker_memory(scheduler: Any) -> Iterable[WorkerMemory]:
    for ws in list(scheduler.workers.values()):
        memory = ws.memory
        yield WorkerMemory(safe_text(str(ws.address)), safe_text(str(ws.name)), int(memory.managed), int(memory.unmanaged),
                           int(memory.spilled), int(ws.memory_limit or 0))


def worker_count(scheduler: Any) -> int:
    return len(scheduler.workers)


def client_worker_count(client: Any) -> int:
    """Workers the client last heard of, without a round trip; at least 1."""
    identity = getattr(client, "_scheduler_identity", None) or {}
    count = identity.get("n_workers")  # "workers" may list only the first few
    if not isinstance(count, int):
        count = len(identity.get("workers", {}) or {})
    return max(1, count)


def is_scheduler(server: Any) -> bool:
    from distributed import Scheduler

    return isinstance(server, Scheduler)


#: Contexts whose fine metrics carry a span id on the workers, kept by span on the scheduler.
_FINE_BY_SPAN = ("execute", "p2p")


def fine_metric_readings(scheduler: Any) -> Iterable[tuple[str, str, tuple, float]]:
    """(span name or "", unit, key without span and unit, value): distributed's fine performance
    metrics on the scheduler, by span where the spans extension keeps them (``Span.
    _cumulative_worker_metrics``), the rest from ``Scheduler.cumulative_worker_metrics``."""
    spans = getattr(scheduler, "extensions", {}).get("spans")
    by_span = spans is not None and hasattr(spans, "spans")
    if by_span:
        for span in list(spans.spans.values()):
            name = "/".join(str(tag) for tag in span.name)
            for key, value in list(span._cumulative_worker_metrics.items()):
                if isinstance(key, tuple) and len(key) >= 3:
                    yield name, str(key[-1]), key[:-1], value
    for key, value in list(scheduler.cumulative_worker_metrics.items()):
        if not isinstance(key, tuple) or len(key) < 3:
            continue  # older, flat keys
        if by_span and key[0] in _FINE_BY_SPAN:
            continue  # counted by span above (the same seconds, with the span's id squashed)
        yield "", str(key[-1]), key[:-1], value
