"""The client's internals: the methods otel_graph replaces on ``Client``, its futures, its scheduler.

Read from the client's capture (:mod:`otel_graph.cluster.client`) and membership
(:mod:`otel_graph.cluster.membership`). What is read and replaced, as of distributed 2026.8:

* methods replaced on the ``Client`` class (:func:`patch_client`, undone by
  :func:`restore_client`), so clients made before and after are covered alike: those that
  run tasks (:data:`TRACED_CALLS`), ``start``, and ``_send_to_scheduler``, which every
  message to the scheduler goes through (a graph as ``update-graph``);
* distributed records the code that submitted a computation (``Computation.code``) by
  walking up the stack past frames of modules it ignores
  (``distributed.diagnostics.computations.ignore-modules``), by their globals' ``__name__``;
* ``_scheduler_identity`` (``n_workers``, and ``id``, which changes when the client
  reconnects to a scheduler started anew); ``scheduler_comm``, the stream to the
  scheduler, a new ``BatchedSend`` at each connect;
* a future's shared state ``_state`` (``wait()``, ``status``, ``exception``) and the
  client's ``refcount``; ``_started``, what ``await Client(asynchronous=True)`` awaits.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Iterable
from typing import Any

#: The ``Client`` methods that run tasks, each traced as one compute (``gather`` runs none).
TRACED_CALLS = ("get", "compute", "persist", "submit", "map")
#: Every message from the client to the scheduler goes through it; a graph as "update-graph".
_SENDS = "_send_to_scheduler"


def patch_client(*, traced: Callable[[Any, str], Any], start: Callable[[Any], Any],
                 send: Callable[[Any], Any]) -> dict[str, Any]:
    """Replace methods on the ``Client`` class; return the originals, for :func:`restore_client`.

    Each of :data:`TRACED_CALLS` becomes ``traced(original, name)``, run with the globals of
    distributed's module (:func:`_as_if_in`): it must read nothing from its own module's
    globals, only its closure and builtins. ``start`` becomes ``start(original)``, and the
    send every message to the scheduler goes through becomes ``send(original)``; a
    distributed without that send (renamed one day) keeps it, and computes are traced
    without their context reaching the scheduler. All are replaced, or none.
    """
    from distributed import Client

    originals: dict[str, Any] = {}
    try:
        for name in (*TRACED_CALLS, "start", *([_SENDS] if _SENDS in Client.__dict__ else [])):
            original = Client.__dict__[name]
            if name == "start":
                replacement = start(original)
            elif name == _SENDS:
                replacement = send(original)
            else:
                replacement = _as_if_in(original, traced(original, name))
            originals[name] = original
            setattr(Client, name, replacement)
    except BaseException:
        restore_client(originals)
        raise
    return originals


def restore_client(originals: dict[str, Any]) -> None:
    """Put back the ``Client`` methods :func:`patch_client` replaced."""
    from distributed import Client

    for name, original in originals.items():
        setattr(Client, name, original)


def _as_if_in(original: Any, wrapper: Any) -> Any:
    """``wrapper``, run with the globals of the module ``original`` was defined in.

    A wrapper's frame is on the stack distributed walks to find the code that submitted a
    computation (``Computation.code``, shown on the dashboard), skipping frames of the
    modules it ignores (dask, distributed, ...) by their globals' ``__name__``. Run in
    distributed's module, the wrapper is skipped like the method it stands for, and the
    user's code is recorded, as without otel_graph.
    """
    clone = types.FunctionType(wrapper.__code__, original.__globals__, wrapper.__name__, wrapper.__defaults__,
                               wrapper.__closure__)
    clone.__kwdefaults__ = wrapper.__kwdefaults__
    return functools.update_wrapper(clone, original)


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


def scheduler_stream(client: Any) -> Any:
    """The client's stream to its scheduler (a new one at every reconnect); None if not connected."""
    return getattr(client, "scheduler_comm", None)


def client_worker_count(client: Any) -> int:
    """Workers the client last heard of, without a round trip; at least 1."""
    identity = getattr(client, "_scheduler_identity", None) or {}
    count = identity.get("n_workers")  # "workers" may list only the first few
    if not isinstance(count, int):
        count = len(identity.get("workers", {}) or {})
    return max(1, count)


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


def watch_futures(client: Any, futures: Iterable[Any], settled: Any, *, done: Any) -> None:
    """Call ``settled(key, status, error)`` once per future: finished, error, cancelled, or
    released; then ``done()``. All on the client's loop, one after another.

    Waits on each future's shared state (``future._state``), never on the future: holding
    the future would keep its key alive on the cluster after the user dropped it. A key
    the client let go of (every future of it dropped) has its state cancelled, with no
    reference left: that settles as ``released``; a key cancelled by a restart of the
    scheduler stays ``cancelled``. One coroutine on the client's loop waits on the
    states in turn (all must end before the compute does): a watcher per future (a
    callback handed to the loop, a finalizer and a lock each) would cost a large ``map``
    tenths of a second and ~4 kB per pending future.
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
