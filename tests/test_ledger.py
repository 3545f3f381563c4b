"""The scheduler's ledger of undelivered telemetry, and a worker's count of what it delivered.

End to end (a worker SIGKILLed before it could deliver) is in ``test_worker_exits.py``;
here the arithmetic: whatever a worker reports, and however it folded its prefixes, a
compute's lost count is what ran minus what was delivered, and bad reports never raise.
"""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

pytest.importorskip("distributed")  # the scheduler's side imports it

from otel_graph.cluster.deliveries import Deliveries, MetricDeliveries  # noqa: E402
from otel_graph.cluster.ledger import MAX_OPEN_COMPUTES, Ledger, LostRuns, MetricLedger  # noqa: E402
from otel_graph.cluster.scheduler import SchedulerTelemetryPlugin  # noqa: E402
from otel_graph.naming import OTHER_PREFIXES  # noqa: E402
from otel_graph.telemetry.metrics import MAX_METRIC_PREFIXES  # noqa: E402
from otel_graph.telemetry.policy import MAX_AGGREGATES  # noqa: E402

TP = "00-0000000000000000000000000000000a-000000000000000b-01"


def lost_by_prefix(ledger: Ledger, worker: str) -> dict[str, int]:
    return {row.prefix: row.count for row in ledger.lost(worker)}


def test_a_worker_that_did_not_join_is_not_tallied():
    ledger = Ledger()
    ledger.finished("w1", TP, "inc", start_s=0.0, stop_s=1.0)
    assert ledger.outstanding("w1") == 0 and ledger.lost("w1") == []


def test_prefixes_past_the_limit_fold_and_a_worker_folding_differently_still_settles():
    ledger = Ledger()
    ledger.join("w1")
    prefixes = [f"p{i}" for i in range(MAX_AGGREGATES + 50)]
    for prefix in prefixes:
        ledger.finished("w1", TP, prefix, start_s=0.0, stop_s=0.5)
    ledger.join("w1")  # joining again keeps the tally
    assert ledger.outstanding("w1") == len(prefixes)
    # The worker folded from the 20th prefix on (its budget kept spans for the first 20).
    ledger.delivered("w1", [[TP, prefix, 1, 500_000_000] for prefix in prefixes[:20]])
    ledger.delivered("w1", [[TP, OTHER_PREFIXES, len(prefixes) - 21, 10]])
    assert ledger.outstanding("w1") == 1
    (row,) = ledger.lost("w1")
    assert row.count == 1 and row.traceparent == TP


def test_what_is_lost_keeps_its_prefix_duration_and_time_range():
    ledger = Ledger()
    ledger.join("w1")
    ledger.finished("w1", TP, "load", start_s=100.0, stop_s=102.0)
    ledger.finished("w1", TP, "load", start_s=101.0, stop_s=101.5)
    ledger.finished("w1", TP, "sum", start_s=103.0, stop_s=103.25)
    ledger.delivered("w1", [[TP, "sum", 1, 250_000_000]])
    (row,) = ledger.lost("w1")
    assert (row.prefix, row.count, row.duration_s, row.start_s, row.stop_s) == ("load", 2, 2.5, 100.0, 102.0)


def test_a_worker_with_a_collector_down_for_good_keeps_a_bounded_ledger(caplog):
    ledger = Ledger()
    ledger.join("w1")
    for i in range(MAX_OPEN_COMPUTES + 10):
        ledger.finished("w1", f"00-{i:032x}-{1:016x}-01", "inc", start_s=0.0, stop_s=0.0)
    assert ledger.outstanding("w1") == MAX_OPEN_COMPUTES
    assert ledger.untracked == 10
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "otel_graph"]  # said once
    assert "stops keeping count" in warning


rows = st.lists(st.one_of(
    st.none(), st.integers(), st.text(max_size=5),
    st.lists(st.one_of(st.text(max_size=60), st.integers(-5, 10**20), st.floats(), st.none()), max_size=5),
    st.tuples(st.just(TP), st.text(max_size=5), st.integers(-5, 5), st.integers(-5, 10**12)),
), max_size=8)


@settings(max_examples=300, deadline=None)
@given(report=st.one_of(rows, st.none(), st.text(), st.dictionaries(st.text(), st.integers())))
@example(report=[[TP, "inc", float("inf"), 1], [TP, "inc", 1, float("nan")]])
@example(report=[[{"a": 1}, "inc", 1, 1], [TP, ["inc"], 1, 1]])  # msgpack turns maps into dicts
def test_any_report_is_taken_without_raising(report):
    ledger = Ledger()
    ledger.join("w1")
    ledger.finished("w1", TP, "inc", start_s=0.0, stop_s=1.0)
    ledger.delivered("w1", report)
    assert 0 <= ledger.outstanding("w1") <= 1


