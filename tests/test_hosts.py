"""A cluster whose processes run on hosts of their own: one trace, every host named.

Each process (scheduler, workers ``fast`` and ``skewed``, the client script) runs in a
UTS namespace of its own with a host name set in it (``unshare --uts``, as root), still
talking over loopback. Spans go to a real OTLP receiver and to OTLP JSON files, which
``otel-graph report`` reads as a user would.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import subprocesses
from otlp_receiver import OtlpReceiver
from subprocesses import stop_all, wait_for_address

pytest.importorskip("distributed")


def _can_unshare() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "--uts", "hostname", "probe"], capture_output=True).returncode == 0


pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not _can_unshare(), reason="needs root and unshare --uts (a UTS namespace)")]

HOSTS = {"scheduler": "sched-host", "fast": "host-a", "skewed": "host-b", "client": "client-host"}


def on_host(host: str, argv: list[str]) -> list[str]:
    """``argv`` run in a UTS namespace of its own whose host name is ``host``."""
    return ["unshare", "--uts", "sh", "-c", f'hostname {host} && exec "$@"', "sh", *argv]


def test_each_process_names_its_own_host_and_the_trace_is_whole(tmp_path: Path):
    procs: list[subprocess.Popen] = []
    with OtlpReceiver() as receiver:

        def env(role: str) -> dict[str, str]:
            out = tmp_path / role
            out.mkdir()
            return subprocesses.otlp_env(receiver.grpc_endpoint, service="hosts", OTEL_TRACES_EXPORTER="otlp,otlp_file",
                                         OTEL_GRAPH_FILE_DIR=str(out))

        try:
            scheduler_file = tmp_path / "scheduler.json"
            procs.append(subprocess.Popen(on_host(HOSTS["scheduler"], [
                sys.executable, "-m", "distributed.cli.dask_scheduler", "--scheduler-file", str(scheduler_file),
                "--host", "127.0.0.1", "--port", "0", "--dashboard-address", ":0"]), env=env("scheduler"),
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            address = wait_for_address(scheduler_file, procs[0])
            for name in ("fast", "skewed"):
                procs.append(subprocess.Popen(on_host(HOSTS[name], [
                    sys.executable, "-m", "distributed.cli.dask_worker", address, "--nthreads", "1", "--name", name,
                    "--no-dashboard", "--memory-limit", "1GB"]), env=env(name), stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL))
            app = subprocess.run(on_host(HOSTS["client"], [
                sys.executable, str(subprocesses.APPS / "cluster.py"), "--scheduler", address, "--wait-workers", "2",
                "--workload", "chain", "--flush"]), env=env("client"), capture_output=True, text=True, timeout=180)
            assert app.returncode == 0, app.stderr[-4000:]
            assert "RESULT 4" in app.stdout

            def whole(r: OtlpReceiver) -> bool:
                return sum(1 for s in r.spans() if str(s["attributes"].get("dask.task.key", "")).startswith("chain-")
                           and "dask.task.prefix" in s["attributes"]) >= 4

            assert receiver.wait_for(whole, timeout_s=60)
            spans = receiver.spans()
            (root,) = [s for s in spans if s["name"] == "dask.compute"]
            tasks = [s for s in spans if s["trace_id"] == root["trace_id"] and "dask.task.prefix" in s["attributes"]]
            assert {s["attributes"]["dask.task.key"] for s in tasks} == {"chain-a", "chain-b", "chain-c", "chain-d"}
            assert all(s["parent_span_id"] == root["span_id"] for s in tasks)
            assert root["resource"]["host.name"] == HOSTS["client"]
            assert {s["attributes"]["dask.worker.name"]: s["resource"]["host.name"] for s in tasks} == \
                {"fast": HOSTS["fast"], "skewed": HOSTS["skewed"]}
        finally:
            stop_all(procs)

    # The report and its trace browser say which host each worker was on.
    combined = tmp_path / "traces.jsonl"
    roles = ("client", "fast", "skewed")
    combined.write_text("".join((tmp_path / role / "traces.jsonl").read_text() for role in roles))
    page = tmp_path / "page.html"
    report = subprocess.run([sys.executable, "-m", "otel_graph.cli", "report", str(combined), "--html", str(page)],
                            env=subprocesses.subprocess_env(), capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr
    for name in ("fast", "skewed"):
        assert f"on {HOSTS[name]}" in report.stdout, report.stdout
        assert f"on {HOSTS[name]}" in page.read_text()
