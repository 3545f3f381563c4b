"""CPU and memory readings, collected through the real SDK with an in-memory reader."""
from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Iterator

import psutil
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_graph.readings.gpu import gpu_status
from otel_graph.readings.resources import observe_resources, reading_errors

OURS = {
    "process.cpu.utilization": "1",
    "process.memory.usage": "By",
    "process.memory.virtual": "By",
    "system.cpu.utilization": "1",
    "system.memory.usage": "By",
    "system.memory.utilization": "1",
}


@pytest.fixture
def reader() -> Iterator[InMemoryMetricReader]:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    reader.meter = provider.get_meter("test_resources")  # type: ignore[attr-defined]
    yield reader
    provider.shutdown()


def collect(reader: InMemoryMetricReader) -> dict[str, tuple[str, list[tuple[dict, float]]]]:
    """name -> (unit, [(attributes, value)]) for every metric that has points."""
    data = reader.get_metrics_data()
    found: dict[str, tuple[str, list[tuple[dict, float]]]] = {}
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                points = [(dict(p.attributes or {}), p.value) for p in metric.data.data_points]
                if points:
                    found[metric.name] = (metric.unit, points)
    return found


def burn_cpu(seconds: float) -> None:
    """Spin until this process has used ``seconds`` of CPU time."""
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def by(points: list[tuple[dict, float]], key: str) -> dict[str, float]:
    return {attributes[key]: value for attributes, value in points}


def test_instruments_have_semconv_names_units_and_attributes(reader):
    observe_resources(reader.meter, gpu=False)
    burn_cpu(0.3)
    metrics = collect(reader)

    assert {name: unit for name, (unit, _) in metrics.items()} == OURS
    process_cpu = by(metrics["process.cpu.utilization"][1], "cpu.mode")
    assert set(process_cpu) == {"user", "system"}
    assert all(0 <= v <= 1 for v in process_cpu.values())
    # The first reading covers the time since observe_resources: the busy loop is in it.
    assert process_cpu["user"] > 0

    system_cpu = by(metrics["system.cpu.utilization"][1], "cpu.mode")
    assert {"user", "system", "idle"} <= set(system_cpu)
    assert set(system_cpu) <= {"user", "nice", "system", "idle", "iowait", "interrupt", "steal"}
    assert all(0 <= v <= 1 for v in system_cpu.values())
    assert math.isclose(sum(system_cpu.values()), 1.0, rel_tol=1e-9)
    assert system_cpu["user"] > 0

    for name in ("process.memory.usage", "process.memory.virtual"):
        [(attributes, value)] = metrics[name][1]
        assert attributes == {}
        assert isinstance(value, int) and value > 0
    [(_, rss)], [(_, vms)] = metrics["process.memory.usage"][1], metrics["process.memory.virtual"][1]
    assert rss <= vms


def test_system_memory_states_add_up_to_total(reader):
    observe_resources(reader.meter, gpu=False)
    metrics = collect(reader)

    usage = by(metrics["system.memory.usage"][1], "system.memory.state")
    utilization = by(metrics["system.memory.utilization"][1], "system.memory.state")
    assert set(usage) == set(utilization)
    assert {"used", "free"} <= set(usage) <= {"used", "free", "buffers", "cached"}
    assert usage["used"] > 0
    assert all(0 <= v <= 1 for v in utilization.values())
    total = psutil.virtual_memory().total
    assert math.isclose(utilization["used"], usage["used"] / total)
    if {"buffers", "cached"} <= set(usage):  # Linux: the states partition the total
        assert sum(usage.values()) == total


def test_later_readings_cover_only_the_time_since_the_previous_one(reader):
    observe_resources(reader.meter, gpu=False)
    started = time.monotonic()
    burn_cpu(0.3)
    busy = by(collect(reader)["process.cpu.utilization"][1], "cpu.mode")
    # Idle on purpose, as long as the busy loop took: on a loaded machine that loop gets
    # a small share of a CPU, and the idle stretch must be as long to be compared with it.
    time.sleep(max(0.3, time.monotonic() - started))
    idle = by(collect(reader)["process.cpu.utilization"][1], "cpu.mode")
    assert idle["user"] < busy["user"] / 2


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="needs os.sched_getaffinity")
def test_process_cpu_is_divided_by_the_cpus_available(reader):
    observe_resources(reader.meter, gpu=False)
    burn_cpu(0.3)
    cpu = by(collect(reader)["process.cpu.utilization"][1], "cpu.mode")
    # One busy thread fills at most one of the CPUs this process may use
    # (plus one 10 ms clock tick of slack).
    assert cpu["user"] + cpu["system"] <= 1 / len(os.sched_getaffinity(0)) + 0.05


def test_stop_silences_every_instrument(reader):
    stop = observe_resources(reader.meter)
    burn_cpu(0.05)  # system CPU time must advance a few ticks to give a reading
    assert set(OURS) <= set(collect(reader))
    stop()
    assert set(OURS) & set(collect(reader)) == set()


def test_stop_affects_only_its_own_instruments(reader):
    stop_first = observe_resources(reader.meter, gpu=False)
    other = MeterProvider(metric_readers=[second := InMemoryMetricReader()], shutdown_on_exit=False)
    try:
        observe_resources(other.get_meter("other"), gpu=False)
        burn_cpu(0.05)
        stop_first()
        assert set(collect(reader)) == set()
        assert set(collect(second)) == set(OURS)
    finally:
        other.shutdown()


def test_failed_reading_yields_no_point_counts_and_logs_once(reader, monkeypatch, caplog):
    def broken() -> None:
        raise OSError("no /proc/meminfo")

    observe_resources(reader.meter, gpu=False)
    before = reading_errors()
    monkeypatch.setattr(psutil, "virtual_memory", broken)
    with caplog.at_level(logging.DEBUG, logger="otel_graph.resources"):
        first = collect(reader)
        collect(reader)

    assert "system.memory.usage" not in first and "system.memory.utilization" not in first
    assert "process.memory.usage" in first  # the other readings are unaffected
    assert reading_errors() - before == 4  # two instruments, two collections
    logged = [r for r in caplog.records if r.name == "otel_graph.resources"]
    assert sorted(r.args[0] for r in logged) == ["system.memory.usage", "system.memory.utilization"]
    assert all(r.levelno == logging.DEBUG and r.exc_info for r in logged)


def test_without_a_gpu_the_real_nvml_path_adds_nothing_and_fails_nothing(reader):
    observe_resources(reader.meter)  # gpu=True, unpatched pynvml
    before = reading_errors()
    names = set(collect(reader))
    has_gpus = not gpu_status().startswith("disabled")
    assert any(name.startswith("hw.gpu.") for name in names) == has_gpus
    assert reading_errors() == before
