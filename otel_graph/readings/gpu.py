"""NVIDIA GPU readings from NVML as OpenTelemetry observable instruments.

Usually created for you by :func:`otel_graph.readings.resources.observe_resources`.
Missing GPUs are normal: without the ``pynvml`` module (package
``nvidia-ml-py``), the NVML library, or any visible device, the instruments
exist but never report, and nothing is raised, logged above DEBUG or warned. On
Linux, a machine without NVIDIA's driver does not even import ``pynvml``.

Usage
-----
>>> from opentelemetry.sdk.metrics import MeterProvider
>>> provider = MeterProvider(shutdown_on_exit=False)
>>> stop = observe_gpus(provider.get_meter("example"))
>>> status = gpu_status()  # "2 devices", or e.g. "disabled: nvmlInit failed: ..."
>>> stop()

Configuration
-------------
``OTEL_GRAPH_GPU``
    ``false`` (or ``0``, ``no``, ``off``) turns GPU readings off; default on.
``CUDA_VISIBLE_DEVICES``
    Read like CUDA does: unset means every device; otherwise a comma-separated
    list of indices or ``GPU-…`` UUID prefixes, cut at the first entry that
    names no device; empty means none. A process pinned to one GPU (as
    dask-cuda workers are) reports only that one.

Instruments
-----------
===========================  =====================  ====
name                         instrument             unit
===========================  =====================  ====
hw.gpu.utilization           ObservableGauge        1
hw.gpu.memory.usage          ObservableUpDown...    By
hw.gpu.memory.limit          ObservableUpDown...    By
hw.gpu.memory.utilization    ObservableGauge        1
===========================  =====================  ====

Every point carries ``hw.id`` (the device UUID), ``hw.name`` and
``hw.vendor="NVIDIA"``. A device whose query fails (lost, or the query is not
supported, as utilization is not on MIG instances) is left out of that reading.

Lifecycle
---------
NVML is initialised on the first reading, once per process id: a child forked
after that initialises again, because NVML handles do not survive a fork
(``distributed.diagnostics.nvml`` does the same). It is never shut down, since
other libraries in the process may be using it. :func:`gpu_status` says which
devices were found, or why readings are disabled.
"""
from __future__ import annotations

import ctypes
import logging
import os
import sys
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from types import ModuleType
from typing import Any

from opentelemetry.metrics import Meter, Observation

from otel_graph.config import OTEL_GRAPH_GPU
from otel_graph.conventions import observe
from otel_graph.readings.guard import Switch, guarded

__all__ = ["observe_gpus", "gpu_status"]

logger = logging.getLogger("otel_graph.gpu")  # the name it has always logged under

ENV_GPU = OTEL_GRAPH_GPU  # also read here: a worker process may run with no Settings of ours
_OFF = {"0", "false", "no", "off", ""}  # what otel_graph.config.parse_bool reads as false

# One reading of one device from (pynvml, handle); None means "no value this time".
DeviceReading = Callable[[Any, Any], float | None]


def observe_gpus(meter: Meter, *, switch: Switch | None = None) -> Callable[[], None]:
    """Create the ``hw.gpu.*`` instruments on ``meter``; return a ``stop()`` that silences them."""
    switch, nvml = switch or Switch(), _NVML
    instruments: list[tuple[str, DeviceReading]] = [
        ("hw.gpu.utilization", lambda pynvml, handle: pynvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100),
        ("hw.gpu.memory.usage", lambda pynvml, handle: pynvml.nvmlDeviceGetMemoryInfo(handle).used),
        ("hw.gpu.memory.limit", lambda pynvml, handle: pynvml.nvmlDeviceGetMemoryInfo(handle).total),
        ("hw.gpu.memory.utilization", _memory_utilization),
    ]
    for name, read in instruments:
        observe(meter, name, [guarded(name, partial(nvml.observe, name, read), switch)])
    return switch.stop


def gpu_status() -> str:
    """``"2 devices"``, or why GPU readings are off, e.g. ``"disabled: pynvml not installed"``."""
    _, devices = _NVML.state()
    if _NVML.disabled:
        return _NVML.disabled
    return f"{len(devices)} device{'' if len(devices) == 1 else 's'}"


def _memory_utilization(pynvml: Any, handle: Any) -> float | None:
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
    return memory.used / memory.total if memory.total else None


@dataclass(frozen=True)
class _Device:
    index: int
    uuid: str
    handle: Any
    attributes: dict[str, str]


