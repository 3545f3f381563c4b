"""Real Prometheus, real instrumented workloads: the stack's dashboards and alerts proven.

Two paths. Without a collector (``OTEL_METRICS_EXPORTER=prometheus``), Prometheus scrapes
each process's own endpoint, local scheduler and LocalCluster alike, under the SDK
exporter's names. In the stack, Prometheus scrapes the collector, whose names differ
(``collector_exporter.py``): every dashboard panel and alert rule is evaluated there, on
telemetry the apps sent over OTLP, served under the collector's naming rules.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from collector_exporter import CollectorExposition
from conftest import needs_distributed, subprocess_env
from grafana_files import alert_condition, alert_rules, dashboard_queries, dashboards
from otlp_receiver import OtlpReceiver
from ports import free_port
from prometheus_server import PROMETHEUS, PROMTOOL, PrometheusServer, QueryError
from test_job_alerts import JOB_RULES

pytestmark = [pytest.mark.skipif(PROMETHEUS is None, reason="Debian prometheus is installed by `make test` (as root)"),
              pytest.mark.slow]  # scrapes and alert rules that must fire in Prometheus's own time

APPS = Path(__file__).parent / "apps"


class Held:
    """An app that computes, then stays up (serving /metrics) until told to go."""

    def __init__(self, args: list[str], env: dict[str, str], ready: str) -> None:
        self.proc = subprocess.Popen([sys.executable, *args], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        for line in self.proc.stdout:
            if line.startswith(ready):
                return
        raise AssertionError(f"app ended early: {self.proc.stderr.read()[-3000:]}")

    def release(self) -> None:
        self.proc.communicate("\n", timeout=60)


def prometheus_env(port: int, **extra: str) -> dict[str, str]:
    settings = {"OTEL_METRICS_EXPORTER": "prometheus", "OTEL_TRACES_EXPORTER": "none",
                "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1", "OTEL_EXPORTER_PROMETHEUS_PORT": str(port),
                "OTEL_SERVICE_NAME": "etl", **extra}
    return subprocess_env(**settings)


def test_a_local_run_is_scraped_with_the_names_dashboards_use():
    port = free_port()
    app = Held([str(APPS / "compute.py"), "--tasks", "40", "--fail", "--busy-ms", "2", "--wait-stdin"],
               prometheus_env(port), ready="COMPUTED")
    try:
        with PrometheusServer({"etl": [f"127.0.0.1:{port}"]}) as prometheus:
            assert prometheus.wait_for("sum(dask_task_duration_seconds_count)", lambda r: r and r[0]["value"] == 41,
                                       timeout_s=30)
            by_outcome = {r["metric"]["dask_task_outcome"]: r["value"] for r in prometheus.query(
                'sum by (dask_task_outcome) (dask_task_duration_seconds_count{dask_task_prefix=~"inc|boom"})')}
            assert by_outcome == {"success": 40, "error": 1}
            (p95,) = prometheus.query('histogram_quantile(0.95, sum by (le) (dask_task_duration_seconds_bucket'
                                      '{dask_task_prefix="inc"}))')
            assert 0.001 <= p95["value"] <= 1.0  # each inc burns 2 ms of CPU
            assert prometheus.query("dask_compute_duration_seconds_count")[0]["metric"]["dask_scheduler"] == "sync"
            assert prometheus.wait_for("process_cpu_utilization", bool, timeout_s=30)
            assert prometheus.query('otel_sdk_exporter_metric_data_point_exported_total') is not None
            with pytest.raises(QueryError, match="parse"):
                prometheus.query("sum(by")  # a query that does not parse is an error, not an empty answer
    finally:
        app.release()


@needs_distributed
def test_a_local_cluster_serves_every_process_and_the_scheduler_gauges():
    port = free_port(run=8)
    # Worker processes find the port taken by the client and move to the next free ones.
    ports = [port, *range(port + 1, port + 8)]
    app = Held([str(APPS / "cluster.py"), "--hold", "--flush"], prometheus_env(port), ready="HOLDING")
    try:
        with PrometheusServer({"etl": [f"127.0.0.1:{p}" for p in ports]}) as prometheus:
            assert prometheus.wait_for('sum(dask_task_duration_seconds_count{dask_scheduler="distributed"})',
                                       lambda r: r and r[0]["value"] == 21, timeout_s=30)
            assert prometheus.wait_for("dask_scheduler_workers", lambda r: r and r[0]["value"] == 2, timeout_s=30)
            states = {r["metric"]["dask_memory_state"] for r in prometheus.query("dask_worker_memory_usage_bytes")}
            assert states == {"managed", "unmanaged", "spilled"}
            assert len(prometheus.query("dask_worker_memory_limit_bytes")) == 2
            up = [r for r in prometheus.query("up") if r["value"] == 1]
            assert len(up) == 3, "the client and both workers each serve /metrics"
    finally:
        app.release()


# -- every dashboard query, against a real Prometheus, on the collector's names -------------------
# The stack's Prometheus scrapes the collector's prometheus exporter, whose names differ from the
# SDK exporter's (collector_exporter.py says how). So the apps below export OTLP, as in the stack,
# to a real OTLP receiver; what it holds is served under the collector's naming rules and the
# shipped exporter settings, and a real Prometheus scrapes that with honor_labels.
#: Panels that cannot have data here: no GPU on this machine; no collector without Docker, so
#: neither its own telemetry nor its span-metrics connector's output.
NO_DATA_HERE = {("dask-resources", "GPU utilisation per device"), ("dask-resources", "GPU memory per device"),
                ("otel-graph-health", "Collector: refused and failed"),
                ("dask-overview", "Task span duration p95 by prefix, with exemplars")}


@contextmanager
def collector_stack() -> Iterator[tuple[OtlpReceiver, CollectorExposition, PrometheusServer]]:
    with OtlpReceiver() as receiver, CollectorExposition(receiver) as exposition, \
            PrometheusServer({"otel-collector": [exposition.target]}, honor_labels=True) as prometheus:
        yield receiver, exposition, prometheus


def otlp_env(receiver: OtlpReceiver, service: str, **extra: str) -> dict[str, str]:
    settings = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.grpc_endpoint, "OTEL_SERVICE_NAME": service, **extra}
    return subprocess_env(**settings)


def expand(expr: str) -> str:
    """Grafana's macros and this dashboard's variables, as Grafana would send them (all values)."""
    import re

    for name, value in (("$__rate_interval", "1m"), ("$__interval", "15s"), ("$__range", "5m"),
                        ("$service", ".*"), ("$span", ".*"), ("$name", ".*"), ("$prefix", ".*"),
                        ("$worker", ".*"), ("$host", ".*")):
        expr = expr.replace(name, value)
    # label_values(selector, label) is Grafana's, not PromQL: ask for the same thing as a query.
    match = re.fullmatch(r"label_values\((.*), *(\w+)\)", expr.strip())
    return f"count by ({match.group(2)}) ({match.group(1)})" if match else expr


@needs_distributed
def test_every_dashboard_query_parses_and_the_non_gpu_panels_have_data():
    queries = dashboard_queries()
    assert len(queries) >= 25 and {uid for uid, _, _ in queries} == {"dask-jobs", "dask-overview", "dask-resources",
                                                                      "otel-graph-health"}
    with collector_stack() as (receiver, _, prometheus):
        local = Held([str(APPS / "compute.py"), "--tasks", "40", "--fail", "--busy-ms", "2", "--wait-stdin"],
                     otlp_env(receiver, "etl-local"), ready="COMPUTED")
        cluster = None
        try:
            cluster = Held([str(APPS / "cluster.py"), "--hold", "--flush"], otlp_env(receiver, "etl-cluster"),
                           ready="HOLDING")
            # Wait until both runs' task counts are in and a few scrapes exist for the rates.
            assert prometheus.wait_for("count(count by (job) (dask_task_duration_seconds_count))",
                                       lambda r: r and r[0]["value"] == 2, timeout_s=30)
            assert prometheus.wait_for("count_over_time(up[1m])", lambda r: r and min(x["value"] for x in r) >= 5,
                                       timeout_s=30)
            assert prometheus.wait_for("process_cpu_utilization_ratio", bool, timeout_s=30)
            # Fine performance metrics reach the scheduler with the workers' next heartbeats.
            assert prometheus.wait_for("count_over_time(dask_activity_time_seconds_total[1m])",
                                       lambda r: r and min(x["value"] for x in r) >= 3, timeout_s=30)
            hosts = {r["metric"].get("host_name") for r in prometheus.query("process_memory_usage_bytes")}
            assert hosts == {socket.gethostname()}, "host.name is a label on every process's readings"
            workers = {r["metric"].get("dask_worker_id", "") for r in prometheus.query("process_memory_usage_bytes")}
            assert len([w for w in workers if w.startswith("tcp://")]) == 2, workers
            empty = []
            for uid, title, expr in queries:
                result = prometheus.query(expand(expr))  # raises QueryError if it does not parse
                # A job's usual needs days of runs: test_job_alerts.py has them.
                if not result and (uid, title) not in NO_DATA_HERE and uid != "dask-jobs":
                    empty.append(f"{uid} / {title}: {expr}")
            assert empty == []
        finally:
            local.release()
            if cluster is not None:
                cluster.release()


# -- alert rules: true under their fault, false in a healthy run --------------------------------
LOCAL = [str(APPS / "compute.py"), "--tasks", "20", "--wait-stdin"]
CLUSTER = [str(APPS / "cluster.py"), "--hold", "--flush"]


def firing(prometheus: PrometheusServer, rule: dict) -> bool:
    """Grafana's evaluation of the rule, on any series."""
    expr, fires = alert_condition(rule)
    return any(fires(r["value"]) for r in prometheus.query(expr))