@settings(max_examples=200, deadline=None)
@given(runs=st.lists(st.tuples(st.integers(0, 2), st.sampled_from(["a", "b", "c", "x0", "x1"])), max_size=60),
       delivered_share=st.floats(0, 1), regroup=st.booleans())
def test_a_compute_s_lost_count_is_what_ran_minus_what_was_delivered(runs, delivered_share, regroup):
    ledger = Ledger()
    ledger.join("w1")
    ran: dict[str, int] = {}
    for compute, prefix in runs:
        traceparent = f"00-{compute + 1:032x}-{1:016x}-01"
        ledger.finished("w1", traceparent, prefix, start_s=0.0, stop_s=0.001)
        ran[traceparent] = ran.get(traceparent, 0) + 1
    delivered: dict[str, int] = {}
    for traceparent, count in ran.items():
        share = int(count * delivered_share)
        delivered[traceparent] = share
        # Reported under one prefix (a worker that folded them all) or split across two.
        report = [[traceparent, OTHER_PREFIXES, share, 0]] if regroup else \
            [[traceparent, "a", share // 2, 0], [traceparent, "zz", share - share // 2, 0]]
        ledger.delivered("w1", report)
    lost: dict[str, int] = {}
    for row in ledger.lost("w1"):
        lost[row.traceparent] = lost.get(row.traceparent, 0) + row.count
    assert lost == {tp: n - delivered[tp] for tp, n in ran.items() if n - delivered[tp]}


def test_deliveries_count_task_spans_and_aggregates_per_worker_not_phases_or_recoveries():
    parent = NS(trace_id=0xA, span_id=0xB, trace_flags=1)
    on = lambda worker, **extra: {"dask.task.prefix": "inc", "dask.worker.id": worker, **extra}  # noqa: E731
    spans = [
        NS(parent=parent, start_time=0, end_time=10, attributes=on("w1")),
        NS(parent=parent, start_time=0, end_time=10, attributes=on("w2")),
        NS(parent=parent, start_time=0, end_time=10, attributes=on("w1", **{"dask.task.count": 7,
                                                                           "dask.task.duration.sum": 1e-6})),
        NS(parent=parent, start_time=0, end_time=10, attributes={"dask.task.key": "inc-1", "dask.worker.id": "w1"}),
        NS(parent=parent, start_time=0, end_time=10, attributes=on("w1", **{"dask.task.recovered": True,
                                                                           "dask.task.count": 3})),
        NS(parent=None, start_time=0, end_time=10, attributes=on("w1")),
    ]
    deliveries = Deliveries()
    deliveries.count(spans)
    assert deliveries.take("w1") == [[TP, "inc", 8, 1010, False]]
    assert deliveries.take("w1") == []
    assert [row[2] for row in deliveries.take("w2")] == [1]


def test_a_lost_worker_s_event_names_the_submitting_client_and_stays_bounded():
    plugin = SchedulerTelemetryPlugin()
    plugin._ledger.join("w1")
    computes = [f"00-{c + 1:032x}-{1:016x}-01" for c in range(25)]
    plugin._owners[computes[0]] = "Client-1"
    for traceparent in computes:  # 25 computes x 101 prefixes: more rows than an event carries
        for i in range(MAX_AGGREGATES + 1):
            plugin._ledger.finished("w1", traceparent, f"p{i}", start_s=float(i), stop_s=i + 0.5)
    rows = plugin._lost_rows("w1")
    # Each compute's prefixes summed into one row, with the client that submitted it (if known).
    assert sorted(r[:4] for r in rows) == sorted(
        [[tp, "Client-1" if tp == computes[0] else "", OTHER_PREFIXES, MAX_AGGREGATES + 1] for tp in computes])
    assert all(r[4:] == [(MAX_AGGREGATES + 1) * 0.5, 0.0, MAX_AGGREGATES + 0.5] for r in rows)


def test_a_closing_worker_settles_its_own_and_only_runs_after_its_goodbye_are_lost():
    ledger = Ledger()
    ledger.join("w1")
    for _ in range(3):
        ledger.finished("w1", TP, "inc", start_s=0.0, stop_s=1.0)
    # Closing with 3 undelivered: it delivers them on its way out or counts them itself.
    ledger.delivered("w1", [], closing=True)
    assert ledger.outstanding("w1") == 0
    # A run after the goodbye (a SIGTERMed worker's last one) has no telemetry left to see it.
    ledger.finished("w1", TP, "inc", start_s=2.0, stop_s=3.0)
    ledger.delivered("w1", [[TP, "inc", 1, 10**9]])  # a late report is not the ledger's to take
    assert lost_by_prefix(ledger, "w1") == {"inc": 1}


def test_a_lost_worker_s_runs_are_what_finished_less_its_last_delivered_counts():
    runs = MetricLedger()
    runs.join("w1")
    for prefix, failed in [("inc", False)] * 5 + [("inc", True)] * 2 + [("sum", False)]:
        runs.finished("w1", prefix, failed=failed, duration_s=0.1)
    runs.delivered("w1", [["inc", False, 2, 200_000_000]])
    runs.delivered("w1", [["inc", False, 4, 400_000_000], ["inc", True, 2, 1]])  # cumulative: the later wins
    assert sorted(runs.lost("w1")) == [LostRuns("inc", False, 1, 0.1), LostRuns("sum", False, 1, 0.1)]
    assert runs.lost("w1") == []


def test_runs_past_the_metric_prefix_limit_settle_against_the_overflow_label():
    runs = MetricLedger()
    runs.join("w1")
    prefixes = [f"x{i}" for i in range(MAX_METRIC_PREFIXES + 10)]
    for prefix in prefixes:
        runs.finished("w1", prefix, failed=False, duration_s=0.0)
    # The worker labelled its first 1,990 itself and the rest overflow: 20 of them in all.
    report = [[p, False, 1, 0] for p in prefixes[:MAX_METRIC_PREFIXES - 10]] + [[OTHER_PREFIXES, False, 19, 0]]
    runs.delivered("w1", report)
    assert sum(row.count for row in runs.lost("w1")) == 1


def test_a_closing_worker_settles_its_own_runs():
    runs = MetricLedger()
    runs.join("w1")
    runs.finished("w1", "inc", failed=False, duration_s=1.0)
    runs.delivered("w1", None, closing=True)
    runs.finished("w1", "inc", failed=False, duration_s=1.0)  # after its goodbye
    runs.delivered("w1", [["inc", False, 9, 0]])  # not the ledger's to take any more
    assert runs.lost("w1") == [LostRuns("inc", False, 1, 1.0)]


@settings(max_examples=200, deadline=None)
@given(report=st.one_of(rows, st.none(), st.text(), st.dictionaries(st.text(), st.integers())))
@example(report=[["inc", False, float("inf"), 1], ["inc", False, 1, float("nan")]])
@example(report=[[{"a": 1}, False, 1, 1], ["inc", {"b": 2}, 1, 1]])
def test_any_task_count_report_is_taken_without_raising(report):
    runs = MetricLedger()
    runs.join("w1")
    runs.finished("w1", "inc", failed=False, duration_s=1.0)
    runs.delivered("w1", report)
    assert sum(row.count for row in runs.lost("w1")) in (0, 1)


def test_metric_deliveries_sum_delta_exports_and_keep_the_latest_cumulative_ones():
    def export(count: int, *, temporality: int, outcome: str = "success") -> NS:
        point = NS(attributes={"dask.task.prefix": "inc", "dask.task.outcome": outcome}, count=count, sum=count / 10)
        other = NS(name="dask.task.output.size", data=NS(aggregation_temporality=temporality, data_points=[point]))
        metric = NS(name="dask.task.duration", data=NS(aggregation_temporality=temporality, data_points=[point]))
        return NS(resource_metrics=[NS(scope_metrics=[NS(metrics=[other, metric])])])

    delta = MetricDeliveries()
    delta.count(export(3, temporality=1))
    delta.count(export(2, temporality=1))
    delta.count(export(1, temporality=1, outcome="error"))
    assert sorted(delta.take()) == [["inc", False, 5, 500_000_000], ["inc", True, 1, 100_000_000]]
    cumulative = MetricDeliveries()
    cumulative.count(export(3, temporality=2))
    cumulative.count(export(5, temporality=2))
    assert cumulative.take() == [["inc", False, 5, 500_000_000]]
    cumulative.count(export(5, temporality=2))
    assert cumulative.take() == []  # unchanged: nothing to report


def test_runs_are_counted_only_for_a_worker_whose_task_metrics_are_counted():
    # A worker whose metrics go to a Prometheus scrape (or nowhere) reports no task counts:
    # its runs must not all look lost with it.
    from otel_graph.cluster.ledger import TOPIC

    def plugin_after(report: dict) -> SchedulerTelemetryPlugin:
        plugin = SchedulerTelemetryPlugin()
        task = NS(annotations={}, prefix=NS(name="inc"))
        plugin._scheduler = NS(tasks={"inc-1": task}, workers={"w1": None})
        plugin.log_event(TOPIC, {"worker": "w1", "delivered": [], "closing": False, **report})
        plugin.transition("inc-1", "processing", "memory", stimulus_id="s", worker="w1",
                          startstops=[{"action": "compute", "start": 1.0, "stop": 1.5}])
        return plugin

    assert plugin_after({"metrics": None})._runs.lost("w1") == []
    assert plugin_after({"metrics": []})._runs.lost("w1") == [LostRuns("inc", False, 1, 0.5)]


def test_a_retried_failure_s_span_is_not_taken_from_the_successes_a_worker_still_owes():
    # retries=: a failed attempt goes processing -> waiting, which the scheduler does not
    # tally, but its worker delivers the attempt's error span all the same.
    from opentelemetry.trace import StatusCode

    parent = NS(trace_id=0xA, span_id=0xB, trace_flags=1)
    attempt = NS(parent=parent, start_time=0, end_time=10, status=NS(status_code=StatusCode.ERROR),
                 attributes={"dask.task.prefix": "flaky", "dask.worker.id": "w1"})
    deliveries = Deliveries()
    deliveries.count([attempt])
    ledger = Ledger()
    ledger.join("w1")
    ledger.finished("w1", TP, "flaky", start_s=1.0, stop_s=2.0)  # the retry's success, not yet delivered
    ledger.finished("w1", TP, "boom", start_s=1.0, stop_s=2.0, failed=True)  # a failure for good
    ledger.delivered("w1", deliveries.take("w1"))
    assert sorted(lost_by_prefix(ledger, "w1").items()) == [("boom", 1), ("flaky", 1)]
    # A failure's delivered span settles its own tally, and only that.
    ledger.join("w1")
    ledger.finished("w1", TP, "boom", start_s=1.0, stop_s=2.0, failed=True)
    ledger.finished("w1", TP, "ok", start_s=1.0, stop_s=2.0)
    ledger.delivered("w1", [[TP, "boom", 1, 10**9, True], [TP, "boom", 5, 10**9, True]])
    assert lost_by_prefix(ledger, "w1") == {"ok": 1}


def test_a_retried_failure_s_metrics_are_not_taken_from_the_successes():
    runs = MetricLedger()
    runs.join("w1")
    for _ in range(3):
        runs.finished("w1", "flaky", failed=False, duration_s=1.0)
    # The worker counted two failed attempts the scheduler retried, and one success.
    runs.delivered("w1", [["flaky", True, 2, 0], ["flaky", False, 1, 10**9]])
    assert runs.lost("w1") == [LostRuns("flaky", False, 2, 2.0)]


def test_a_late_goodbye_of_replaced_telemetry_does_not_end_its_successor_s_accounts():
    # uninstrument() then instrument_scheduler(): the old worker telemetry's closing report
    # can reach the new scheduler plugin after the new telemetry joined.
    from otel_graph.cluster.ledger import TOPIC

    plugin = SchedulerTelemetryPlugin()
    task = NS(annotations={}, prefix=NS(name="inc"))
    plugin._scheduler = NS(tasks={"inc-1": task}, workers={"w1": None})

    def report(session: int, **message) -> None:
        plugin.log_event(TOPIC, {"worker": "w1", "delivered": [], "metrics": [], "closing": False,
                                 "session": session, **message})

    def run() -> None:
        plugin.transition("inc-1", "processing", "memory", stimulus_id="s", worker="w1",
                          startstops=[{"action": "compute", "start": 1.0, "stop": 1.5}])

    report(2)  # the successor joins
    report(1, closing=True)  # its predecessor's goodbye, late
    run()
    assert plugin._runs.lost("w1") == [LostRuns("inc", False, 1, 0.5)]
    # The other order: the goodbye first, then the successor starts afresh.
    plugin = SchedulerTelemetryPlugin()
    plugin._scheduler = NS(tasks={"inc-1": task}, workers={"w1": None})
    report(1, metrics=[["inc", False, 40, 0]])
    report(1, closing=True)
    report(2)
    run()
    report(1, metrics=[["inc", False, 41, 0]])  # a report of the replaced telemetry: ignored
    assert plugin._runs.lost("w1") == [LostRuns("inc", False, 1, 0.5)]


def test_task_counts_are_reported_from_when_the_telemetry_began():
    point = NS(attributes={"dask.task.prefix": "inc", "dask.task.outcome": "success"}, count=7, sum=0.7)
    metric = NS(name="dask.task.duration", data=NS(aggregation_temporality=2, data_points=[point]))
    deliveries = MetricDeliveries()
    deliveries.count(NS(resource_metrics=[NS(scope_metrics=[NS(metrics=[metric])])]))
    base = deliveries.totals()
    point.count, point.sum = 10, 1.0
    deliveries.count(NS(resource_metrics=[NS(scope_metrics=[NS(metrics=[metric])])]))
    assert deliveries.take(since=base) == [["inc", False, 3, 300_000_000]]