class _Nvml:
    """NVML in this process: devices found on first use, and again after a fork."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid: int | None = None
        # One tuple, swapped whole, so a reader never pairs a module with stale devices.
        self._found: tuple[ModuleType | None, tuple[_Device, ...]] = (None, ())
        self._skips_logged: set[tuple[str, str]] = set()
        self.disabled: str | None = "disabled: not initialised"

    def state(self) -> tuple[Any, tuple[_Device, ...]]:
        """``(pynvml, visible devices)``, initialising NVML first in a new process."""
        if self._pid != os.getpid():  # cheap check first; the lock only on (re)initialisation
            with self._lock:
                if self._pid != os.getpid():
                    module, devices, self.disabled = _discover()
                    self._found, self._pid = (module, devices), os.getpid()
                    logger.debug("NVML: %s", self.disabled or f"{len(devices)} devices")
        return self._found

    def observe(self, name: str, read: DeviceReading) -> list[Observation]:
        pynvml, devices = self.state()
        observations = []
        for device in devices:
            try:
                value = read(pynvml, device.handle)
            except pynvml.NVMLError:
                # An expected condition (GPU lost, query unsupported), often permanent: skip
                # the device for this reading without counting it as a reading error.
                if (name, device.uuid) not in self._skips_logged:
                    self._skips_logged.add((name, device.uuid))
                    logger.debug("NVML: %s unavailable on %s", name, device.uuid, exc_info=True)
                continue
            if value is not None:
                observations.append(Observation(value, device.attributes))
        return observations


_NVML = _Nvml()


def _discover() -> tuple[ModuleType | None, tuple[_Device, ...], str | None]:
    """Initialise NVML and list the visible devices: ``(pynvml, devices, reason disabled)``."""
    setting = os.environ.get(ENV_GPU, "1")
    if setting.strip().lower() in _OFF:
        return None, (), f"disabled: {ENV_GPU}={setting}"
    if "pynvml" not in sys.modules and not _nvml_library_loads():
        return None, (), "disabled: NVML library not found"
    try:
        # The deprecated `pynvml` distribution warns on import; we must never warn. (Not
        # thread-safe, but brief: it runs once per process, before the import is cached.)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import pynvml
    except ImportError:
        return None, (), "disabled: pynvml not installed"
    try:
        pynvml.nvmlInit()
    except Exception as error:  # NVMLError mostly, but a broken driver must not break us either
        return None, (), f"disabled: nvmlInit failed: {error}"
    try:
        count = pynvml.nvmlDeviceGetCount()
    except Exception as error:
        return None, (), f"disabled: nvmlDeviceGetCount failed: {error}"
    devices = []
    for index in range(count):
        try:
            devices.append(_describe(pynvml, index))
        except pynvml.NVMLError:  # one lost GPU must not hide the others
            logger.debug("NVML: device %d left out", index, exc_info=True)
    visible_setting = os.environ.get("CUDA_VISIBLE_DEVICES")
    visible = tuple(_visible(devices, visible_setting))
    if not visible:
        where = "" if visible_setting is None else f" in CUDA_VISIBLE_DEVICES={visible_setting!r}"
        return None, (), f"disabled: no devices{where}"
    return pynvml, visible, None


def _nvml_library_loads() -> bool:
    """Whether NVML's shared library loads, asked before pynvml is imported where the answer is
    cheap: on Linux pynvml loads ``libnvidia-ml.so.1`` by that name, so a machine without the
    driver is known without the import (some 5,000 objects that every full garbage collection
    of the process would walk from then on). Elsewhere pynvml is imported and asked."""
    if not sys.platform.startswith("linux"):
        return True
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


def _describe(pynvml: Any, index: int) -> _Device:
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    uuid, name = _text(pynvml.nvmlDeviceGetUUID(handle)), _text(pynvml.nvmlDeviceGetName(handle))
    return _Device(index, uuid, handle, {"hw.id": uuid, "hw.name": name, "hw.vendor": "NVIDIA"})


def _text(value: str | bytes) -> str:
    # nvidia-ml-py returns str today; older releases returned bytes.
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _visible(devices: list[_Device], setting: str | None) -> list[_Device]:
    """The devices ``CUDA_VISIBLE_DEVICES`` names, in its order, cut at its first unknown entry."""
    if setting is None:
        return devices
    chosen: list[_Device] = []
    for entry in filter(None, (part.strip() for part in setting.split(","))):
        if entry.lstrip("-").isdigit():
            found = [d for d in devices if d.index == int(entry)]
        else:
            found = [d for d in devices if d.uuid.startswith(entry)]
        if len(found) != 1:  # CUDA stops at an invalid (or ambiguous) entry
            break
        if found[0] not in chosen:
            chosen.append(found[0])
    return chosen
