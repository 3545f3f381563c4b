"""The benchmark harness: its statistics on data whose answer is known, and real runs of
``make bench`` and ``make bench-ab`` on one small workload, read from what they write.

Nothing here times otel_graph: the figures of a run on a loaded test machine mean nothing.
What is checked is that the harness measures what it says: one arm running at a time,
runs timed only while their arm ran, every span of the instrumented arm arriving at its
receiver, and the JSON each command writes.
"""

from __future__ import annotations

import doctest
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench  # noqa: E402
import lifecycle  # noqa: E402
import rig  # noqa: E402
import stats  # noqa: E402


@pytest.fixture
def fewer_resamples(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stats, "RESAMPLES", 1000)


def test_verdicts_follow_the_interval() -> None:
    under, over, across = stats.Ratio(1.05, 1.02, 1.08, 20), stats.Ratio(1.2, 1.15, 1.25, 20), \
        stats.Ratio(1.09, 1.06, 1.12, 20)
    assert [stats.verdict(r, bar=1.10) for r in (under, over, across)] == ["yes", "no", "unresolved"]
    # 0.03 of reach over 0.01 of distance: nine times the rounds, so 160 more.
    assert stats.rounds_to_resolve(across, bar=1.10) == 160
    assert stats.rounds_to_resolve(stats.Ratio(1.10, 1.08, 1.12, 20), bar=1.10) is None


def test_an_a_a_row_holds_when_its_interval_lies_within_its_target() -> None:
    within = stats.Ratio(1.001, 0.992, 1.009, 20)
    off_one_side = stats.Ratio(1.004, 0.995, 1.012, 20)  # ±0.85% wide, but reaching past 1.01
    wide = stats.Ratio(1.0, 0.985, 1.016, 20)
    # Off 1, but by less than the target: the trial tells the two apart only within ±1%.
    near = stats.Ratio(1.005, 1.001, 1.009, 20)
    assert [stats.floor_verdict(r, floor=0.01) for r in (within, off_one_side, wide, near)] == \
        ["yes", "no", "no", "yes"]


def test_the_module_s_example_holds() -> None:
    result = doctest.testmod(stats)
    assert result.attempted > 0 and result.failed == 0


def test_intervals_hold_the_true_ratio_about_95_times_in_100(fewer_resamples: None) -> None:
    rng = np.random.default_rng(7)
    covered = 0
    for _ in range(200):
        old = rng.lognormal(0.0, 0.05, size=30)
        new = old * 1.08 * rng.lognormal(0.0, 0.03, size=30)
        r = stats.paired(list(new), list(old))
        covered += r.lo <= 1.08 <= r.hi
    assert 176 <= covered <= 198, covered  # 88% to 99%: the percentile bootstrap runs a little short


def test_rounds_that_share_their_noise_with_a_neighbour_widen_the_interval(fewer_resamples: None) -> None:
    # A reference run overlaps two measured runs, so neighbouring rounds share its noise;
    # drawn one by one, such rounds would be taken as twice as many as they are worth.
    rng = np.random.default_rng(11)
    covered = 0
    for _ in range(200):
        noise = rng.normal(0.0, 0.01, size=31)
        r = stats.paired(list(1.0 + noise[:-1] + noise[1:]), [1.0] * 30)
        covered += r.lo <= 1.0 <= r.hi
    assert covered >= 172, covered  # 177 drawn in neighbouring pairs, 167 one by one


def test_blocks_that_disagree_widen_the_interval(fewer_resamples: None) -> None:
    rng = np.random.default_rng(3)
    noise = [1.0 + 0.01 * rng.standard_normal(10) for _ in range(3)]
    alike = [(list(1.1 * n), [1.0] * 10) for n in noise]
    apart = [(list((1.1 + shift) * n), [1.0] * 10) for n, shift in zip(noise, (-0.03, 0.0, 0.03), strict=True)]
    narrow, wide = stats.paired_blocks(alike), stats.paired_blocks(apart)
    assert wide.hi - wide.lo > 2 * (narrow.hi - narrow.lo)
    assert narrow.lo <= 1.1 <= narrow.hi and wide.rounds == 30


