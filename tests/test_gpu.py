"""GPU readings: NVML's functions are replaced to simulate two devices on a machine with none."""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from collections.abc import Iterator
from types import SimpleNamespace

import pynvml
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_graph.readings import gpu
from otel_graph.readings.gpu import gpu_status, observe_gpus
from otel_graph.readings.resources import reading_errors

GIB = 1024**3
DEVICES = [  # name as bytes on purpose: older nvidia-ml-py releases returned bytes
    {"uuid": "GPU-aaaa-0000", "name": b"Tesla T4", "busy": 37, "total": 16 * GIB, "used": 4 * GIB},
    {"uuid": "GPU-bbbb-1111", "name": "NVIDIA A100", "busy": 90, "total": 80 * GIB, "used": 60 * GIB},
]
GPU_UNITS = {
    "hw.gpu.utilization": "1",
    "hw.gpu.memory.usage": "By",
    "hw.gpu.memory.limit": "By",
    "hw.gpu.memory.utilization": "1",
}


class FakeNvml:
    """Stands in for the driver behind pynvml; handles are device indices."""

    def __init__(self) -> None:
        self.inits = 0
        self.broken: set[int] = set()  # devices whose queries raise, as a lost GPU does

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for name in ("nvmlInit", "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetName",
                     "nvmlDeviceGetUUID", "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetMemoryInfo"):
            monkeypatch.setattr(pynvml, name, getattr(self, name))

    def nvmlInit(self) -> None:
        self.inits += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(DEVICES)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, handle: int) -> str | bytes:
        return DEVICES[handle]["name"]

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        self._check(handle)
        return DEVICES[handle]["uuid"]

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        self._check(handle)
        return SimpleNamespace(gpu=DEVICES[handle]["busy"], memory=0)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        self._check(handle)
        total, used = DEVICES[handle]["total"], DEVICES[handle]["used"]
        return SimpleNamespace(total=total, used=used, free=total - used)

    def _check(self, handle: int) -> None:
        if handle in self.broken:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)