# (rule, app under its fault, ready marker, extra env, healthy app, ready marker)
SCENARIOS = {
    "dask-task-errors": ([*LOCAL, "--fail"], "COMPUTED", {}, LOCAL, "COMPUTED"),
    "dask-worker-memory": ([*CLUSTER, "--memory-limit", "60MB", "--no-memory-guard"], "HOLDING", {},
                           CLUSTER, "HOLDING"),
    "dask-stalled": ([*CLUSTER[:-1], "--workload", "stall"], "HOLDING", {}, CLUSTER, "HOLDING"),
    # Metrics reach the collector; spans go to a port where nothing listens.
    "otel-graph-telemetry-lost": (LOCAL, "COMPUTED", {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:9",
                                                       "OTEL_GRAPH_MAX_QUEUED_SPANS": "1"}, LOCAL, "COMPUTED"),
}


def test_every_alert_rule_is_linked_and_its_query_parses():
    rules = alert_rules()
    # GPU: no GPU here, its query is only parsed; the job alerts need days of runs: test_job_alerts.py
    assert set(rules) == {*SCENARIOS, "dask-gpu-memory", *JOB_RULES}
    boards = dashboards()
    with PrometheusServer({}) as prometheus:
        for rule in rules.values():
            annotations = rule["annotations"]
            board = boards[annotations["__dashboardUid__"]]
            assert int(annotations["__panelId__"]) in {p["id"] for p in board["panels"]}, rule["uid"]
            assert (rule["dashboardUid"], rule["panelId"]) == (annotations["__dashboardUid__"],
                                                               int(annotations["__panelId__"]))
            assert not firing(prometheus, rule), rule["uid"]  # parses; nothing to fire on in an empty server


