"""The scheduler's internals: task states, finished runs, its streams, events, worker memory, fine metrics.

Read from the scheduler plugin (:mod:`otel_graph.cluster.scheduler`), the context handed to
workers (:mod:`otel_graph.cluster.propagation`) and the fine metrics
(:mod:`otel_graph.cluster.fine_metrics`). What is read, as of distributed 2026.8:

* streams: every ``Server`` (the scheduler, a worker) dispatches stream messages by ``op``
  through its ``stream_handlers`` dict, in order, awaiting each; an op it has no handler
  for closes the stream. The scheduler's ``keep-alive`` handler takes any keywords and
  ignores them. The scheduler's stream to each worker is ``stream_comms[address]``, a
  ``BatchedSend`` whose ``buffer`` is the list of messages not yet written, replaced by a
  new list at every write.
* tasks: ``task_prefixes[*].states`` (current counts); ``SchedulerPlugin.transition``'s
  keywords for ``processing -> memory|erred`` (the worker's message: ``worker``,
  ``startstops``), ``tasks[key].processing_on``, ``.prefix.name``, ``.state`` and
  ``.nbytes`` (-1 until a result's size is known); a confirmed steal
  is the event ``("confirm", key, state, victim, thief, stimulus_id)`` on the
  ``stealing`` topic, after the task was sent to the thief.
* events: ``_broker._topics[name]`` (``subscribers``: client ids) and ``send_all``; the
  client handles ``{"op": "event", "topic", "event": (time, msg)}``.
* workers: ``workers[*].memory`` (a ``MemoryState``) and ``workers[*].memory_limit``.
* fine performance metrics: ``cumulative_worker_metrics`` (keys ``(context, *parts,
  activity, unit)``), and by span in ``extensions["spans"].spans[id].
  _cumulative_worker_metrics`` for the ``execute`` and ``p2p`` contexts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any, NamedTuple

from otel_graph.cluster.adapter.worker import WORKER_SAYS
from otel_graph.naming import safe_text

logger = logging.getLogger("otel_graph")


def is_scheduler(server: Any) -> bool:
    from distributed import Scheduler

    return isinstance(server, Scheduler)


# -- streams --------------------------------------------------------------------------------
def add_stream_handler(server: Any, op: str, handler: Any) -> bool:
    """Handle ``op`` on the server's streams (``Server.stream_handlers``: the scheduler's, or a
    worker's); an existing one stays.

    True if the server now handles ``op``. A handler is never taken away: a message of an
    op nobody handles makes the server close the stream it came on.
    """
    handlers = getattr(server, "stream_handlers", None)
    if not isinstance(handlers, dict):
        return False
    handlers.setdefault(op, handler)
    return True


def handles(server: Any, op: str) -> bool:
    return op in (getattr(server, "stream_handlers", None) or {})


def read_worker_says(scheduler: Any, reader: Any) -> bool:
    """Wrap the scheduler's ``keep-alive`` handler (which takes and ignores anything) so
    that ``reader(worker, payload)`` gets what workers say with :func:`.worker.say_to_scheduler`.
    Idempotent; True if the scheduler now reads them. Left in place: workers may still say."""
    handlers = getattr(scheduler, "stream_handlers", None)
    if not isinstance(handlers, dict):
        return False
    original = handlers.get("keep-alive")
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


def worker_stream(scheduler: Any, address: str) -> Any:
    """The scheduler's stream to a worker (a ``BatchedSend``); None once it is gone."""
    return scheduler.stream_comms.get(address)


def unsent(stream: Any) -> list | None:
    """The list of messages a ``BatchedSend`` holds and has not written yet (it is swapped for
    a new one at every write); None where that is not readable."""
    buffer = getattr(stream, "buffer", None)
    return buffer if isinstance(buffer, list) else None


# -- tasks ----------------------------------------------------------------------------------
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


def graph_dependencies(scheduler: Any, keys: Iterable[Any]) -> dict[Any, list[Any]]:
    """key -> the keys it depends on, for the tasks of a graph update the scheduler holds."""
    tasks = scheduler.tasks
    found = {}
    for key in keys:
        ts = tasks.get(key)
        if ts is not None:
            found[key] = [dependency.key for dependency in ts.dependencies]
    return found


