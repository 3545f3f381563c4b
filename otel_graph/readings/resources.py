"""CPU, memory and GPU readings as OpenTelemetry observable instruments.

A task span says how long a task took; these readings say what the machine did
meanwhile. They cost nothing per task: every instrument is *observable*, so
psutil is asked only when a metric reader collects, once per export interval.

Usage
-----
>>> from opentelemetry.sdk.metrics import MeterProvider
>>> from opentelemetry.sdk.metrics.export import InMemoryMetricReader
>>> reader = InMemoryMetricReader()
>>> provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
>>> stop = observe_resources(provider.get_meter("example"), gpu=False)
>>> import time; time.sleep(0.1)  # a utilization needs time to pass, or it has no point
>>> data = reader.get_metrics_data()
>>> sorted({m.name for rm in data.resource_metrics
...         for sm in rm.scope_metrics for m in sm.metrics})  # doctest: +NORMALIZE_WHITESPACE
['process.cpu.utilization', 'process.memory.usage', 'process.memory.virtual',
 'system.cpu.utilization', 'system.memory.usage', 'system.memory.utilization']
>>> stop()  # OpenTelemetry cannot unregister instruments; from now on they report nothing
>>> provider.shutdown()

Instruments
-----------
Semantic-convention names, units and attributes:

==========================  ============  ====  ===============================
name                        kind          unit  attributes
==========================  ============  ====  ===============================
process.cpu.utilization     gauge         1     ``cpu.mode``: user, system
process.memory.usage        up-down sum   By    (resident set size)
process.memory.virtual      up-down sum   By
system.cpu.utilization      gauge         1     ``cpu.mode``: user, nice, system,
                                                idle, iowait, interrupt, steal
system.memory.usage         up-down sum   By    ``system.memory.state``: used,
system.memory.utilization   gauge         1     free, buffers, cached
==========================  ============  ====  ===============================

A utilization is the fraction of time since the previous reading (the first
covers the time since ``observe_resources``), from 0 to 1. The process's is
divided by the CPUs it may run on, so 1 means "all my CPUs, all the time"; the
system's covers all CPUs together. Each mode or state appears where the
platform has it. The kernel counts CPU time in ticks of about 10 ms, so a
system reading over an interval in which no tick passed has no value and is
left out rather than guessed. Being deltas, two readers on one provider each see the time
since *either* last collected. GPUs: see :mod:`otel_graph.readings.gpu`.

Errors
------
A reading that fails yields no point and never raises into the SDK. Failures
are counted (:func:`reading_errors`) and the first failure of each instrument is
logged at DEBUG with its traceback.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil
from opentelemetry.metrics import Meter, Observation

from otel_graph.conventions import observe
from otel_graph.readings.gpu import observe_gpus
from otel_graph.readings.guard import Reading, Switch, guarded, reading_errors

__all__ = ["observe_resources", "reading_errors"]


def observe_resources(meter: Meter, *, gpu: bool = True, switch: Switch | None = None) -> Callable[[], None]:
    """Create the process, system and (optionally) GPU instruments on ``meter``.

    Parameters
    ----------
    meter
        Where the instruments are created.
    gpu
        Also observe NVIDIA GPUs through NVML (:func:`otel_graph.readings.gpu.observe_gpus`).
        Without NVML or GPUs this adds instruments that never report.

    Returns
    -------
    stop
        Call it to make every callback created here report nothing from then on.
    switch
        Pass your own to turn the readings back on later (``switch.on = True``): a meter
        keeps the first callbacks registered under a name, so instruments are made once.
    """
    switch = switch or Switch()
    system_cpu, process_cpu, process, memory = _SystemCpu(), _ProcessCpu(), _ThisProcess(), _SystemMemory()
    instruments: list[tuple[str, Reading]] = [
        ("process.cpu.utilization", process_cpu.read),
        ("process.memory.usage", lambda: [Observation(process.get().memory_info().rss)]),
        ("process.memory.virtual", lambda: [Observation(process.get().memory_info().vms)]),
        ("system.cpu.utilization", system_cpu.read),
        ("system.memory.usage", memory.usage),
        ("system.memory.utilization", memory.utilization),
    ]
    for name, read in instruments:
        observe(meter, name, [guarded(name, read, switch)])
    if not gpu:
        return switch.stop
    observe_gpus(meter, switch=switch)
    return switch.stop


class _ThisProcess:
    """``psutil.Process`` for the current pid: after a fork, a cached one would read the parent."""

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._process = psutil.Process(self._pid)

    def get(self) -> psutil.Process:
        if os.getpid() != self._pid:
            self._pid = os.getpid()
            self._process = psutil.Process(self._pid)
        return self._process


def _available_cpus() -> int:
    # Affinity, not the machine's count: a worker pinned to 4 of 64 CPUs that uses
    # all 4 is fully busy. Read every time because affinity can change at run time.
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return psutil.cpu_count() or 1


def _fraction(value: float) -> float:
    # CPU times tick at ~10 ms, so over a short interval a ratio can overshoot 1.
    return min(max(value, 0.0), 1.0)


class _ProcessCpu:
    """User and system CPU time of this process since the previous reading."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # two readers may collect concurrently
        self._process = _ThisProcess()
        self._pid = os.getpid()
        self._last = self._now()

    def _now(self) -> tuple[float, float, float]:
        times = self._process.get().cpu_times()
        return time.monotonic(), times.user, times.system

    def read(self) -> list[Observation]:
        with self._lock:
            now = self._now()
            if os.getpid() != self._pid:
                # Forked: the baseline belongs to the parent. Start over, report next time.
                self._pid, self._last = os.getpid(), now
                return []
            wall = (now[0] - self._last[0]) * _available_cpus()
            if wall <= 0:
                return []
            last, self._last = self._last, now
        return [
            Observation(_fraction((now[1] - last[1]) / wall), {"cpu.mode": "user"}),
            Observation(_fraction((now[2] - last[2]) / wall), {"cpu.mode": "system"}),
        ]