@pytest.mark.parametrize("uid", [pytest.param(uid, marks=needs_distributed if CLUSTER[0] in SCENARIOS[uid][0] else ())
                                 for uid in sorted(SCENARIOS)])
def test_alert_fires_under_its_fault_and_not_in_a_healthy_run(uid):
    rule = alert_rules()[uid]
    fault_args, fault_ready, fault_env, healthy_args, healthy_ready = SCENARIOS[uid]
    for args, ready, env, expected in ((fault_args, fault_ready, fault_env, True),
                                       (healthy_args, healthy_ready, {}, False)):
        with collector_stack() as (receiver, _, prometheus):
            app = Held(args, otlp_env(receiver, "etl", **env), ready=ready)
            try:
                # Let a few scrapes land, with the run's telemetry in them, before judging.
                assert prometheus.wait_for("count_over_time(up[1m])",
                                           lambda r: r and min(x["value"] for x in r) >= 4, timeout_s=30)
                assert prometheus.wait_for("dask_compute_duration_seconds_count or dask_scheduler_workers", bool,
                                           timeout_s=30)
                if expected:
                    assert prometheus.wait_for("vector(1)", lambda r: firing(prometheus, rule), timeout_s=30), uid
                else:
                    assert not firing(prometheus, rule), uid
            finally:
                app.release()


def test_telemetry_lost_fires_when_prometheus_loses_the_collector():
    # A dead collector cannot pass on otel_graph's own undelivered counts: the rule also
    # watches whether Prometheus still reaches the collector.
    rule = alert_rules()["otel-graph-telemetry-lost"]
    with collector_stack() as (receiver, exposition, prometheus):
        app = Held(LOCAL, otlp_env(receiver, "etl"), ready="COMPUTED")
        try:
            assert prometheus.wait_for("dask_compute_duration_seconds_count", bool, timeout_s=30)
            assert not firing(prometheus, rule)
            exposition.stop()
            assert prometheus.wait_for('up{job="otel-collector"}', lambda r: r and r[0]["value"] == 0, timeout_s=30)
            assert firing(prometheus, rule)
        finally:
            app.release()


PROMETHEUS_CONFIG = Path(__file__).resolve().parent.parent / "collector" / "prometheus.yml"


@pytest.mark.skipif(not PROMTOOL, reason="promtool comes with Debian's prometheus package")
def test_the_stacks_prometheus_config_is_valid():
    check = subprocess.run([PROMTOOL, "check", "config", str(PROMETHEUS_CONFIG)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
