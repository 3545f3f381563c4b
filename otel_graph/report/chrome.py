"""``otel-graph export --chrome``: task spans as Chrome Trace Event JSON, for Perfetto and ``chrome://tracing``.

Perfetto's UI loads traces of millions of events, far past what Jaeger can show. Each
task span becomes a complete event (``"ph": "X"``, times in microseconds) on a track
per worker process and thread: ``pid`` is a small number per process (named after its
worker address or service instance by a ``process_name`` metadata event), ``tid`` the
thread. Compute spans get a track of their own, and CPU and memory readings become
counter tracks (``"ph": "C"``). Events are written as they are made, so the output
never has to fit in memory twice.

Track numbers stay below 2^53, the integers JSON readers hold exactly: a ``thread.id``
past 2^50 (or negative) gets a track number of its own above 2^50, with the computes'
and aggregates' tracks, and integers past 2^53 in an event's args are written as strings.

>>> import io
>>> from otel_graph.report.otlp_read import Span
>>> out = io.StringIO()
>>> span = Span("t", "s", "r", "inc", 2_000, 5_000, {"dask.task.key": "inc-1", "dask.task.prefix": "inc",
...             "dask.worker.id": "123", "thread.id": 7}, 0, {"service.instance.id": "a"})
>>> write_chrome_trace([span], [], out)
1
>>> import json; [e["ph"] for e in json.loads(out.getvalue())["traceEvents"]]
['M', 'X']
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterable
from typing import Any, TextIO

from otel_graph.report.analysis import COMPUTE
from otel_graph.report.otlp_read import Point, Span

_COUNTERS = {"process.cpu.utilization": "cpu", "process.memory.usage": "memory",
             "hw.gpu.utilization": "gpu", "hw.gpu.memory.usage": "gpu memory"}


#: Thread ids below this are tracks as they are; above it, tracks are numbered by _Tracks.
OWN_TRACKS = 1 << 50  # above thread idents, below JSON's 2**53 exact integers
EXACT = 1 << 53


class _Tracks:
    def __init__(self, out: TextIO) -> None:
        self._pids: dict[str, int] = {}
        self._tids: dict[tuple[int, int], int] = {}
        self._own = itertools.count(OWN_TRACKS)
        self._out = out
        self.first = True

    def own(self) -> int:
        """A track of its own (a compute, an aggregate), numbered above any thread id."""
        return next(self._own)

    def tid(self, pid: int, thread: int) -> int:
        """The thread's id, or, for one out of range (10^30), a track number of its own, the same each time."""
        if 0 <= thread < OWN_TRACKS:
            return thread
        tid = self._tids.get((pid, thread))
        if tid is None:
            tid = self._tids[(pid, thread)] = self.own()
        return tid

    def write(self, event: dict[str, Any]) -> None:
        text = json.dumps(_finite(event), separators=(",", ":"), allow_nan=False)
        self._out.write(("" if self.first else ",\n") + text)
        self.first = False

    def pid(self, name: str) -> int:
        pid = self._pids.get(name)
        if pid is None:
            pid = self._pids[name] = len(self._pids) + 1
            self.write({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name}})
        return pid


def _finite(value: Any) -> Any:
    """JSON.parse rejects NaN and Infinity, and rounds integers past 2^53: write them as strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, int) and not -EXACT < value < EXACT:
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _process_of(resource: dict[str, Any]) -> str:
    """A cluster worker by its address; any other process by its service and instance."""
    if resource.get("dask.worker.id"):
        return f"worker {resource['dask.worker.id']}"
    return f"{resource.get('service.name', 'dask')} {resource.get('service.instance.id', '')}".strip()


def write_chrome_trace(spans: Iterable[Span], points: Iterable[Point], out: TextIO) -> int:
    """Write the trace to ``out``; returns how many task and compute events it holds."""
    tracks = _Tracks(out)
    out.write('{"displayTimeUnit":"ms","traceEvents":[\n')
    written = 0
    # Perfetto wants the events of one track (pid, tid) nested, never overlapping: computes
    # (which may run at once) and aggregate spans (which stand for whole prefixes) each get
    # a track of their own, numbered above any thread id.
    for span in spans:
        if span.name == COMPUTE:
            pid, tid, category = tracks.pid("computes"), tracks.own(), "compute"
        elif "dask.task.prefix" in span.attributes:
            pid = tracks.pid(_process_of(span.resource))
            if "dask.task.count" in span.attributes:
                tid, category = tracks.own(), "aggregate"
            else:
                tid, category = tracks.tid(pid, int(span.attributes.get("thread.id", 0) or 0)), "task"
        else:
            continue  # phases and user spans: their task's event covers them
        args = {k: v for k, v in span.attributes.items() if k != "dask.task.dependencies"}
        if span.failed:
            args["status"] = "ERROR"
        tracks.write({"name": span.name, "cat": category, "ph": "X", "ts": span.start_ns / 1e3,
                      "dur": max(span.duration_ns, 0) / 1e3, "pid": pid, "tid": tid, "args": args})
        written += 1
    for point in points:
        counter = _COUNTERS.get(point.name)
        if counter is None or point.attributes.get("cpu.mode") not in (None, "user"):
            continue
        if "hw.id" in point.attributes:  # one counter track per GPU
            counter = f"{counter} {point.attributes['hw.id']}"
        pid = tracks.pid(_process_of(point.resource))
        tracks.write({"name": counter, "ph": "C", "ts": point.time_ns / 1e3, "pid": pid,
                      "args": {counter: point.value}})
    out.write("\n]}\n")
    return written
