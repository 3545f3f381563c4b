"""The job alerts ("slower than usual", "failing more", "processing much less or more", "did not
run"), evaluated by a real Prometheus on days of real runs placed back in time.

Each job below is a service whose history is made of real runs of ``apps/jobs.py``
(otel_graph, OTLP, the collector's naming), noted at their place in a synthesised week
and backfilled with ``promtool`` (``job_history.py``). A service's history is healthy
until its last run, where its fault (if any) is; every alert must fire for exactly the
services whose fault it names, and for no healthy one.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from grafana_files import alert_condition, alert_rules, dashboard_queries
from job_history import History, backfill
from otlp_receiver import OtlpReceiver
from prometheus_server import PROMETHEUS, PROMTOOL, PrometheusServer

pytestmark = [pytest.mark.skipif(PROMETHEUS is None or PROMTOOL is None,
                                 reason="Debian prometheus is installed by `make test` (as root)"),
              pytest.mark.slow, pytest.mark.timeout(900)]  # a week of real runs, backfilled

DAY = 86400
#: A healthy run: 16 tasks of 50 ms (sync, or a cluster's), 16 chunks of 100 x 100.
USUAL: dict[str, Any] = {"task_ms": 50, "size": 400, "chunk": 100}
JITTER_MS = (40, 50, 60)
#: The last run of each service, and the alerts it must set off.
LAST_RUNS: dict[str, tuple[dict[str, Any] | None, set[str]]] = {
    "etl-healthy": (USUAL, set()),
    "etl-slower": ({**USUAL, "task_ms": 250}, {"dask-job-slower"}),
    "etl-failing": ({**USUAL, "fail": True}, {"dask-job-failing"}),
    "etl-less": ({**USUAL, "size": 200}, {"dask-job-volume"}),  # 4 chunks: a quarter of the tasks and bytes
    "etl-more-bytes": ({**USUAL, "size": 800, "chunk": 200}, {"dask-job-volume"}),  # 16 chunks, 4 times the bytes
    # The same on a LocalCluster: its bytes counted by the scheduler, its tasks the same.
    "etl-cluster-more-bytes": ({**USUAL, "size": 800, "chunk": 200}, {"dask-job-volume"}),
}
#: Services whose job runs on dask.distributed (a LocalCluster of the job's process).
ON_CLUSTER = {"etl-cluster-more-bytes"}
JOB_RULES = {"dask-job-slower", "dask-job-failing", "dask-job-volume", "dask-job-missing"}


def _week(history: History, service: str, *, last: dict[str, Any] | None) -> None:
    """Six days of one healthy run a day in a long-lived process, then ``last`` 10 minutes ago,
    in a process of its own (a restarted service, say)."""
    scheduler = "cluster" if service in ON_CLUSTER else "sync"
    with history.process(service, name="nightly", lives=True, scheduler=scheduler) as process:
        for day in range(6, 0, -1):  # a day's run takes 20% less or more than another's
            process.run(at=history.now - day * DAY, seed=day, **{**USUAL, "task_ms": JITTER_MS[day % 3]})
    if last is not None:
        with history.process(service, name="nightly", lives=False, scheduler=scheduler) as process:
            process.run(at=history.now - 600, seed=7, **last)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PrometheusServer, float]]:
    with OtlpReceiver() as receiver:
        history = History(receiver, now=time.time())
        for service, (last, _) in LAST_RUNS.items():
            _week(history, service, last=last)
        # A cron job: a process a run, one a day until two days ago.
        for day in range(9, 1, -1):
            with history.process("etl-missing", name="nightly", lives=False) as process:
                process.run(at=history.now - day * DAY, seed=day, **USUAL)
        # A new job: two healthy runs, then a slow one; too few runs to judge.
        with history.process("etl-new", name="nightly", lives=True) as process:
            for day in (2, 1):
                process.run(at=history.now - day * DAY, seed=day, **USUAL)
            process.run(at=history.now - 600, seed=3, **{**USUAL, "task_ms": 250})
    data = tmp_path_factory.mktemp("history") / "data"
    backfill(history.openmetrics(), data)
    with PrometheusServer({}, data_dir=data) as server:
        yield server, history.now


def firing(prometheus: PrometheusServer, rule: dict, *, at: float) -> set[str]:
    """The services the rule fires for at ``at``: Grafana's evaluation, series by series."""
    expr, fires = alert_condition(rule)
    return {r["metric"]["job"] for r in prometheus.query(expr, at=at) if fires(r["value"])}


def test_the_history_holds_each_services_runs(prometheus: tuple[PrometheusServer, float]) -> None:
    server, now = prometheus
    runs = {r["metric"]["job"]: r["value"] for r in server.query(
        "sum by (job) (max_over_time(dask_compute_duration_seconds_count[8d]))", at=now)}
    # A long-lived process's six runs, then a process of its own for the last.
    assert runs == {**dict.fromkeys(LAST_RUNS, 7), "etl-missing": 8, "etl-new": 3}


@pytest.mark.parametrize("uid", sorted(JOB_RULES))
def test_each_job_alert_fires_for_its_fault_alone(prometheus: tuple[PrometheusServer, float], uid: str) -> None:
    server, now = prometheus
    expected = {service for service, (_, alerts) in LAST_RUNS.items() if uid in alerts}
    if uid == "dask-job-missing":
        expected = {"etl-missing"}
        # Still missing three days on (where every other job stopped at the history's end too).
        assert "etl-missing" in firing(server, alert_rules()[uid], at=now + 3 * DAY)
    assert firing(server, alert_rules()[uid], at=now) == expected


def test_the_missing_job_was_not_missing_while_it_ran(prometheus: tuple[PrometheusServer, float]) -> None:
    server, now = prometheus
    # Half a day after its last run: not yet missing (with a week of daily runs before); and the
    # other faults were not there yet.
    for uid in sorted(JOB_RULES):
        assert firing(server, alert_rules()[uid], at=now - 1.5 * DAY) == set(), uid


def test_the_jobs_dashboard_shows_a_jobs_week(prometheus: tuple[PrometheusServer, float]) -> None:
    server, now = prometheus
    queries = [(title, expr) for uid, title, expr in dashboard_queries() if uid == "dask-jobs"]
    assert len(queries) >= 9
    shown = {}
    for title, expr in queries:
        expr = expr.replace("$service", "etl-slower").replace("$host", ".*").replace("$name", "nightly")
        match = re.fullmatch(r"label_values\((.*), *(\w+)\)", expr.strip())
        if match:  # Grafana's, not PromQL: the same question as a query
            expr = f"count by ({match.group(2)}) (max_over_time({match.group(1)}[8d]))"
        result = server.query(expr, at=now)
        assert result, (title, expr)
        shown.setdefault(title, []).append(result)
    # The slow run's hour against its usual: as the alert sees it.
    (per_run,), (usual,) = shown["Duration per run"]
    assert per_run["value"] > 3 * usual["value"] > 3 * 0.8
    assert shown["variable name"][0][0]["metric"]["dask_compute_name"] == "nightly"