def test_each_block_s_own_ratio_and_the_spread_within_blocks() -> None:
    r = stats.paired_blocks([([1.01, 1.03, 1.02], [1.0] * 3), ([1.11, 1.13, 1.12], [1.0] * 3)])
    assert [round(b, 6) for b in r.blocks] == [1.02, 1.12]
    # 0.01 within each block, however far apart the blocks are.
    assert r.spread == pytest.approx(0.01)


def test_scaling_a_group_gives_it_more_blocks_of_the_same_length() -> None:
    group = bench.Group("tiny-array-200", blocks=10, seconds=270, runs=3, floor=0.01, bar=1.10)
    assert group.plan() == (10, 27.0, 3)
    assert group.plan(scale=2) == (20, 27.0, 3)
    assert group.plan(scale=0.01) == (1, 2.7, 2)
    assert group.plan(scale=0.1, blocks=1) == (1, 27.0, 2)


def test_unequal_rounds_are_refused() -> None:
    with pytest.raises(ValueError, match="differ in number"):
        stats.paired([1.0, 1.1], [1.0])


@pytest.mark.slow
def test_a_trial_runs_one_arm_at_a_time_and_delivers_every_span(tmp_path: Path) -> None:
    # On every core: an arm that went on running in the other's turns would spend about twice
    # the CPU time of the turns it was given.
    arms = [rig.Arm(label, "tiny-array-200", way, pinned=False, log=tmp_path / f"{label}.log")
            for label, way in (("plain", "plain"), ("traced", "otel_graph"))]
    # Two runs each take a few seconds of turns: the trial goes on to fill its 10 s.
    trial = rig.interleave(arms, runs=2, seconds=10, slice_s=0.02)
    assert trial.kept_until - trial.kept_from >= 10
    for label in ("plain", "traced"):
        kept = trial.kept(label)
        assert len(kept) >= 2
        for run in kept:
            # Running for about half of its span: the other arm had the rest.
            assert 0.2 * (run.end - run.start) < run.wall_s < 0.8 * (run.end - run.start)
            assert run.compute_s <= run.wall_s
    for run in trial.kept("plain"):
        # Counted, and no more than its turns allow. The floor is low: another job on the
        # machine takes CPU from an arm within its turns.
        assert 0.1 * run.wall_s < run.cpu_s < 1.15 * run.wall_s
    traced = trial.arms["traced"]
    assert traced.completed is not None and traced.completed >= 2
    # Every run's 200 computes and the 20 of the warm-up, each one trace of its compute span
    # and its tasks: as many compute spans arrived, and never a task without its compute.
    assert traced.delivered["dask.compute"] == 200 * traced.completed + 20
    assert trial.arms["plain"].delivered == {}
    ours, theirs = rig.paired(trial, "traced", "plain")
    assert len(ours) == len(theirs) == len(trial.kept("traced")) and all(t > 0 for t in theirs)


def bench_command(*args: str) -> list[str]:
    return [sys.executable, str(ROOT / "benchmarks" / args[0]), *args[1:]]