# psutil field -> semconv cpu.mode. guest and guest_nice are left out on purpose:
# Linux already counts them inside user and nice, so adding them would count twice.
_CPU_MODES = {
    "user": "user", "nice": "nice", "system": "system", "idle": "idle", "iowait": "iowait",
    "irq": "interrupt", "softirq": "interrupt", "steal": "steal",
    "interrupt": "interrupt", "dpc": "interrupt",  # Windows; dpc is its softirq
}  # fmt: skip


def _cpu_times_by_mode() -> dict[str, float]:
    times: Any = psutil.cpu_times()  # summed over all CPUs
    modes: dict[str, float] = {}
    for field, mode in _CPU_MODES.items():
        seconds = getattr(times, field, None)
        if seconds is not None:
            modes[mode] = modes.get(mode, 0.0) + seconds
    return modes


class _SystemCpu:
    """Fraction of all CPUs' time spent in each mode since the previous reading.

    Computed from our own ``psutil.cpu_times()`` deltas rather than
    ``cpu_times_percent(interval=None)``, whose baseline is shared with every
    other caller in the process.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last = _cpu_times_by_mode()

    def read(self) -> list[Observation]:
        now = _cpu_times_by_mode()
        with self._lock:
            # max(): iowait may go backwards, and the sums drop when a CPU goes offline.
            delta = {mode: max(now[mode] - self._last.get(mode, 0.0), 0.0) for mode in now}
            total = sum(delta.values())
            if total <= 0:
                return []
            self._last = now
        return [Observation(_fraction(part / total), {"cpu.mode": mode}) for mode, part in delta.items()]


class _SystemMemory:
    """The machine's memory by state, read once for both gauges of a collection: read apart,
    usage and utilization would disagree while memory changes."""

    def __init__(self) -> None:
        self._read: list[Any] = []  # the reading usage() took, for the utilization() that follows

    def usage(self) -> list[Observation]:
        memory = psutil.virtual_memory()
        self._read[:] = [memory]
        return _system_memory(memory, fraction=False)

    def utilization(self) -> list[Observation]:
        # A collection calls the callbacks in the order they were registered: usage's first.
        memory = self._read.pop() if self._read else psutil.virtual_memory()
        return _system_memory(memory, fraction=True)


def _system_memory(memory: Any, *, fraction: bool) -> list[Observation]:
    states = {"used": memory.used, "free": memory.free}
    if hasattr(memory, "buffers") and hasattr(memory, "cached"):
        states["buffers"], states["cached"] = memory.buffers, memory.cached
        # psutil's used is total - available, which overlaps cached and buffers. The
        # conventions want the states to add up to the total (the collector's
        # hostmetrics receiver computes it the same way).
        states["used"] = max(memory.total - memory.free - memory.buffers - memory.cached, 0)
    if fraction:
        if memory.total <= 0:
            return []
        return [Observation(value / memory.total, {"system.memory.state": s}) for s, value in states.items()]
    return [Observation(value, {"system.memory.state": s}) for s, value in states.items()]