#: A task the scheduler will not compute again for a graph update: its result or error stays.
_SETTLED = frozenset(("memory", "erred"))


def unsettled(scheduler: Any, keys: Iterable[Any]) -> list[Any]:
    """Of a graph update's output keys, those it has yet to compute: not in memory or erred
    from before (a ``SchedulerPlugin.update_graph`` is called before the update's transitions)."""
    tasks = scheduler.tasks
    found = []
    for key in keys:
        ts = tasks.get(key)
        if ts is not None and ts.state not in _SETTLED:
            found.append(key)
    return found


def result_nbytes(scheduler: Any, key: Any) -> int:
    """The bytes of a task's result as its worker measured them (``TaskState.nbytes``); -1 unknown."""
    ts = scheduler.tasks.get(key)
    nbytes = getattr(ts, "nbytes", -1)
    return nbytes if type(nbytes) is int else -1


class FinishedRun(NamedTuple):
    """A run the scheduler just accepted as finished (``processing -> memory|erred``)."""

    note: Any  # the compute's note (:mod:`otel_graph.cluster.propagation`); None for an untraced task
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
        start = stop = time.time()
    return FinishedRun(note, str(ts.prefix.name), float(start), float(stop))


def processing_on(scheduler: Any, key: Any) -> str | None:
    """The address of the worker a task was sent to; None if it is not processing."""
    ts = scheduler.tasks.get(key)
    ws = getattr(ts, "processing_on", None) if ts is not None else None
    return getattr(ws, "address", None)


def stolen(msg: Any) -> tuple[Any, str] | None:
    """(key, thief) from a ``stealing`` event of a confirmed steal; None for any other."""
    if isinstance(msg, (tuple, list)) and len(msg) >= 5 and msg[0] == "confirm" and isinstance(msg[4], str):
        return msg[1], msg[4]
    return None


# -- events and workers ----------------------------------------------------------------------
def publish(scheduler: Any, topic: str, msg: Any, *, to: str | None = None) -> None:
    """Send ``msg`` to the clients subscribed to ``topic`` (``to``: to that one only, if it
    is), as an event of it, without the scheduler keeping it: ``Scheduler.log_event`` would
    also store it (``get_events()``, the dashboard) and pass it to every scheduler plugin.
    The message is the one distributed's event broker sends (``{"op": "event", "topic",
    "event": (time, msg)}``), on the client's stream, in order with the scheduler's reports."""
    topics = getattr(getattr(scheduler, "_broker", None), "_topics", None)
    if not isinstance(topics, dict):
        scheduler.log_event(topic, msg)  # a distributed without the broker: seen, not lost
        return
    found = topics.get(topic)  # .get: the defaultdict must not grow a topic nobody wants
    subscribers = getattr(found, "subscribers", None)
    if not subscribers or (to is not None and to not in subscribers):
        return
    event = {"op": "event", "topic": topic, "event": (time.time(), msg)}
    scheduler.send_all({client: [event] for client in ([to] if to is not None else list(subscribers))},
                       worker_msgs={})


def worker_state(scheduler: Any, address: str) -> Any:
    """The scheduler's ``WorkerState`` of a worker: a new one each time the worker
    (re)connects; None once it is gone."""
    workers = getattr(scheduler, "workers", None)
    return workers.get(address) if workers is not None else None


def worker_count(scheduler: Any) -> int:
    return len(scheduler.workers)


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
        yield WorkerMemory(safe_text(str(ws.address)), safe_text(str(ws.name)), int(memory.managed),
                           int(memory.unmanaged), int(memory.spilled), int(ws.memory_limit or 0))


#: Contexts whose fine metrics carry a span id on the workers, kept by span on the scheduler.
_FINE_BY_SPAN = ("execute", "p2p")


def fine_metric_readings(scheduler: Any) -> Iterable[tuple[str, str, tuple, float]]:
    """(span name or "", unit, key without span and unit, value): distributed's fine performance
    metrics on the scheduler, by span where the spans extension keeps them (``Span.
    _cumulative_worker_metrics``), the rest from ``Scheduler.cumulative_worker_metrics``."""
    spans: Any = getattr(scheduler, "extensions", {}).get("spans")  # distributed's SpansSchedulerExtension
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