@pytest.fixture
def fresh_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process-level NVML state that has not initialised yet, and a neutral environment."""
    monkeypatch.setattr(gpu, "_NVML", gpu._Nvml())
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("OTEL_GRAPH_GPU", raising=False)


@pytest.fixture
def nvml(fresh_nvml: None, monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    fake = FakeNvml()
    fake.install(monkeypatch)
    return fake


@pytest.fixture
def reader() -> Iterator[InMemoryMetricReader]:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    reader.meter = provider.get_meter("test_gpu")  # type: ignore[attr-defined]
    yield reader
    provider.shutdown()


def collect(reader: InMemoryMetricReader) -> dict[str, tuple[str, dict[str, tuple[dict, float]]]]:
    """name -> (unit, {hw.id: (attributes, value)}) for the hw.gpu.* metrics that have points."""
    data = reader.get_metrics_data()
    found = {}
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                points = {p.attributes["hw.id"]: (dict(p.attributes), p.value)
                          for p in metric.data.data_points}
                if metric.name.startswith("hw.gpu.") and points:
                    found[metric.name] = (metric.unit, points)
    return found


def test_two_devices_report_four_instruments_with_hw_attributes(nvml, reader):
    observe_gpus(reader.meter)
    metrics = collect(reader)

    assert {name: unit for name, (unit, _) in metrics.items()} == GPU_UNITS
    ids = ["GPU-aaaa-0000", "GPU-bbbb-1111"]
    for _, points in metrics.values():
        assert sorted(points) == ids
    assert metrics["hw.gpu.utilization"][1]["GPU-aaaa-0000"] == (
        {"hw.id": "GPU-aaaa-0000", "hw.name": "Tesla T4", "hw.vendor": "NVIDIA"},
        pytest.approx(0.37),
    )
    assert metrics["hw.gpu.utilization"][1]["GPU-bbbb-1111"][0]["hw.name"] == "NVIDIA A100"
    assert metrics["hw.gpu.utilization"][1]["GPU-bbbb-1111"][1] == pytest.approx(0.90)
    assert metrics["hw.gpu.memory.usage"][1]["GPU-bbbb-1111"][1] == 60 * GIB
    assert metrics["hw.gpu.memory.limit"][1]["GPU-aaaa-0000"][1] == 16 * GIB
    assert metrics["hw.gpu.memory.utilization"][1]["GPU-aaaa-0000"][1] == pytest.approx(0.25)
    assert metrics["hw.gpu.memory.utilization"][1]["GPU-bbbb-1111"][1] == pytest.approx(0.75)
    assert gpu_status() == "2 devices"


@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        ("1", ["GPU-bbbb-1111"]),
        ("GPU-bbbb", ["GPU-bbbb-1111"]),
        (" 1 , 0 ", ["GPU-aaaa-0000", "GPU-bbbb-1111"]),
        ("0,7,1", ["GPU-aaaa-0000"]),  # CUDA ignores everything from the first unknown entry
        ("-1", []),
        ("", []),
    ],
)
def test_cuda_visible_devices_restricts_the_devices(nvml, reader, monkeypatch, setting, expected):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", setting)
    observe_gpus(reader.meter)
    metrics = collect(reader)
    assert sorted(metrics.get("hw.gpu.memory.limit", ("By", {}))[1]) == expected
    if not expected:
        assert metrics == {}
        assert gpu_status().startswith("disabled: no devices in CUDA_VISIBLE_DEVICES=")


def test_nvml_init_failure_means_no_points_and_no_error(nvml, reader, monkeypatch):
    def fail() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    monkeypatch.setattr(pynvml, "nvmlInit", fail)
    before = reading_errors()
    observe_gpus(reader.meter)
    assert collect(reader) == {}
    assert reading_errors() == before
    assert gpu_status().startswith("disabled: nvmlInit failed: ")


def test_missing_pynvml_means_no_points_and_no_error(fresh_nvml, reader, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    before = reading_errors()
    observe_gpus(reader.meter)
    assert collect(reader) == {}
    assert reading_errors() == before
    assert gpu_status() == "disabled: pynvml not installed"


@pytest.mark.parametrize("setting", ["0", "false", "OFF"])
def test_env_switch_turns_gpu_readings_off_without_touching_nvml(nvml, reader, monkeypatch, setting):
    monkeypatch.setenv("OTEL_GRAPH_GPU", setting)
    observe_gpus(reader.meter)
    assert collect(reader) == {}
    assert nvml.inits == 0
    assert gpu_status() == f"disabled: OTEL_GRAPH_GPU={setting}"


def test_a_device_failing_mid_run_is_skipped_without_an_error(nvml, reader):
    observe_gpus(reader.meter)
    assert len(collect(reader)["hw.gpu.memory.usage"][1]) == 2
    before = reading_errors()
    nvml.broken.add(1)

    metrics = collect(reader)
    assert set(metrics) == set(GPU_UNITS)
    for _, points in metrics.values():
        assert sorted(points) == ["GPU-aaaa-0000"]
    assert reading_errors() == before

    nvml.broken.clear()  # skipped for that reading only
    assert len(collect(reader)["hw.gpu.memory.usage"][1]) == 2


def test_a_device_failing_at_start_leaves_the_others(nvml, reader):
    nvml.broken.add(0)
    observe_gpus(reader.meter)
    assert sorted(collect(reader)["hw.gpu.memory.limit"][1]) == ["GPU-bbbb-1111"]
    assert gpu_status() == "1 device"


def test_nvml_initialises_once_per_process_and_again_after_a_fork(nvml, reader, monkeypatch):
    observe_gpus(reader.meter)
    collect(reader)
    collect(reader)
    gpu_status()
    assert nvml.inits == 1

    child_pid = os.getpid() + 1
    monkeypatch.setattr(os, "getpid", lambda: child_pid)
    assert len(collect(reader)["hw.gpu.memory.usage"][1]) == 2
    collect(reader)
    assert nvml.inits == 2


def test_stop_silences_the_gpu_instruments(nvml, reader):
    stop = observe_gpus(reader.meter)
    assert set(collect(reader)) == set(GPU_UNITS)
    stop()
    assert collect(reader) == {}


def test_real_nvml_gives_no_points_and_no_error_without_a_gpu(fresh_nvml, reader):
    # Unpatched pynvml on a machine whose GPUs (usually none here) are whatever they are.
    before = reading_errors()
    observe_gpus(reader.meter)
    has_gpus = not gpu_status().startswith("disabled")
    assert bool(collect(reader)) == has_gpus
    assert reading_errors() == before


WITHOUT_DRIVER = """
import sys
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from otel_graph.readings.gpu import gpu_status, observe_gpus
reader = InMemoryMetricReader()
provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
observe_gpus(provider.get_meter("t"))
reader.get_metrics_data()
print(gpu_status())
print("pynvml" in sys.modules)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the driver is looked for by name on Linux only")
def test_without_nvidia_s_driver_pynvml_is_never_imported():
    # A fresh interpreter: this module imported pynvml already.
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        pass
    else:
        pytest.skip("this machine has NVIDIA's driver")
    out = subprocess.run([sys.executable, "-c", WITHOUT_DRIVER], capture_output=True, text=True, timeout=60,
                         check=True).stdout.splitlines()
    assert out == ["disabled: NVML library not found", "False"]
