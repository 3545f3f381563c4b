"""A process forked from an instrumented one (``os.fork``; multiprocessing's default on Linux).

Its exporters cannot cross the fork (:mod:`otel_graph.export.forks`): in the child, computes run
untraced and nothing of the parent's is sent twice or waited on; the child says so once;
the parent's telemetry is whole.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import subprocess_env
from otlp_receiver import OtlpReceiver

FORKING_APP = """
import os
import sys

import dask
import otel_graph

def rss_mb():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

handle = otel_graph.instrument_scheduler(resources=False)
print("PARENT", dask.get({"a": (abs, -1)}, "a"), flush=True)
pid = os.fork()
if pid == 0:
    graph = {("load", i): (abs, -i) for i in range(20)}
    graph["total"] = (sum, list(graph))
    dask.get(graph, "total")  # warm: imports, caches
    before = rss_mb()
    for _ in range(2000):
        dask.get(graph, "total")
    print("CHILD_GROWTH_MB", round(rss_mb() - before), flush=True)
    sys.exit(0)  # the inherited exit hook runs here: it must leave the parent's data alone
_, status = os.waitpid(pid, 0)
print("CHILD_STATUS", status, flush=True)
print("PARENT_AGAIN", dask.get({"b": (abs, -2)}, "b"), flush=True)
print("FLUSHED", handle.flush(timeout_s=30), flush=True)
"""


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_a_forked_child_runs_untraced_says_so_once_and_leaves_the_parent_s_telemetry_whole():
    with OtlpReceiver() as receiver:
        env = subprocess_env(OTEL_EXPORTER_OTLP_ENDPOINT=receiver.grpc_endpoint, OTEL_SERVICE_NAME="forks")
        proc = subprocess.run([sys.executable, "-c", FORKING_APP], env=env, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
        assert (lines["PARENT"], lines["CHILD_STATUS"], lines["PARENT_AGAIN"], lines["FLUSHED"]) == \
            ("1", "0", "2", "True"), (proc.stdout, proc.stderr[-3000:])  # the child's stderr is the app's
        # Before: every compute in the child kept its record and graph, never processed (~1 GB
        # for 3,000 of these); now the child keeps nothing of them.
        assert int(lines["CHILD_GROWTH_MB"]) < 30, lines["CHILD_GROWTH_MB"]
        warnings = [line for line in proc.stderr.splitlines() if "otel_graph:" in line]
        assert len(warnings) == 1 and "forked from an instrumented one" in warnings[0], proc.stderr[-3000:]
        assert "Traceback" not in proc.stderr
        # The parent's two computes, each task once: the child sent nothing of its own or of the parent's.
        spans = receiver.spans()
        assert sorted(s["attributes"]["dask.task.key"] for s in spans if "dask.task.key" in s["attributes"]) == \
            ["a", "b"]
        assert [s["name"] for s in spans].count("dask.compute") == 2