@pytest.mark.slow
def test_make_bench_writes_its_table_with_intervals_and_verdicts(tmp_path: Path) -> None:
    done = subprocess.run(bench_command("bench.py", "--only", "tiny-array", "--scale", "0.1", "--blocks", "1",
                                        "--out", str(tmp_path)), capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {row["workload"]: row for row in json.loads((tmp_path / "bench.json").read_text())}
    assert set(rows) == {"A/A tiny-array-200", "tiny-array-200", "tiny-array-200, Profiler"}
    for row in rows.values():
        assert row["lo"] <= row["ratio"] <= row["hi"] and row["cpu_lo"] <= row["cpu_ratio"] <= row["cpu_hi"]
        assert row["rounds"] >= 2
    traced = rows["tiny-array-200"]
    assert traced["bar"] == 1.10 and "otel_graph / Profiler" in traced["detail"]
    # Its verdict is its interval's against the bar, unless the Profiler's anchor met it.
    against_bar = stats.verdict(stats.Ratio(traced["ratio"], traced["lo"], traced["hi"], traced["rounds"]), bar=1.10)
    anchored = "not above the Profiler" in traced["detail"]
    assert traced["verdict"] == ("yes" if anchored else against_bar) and not (anchored and against_bar == "yes")
    assert rows["A/A tiny-array-200"]["floor"] == 0.01 and rows["A/A tiny-array-200"]["bar"] is None
    assert "| tiny-array-200 | ≤ 1.10× |" in done.stdout


def uv_binary() -> Path | None:
    found = sorted(ROOT.glob(".tools/uv-*/bin/uv"))
    return found[-1] if found else None


@pytest.mark.slow
@pytest.mark.skipif(uv_binary() is None, reason="no uv in .tools/ (make venv bootstraps it)")
def test_make_bench_ab_builds_the_other_tree_and_compares(tmp_path: Path) -> None:
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
    tree = tmp_path / "trees" / head.stdout.strip()
    uv = uv_binary()
    assert uv is not None
    try:
        # From the repository's root with uv's path relative to it, as make runs it.
        done = subprocess.run(bench_command("ab.py", "--old", "HEAD", "--rows", "tiny-array-200", "--scale", "0.1",
                                            "--blocks", "1", "--out", str(tmp_path), "--uv", str(uv.relative_to(ROOT)),
                                            "--python", sys.executable), capture_output=True, text=True, timeout=280,
                              cwd=ROOT)
        assert done.returncode == 0, done.stderr[-3000:]
        (row,) = json.loads((tmp_path / "ab.json").read_text())
        assert row["workload"] == "tiny-array-200" and row["lo"] <= row["ratio"] <= row["hi"]
        assert not math.isnan(row["cpu_ratio"])
        # The old arm ran the other tree's otel_graph, from its own venv built from its lock.
        assert f"(from {tree / 'otel_graph' / '__init__.py'})" in done.stdout
        assert f"otel_graph from {ROOT / 'otel_graph' / '__init__.py'}" in done.stdout
        assert (tree / ".venv" / ".installed-lock").exists()
        assert "| tiny-array-200 |" in done.stdout
        bad = subprocess.run(bench_command("ab.py", "--old", "no-such-rev", "--uv", str(uv_binary()), "--python",
                                           sys.executable, "--out", str(tmp_path)), capture_output=True, text=True)
        assert bad.returncode != 0 and "OLD='no-such-rev' names no commit" in bad.stderr
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True)


def test_start_and_stop_rows_judge_only_the_comparisons_with_bars() -> None:
    # Seconds a round: the sdk arm 0.3 s over plain, otel_graph 0.05 s over the sdk.
    plain = [1.0 + 0.01 * (i % 3) for i in range(10)]
    runs = {"plain": {"up": plain, "exit": plain},
            "sdk": {"up": [x + 0.3 for x in plain], "exit": [x + 0.3 for x in plain]},
            "otel_graph": {"up": [x + 0.35 for x in plain], "exit": [x + 0.35 for x in plain]}}
    rows = lifecycle.rows(runs, lifecycle.COMPARISONS, bars={"up": 0.1}, protocol="grpc")
    got = {(r["new"], r["old"], r["phase"]): r for r in rows}
    assert got["sdk", "plain", "up"]["verdict"] is None  # the SDK's own cost is shown, not judged
    assert got["otel_graph", "plain", "up"]["verdict"] == "no"
    assert got["otel_graph", "sdk", "up"]["verdict"] == "yes"
    assert got["otel_graph", "sdk", "exit"]["bar"] is None  # a phase without a bar is not judged
    assert math.isclose(got["otel_graph", "sdk", "up"]["added"], 0.05, abs_tol=1e-9)
    table = lifecycle.table(rows)
    assert "| grpc | up | otel_graph - plain | 1.01 s | +0.350 s [+0.350, +0.350] | ≤ +0.1 s | **no** |" in table
