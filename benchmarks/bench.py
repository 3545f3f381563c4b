"""What otel_graph costs, as ratios with 95% intervals: the table ``make bench`` prints.

Each group below is a few interleaved trials (:mod:`rig`), its *blocks*, of one workload
(:mod:`workloads`): in each, a plain arm, a second plain arm, otel_graph's arms and, for the
tiny workloads, ``dask.diagnostics.Profiler``'s, all taking turns on one core. Every row is
a ratio of two of those arms over paired rounds, with its interval and verdict
(:mod:`stats`), beside the same ratio of CPU time:

* ``A/A <workload>``: the second plain arm against the first: the same configuration
  against itself, so its interval is the floor of what the trials can resolve. It holds
  when its whole interval lies within 1 ± its target.
* ``<workload>``: otel_graph against plain, judged against the row's bar.
* ``<workload>, Profiler``: the anchor, ``dask.diagnostics.Profiler`` against plain. A tiny
  row also holds when otel_graph is not measurably slower than the Profiler (the
  otel_graph/Profiler interval reaches down to 1).

Usage::

    python benchmarks/bench.py [--only tiny] [--scale 0.5] [--blocks 1] [--out benchmarks/out]

Each group takes turns for a set time (its ``seconds``, split among its blocks; about 23
minutes in all, with the arms' start-ups), with a few runs at least: on a faster machine,
more rounds fill it; on a slower one, fewer, and wider intervals. ``--scale`` multiplies
every group's time, in more (or fewer) blocks, and ``--blocks`` sets how many trials each
group has (a quick look: ``--scale 0.2 --blocks 1``). The table is
also written as ``bench.json`` in ``--out`` (as each group ends), each group's runs as
``runs-<workload>.json`` (every block's arms, their runs and the kept stretch: rounds can be
paired again from them), and each arm's stderr as ``logs/<workload>-<block>-<arm>.log``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import rig  # noqa: E402
import stats  # noqa: E402
import table  # noqa: E402
from workloads import COMPUTES, SYNC_TASKS, SYNC_WARM_TASKS  # noqa: E402

OUT = HERE / "out"
TINY_BARS = {"tiny-sync-2k": 1.15, "tiny-array-200": 1.10}


@dataclass(frozen=True)
class Group:
    """A workload's trials: how many (``blocks``, each with processes of its own), how long
    their arms take turns (``seconds``, all blocks together), how many runs each arm keeps
    in each at least, the A/A row's target and the bar."""

    workload: str
    blocks: int
    seconds: float
    runs: int
    floor: float  # the A/A interval's target half-width
    bar: float
    unlimited: bool = False  # also an arm with every task a span (sync-100k-unlimited)
    pinned: bool = True  # the arms on one core (rig.ARM_CPU), or on all: a cluster's processes side by side

    @property
    def tiny(self) -> bool:
        return self.workload in TINY_BARS

    def plan(self, *, scale: float = 1.0, blocks: int | None = None) -> tuple[int, float, int]:
        """Its trials for a ``--scale`` and ``--blocks``: how many, each one's seconds, and
        each one's runs at least.

        Scaled up, a group gets more blocks of the same length, since its interval is bound
        by how far its blocks' processes differ, more than by its rounds; scaled down, fewer
        blocks (one at least), with 2 runs at least.
        """
        count = blocks or max(1, round(self.blocks * scale))
        runs = max(2, round(self.runs * min(scale, 1.0)))
        return count, self.seconds * scale / count, runs


#: Rounds within one block agree closely (their ratios' spread is 0.5-1.5%), but two blocks'
#: processes can differ by a percent or so for good (tiny-array-200's most), so the time goes
#: to many short blocks; sync-100k's runs are long enough that its blocks keep 2 at least.
GROUPS = (
    Group("sync-100k", blocks=4, seconds=300, runs=2, floor=0.01, bar=1.25, unlimited=True),
    Group("threads-2k", blocks=4, seconds=50, runs=3, floor=0.02, bar=1.03),
    Group("tiny-sync-2k", blocks=4, seconds=300, runs=3, floor=0.01, bar=TINY_BARS["tiny-sync-2k"]),
    Group("tiny-array-200", blocks=10, seconds=270, runs=3, floor=0.01, bar=TINY_BARS["tiny-array-200"]),
    Group("distributed-5k", blocks=4, seconds=300, runs=2, floor=0.02, bar=1.10, pinned=False),
)
UNLIMITED = {"max_task_spans": "unlimited"}


def arms_of(group: Group, *, logs: Path, block: int = 0) -> list[rig.Arm]:
    ways = [("plain", "plain", {}), ("plain-again", "plain", {}), ("otel_graph", "otel_graph", {})]
    if group.unlimited:
        ways.append(("unlimited", "otel_graph", UNLIMITED))
    if group.tiny:
        ways.append(("profiler", "profiler", {}))
    return [rig.Arm(label, group.workload, way, options=options, pinned=group.pinned,
                    log=logs / f"{group.workload}-{block + 1}-{label}.log") for label, way, options in ways]


def ratio_of(trials: list[rig.Trial], measured: str, reference: str, what: str = "wall_s") -> stats.Ratio:
    return stats.paired_blocks([rig.paired(trial, measured, reference, what) for trial in trials])


def row(name: str, trials: list[rig.Trial], measured: str, *, bar: float | None, floor: float | None = None,
        detail: str = "") -> dict[str, Any]:
    """A table row: the wall ratio of ``measured`` to plain, its CPU ratio, its verdict."""
    wall, cpu = ratio_of(trials, measured, "plain"), ratio_of(trials, measured, "plain", "cpu_s")
    out: dict[str, Any] = {"workload": name, "bar": bar, "ratio": wall.ratio, "lo": wall.lo, "hi": wall.hi,
                           "rounds": wall.rounds, "spread": wall.spread, "block_ratios": list(wall.blocks),
                           "cpu_ratio": cpu.ratio, "cpu_lo": cpu.lo, "cpu_hi": cpu.hi}
    if floor is not None:
        out["floor"] = floor
        out["verdict"] = stats.floor_verdict(wall, floor=floor)
    elif bar is not None:
        out["verdict"] = stats.verdict(wall, bar=bar)
        if out["verdict"] == "unresolved":
            out["more_rounds"] = stats.rounds_to_resolve(wall, bar=bar)
    else:
        out["verdict"] = None
    out["detail"] = detail
    return out


def group_rows(group: Group, trials: list[rig.Trial]) -> list[dict[str, Any]]:
    compute = ratio_of(trials, "otel_graph", "plain", "compute_s")
    rows = [row(f"A/A {group.workload}", trials, "plain-again", bar=None, floor=group.floor),
            row(group.workload, trials, "otel_graph", bar=group.bar, detail=f"compute alone {compute.ratio:.3f}×")]
    if group.unlimited:
        rows.append(row(f"{group.workload}-unlimited", trials, "unlimited", bar=1.5,
                        detail=delivered([trial.arms["unlimited"] for trial in trials])))
    if group.tiny:
        rows[-1] = anchored(rows[-1], trials, group)
        rows.append(row(f"{group.workload}, Profiler", trials, "profiler", bar=None))
    return rows


def anchored(bar_row: dict[str, Any], trials: list[rig.Trial], group: Group) -> dict[str, Any]:
    """A tiny row holds under its bar, or when otel_graph is no slower than the Profiler."""
    against = ratio_of(trials, "otel_graph", "profiler")
    plain = [run.wall_s for trial in trials for run in trial.kept("plain")]
    plain_us = 1e6 / COMPUTES[group.workload] * sum(plain) / len(plain)
    bar_row["detail"] = (f"{plain_us:.0f} µs plain a compute, +{(bar_row['ratio'] - 1) * plain_us:.0f} µs with "
                         f"otel_graph; otel_graph / Profiler {against.ratio:.3f}× [{against.lo:.3f}, {against.hi:.3f}]")
    if bar_row["verdict"] != "yes" and against.lo <= 1.0:
        bar_row["verdict"] = "yes"
        bar_row.pop("more_rounds", None)
        bar_row["detail"] += ", not above the Profiler"
    return bar_row


def delivered(arms: list[rig.Arm]) -> str:
    """Whether every span of every run of sync-100k's unlimited arms reached their receivers."""
    runs = sum(arm.completed or 0 for arm in arms)
    each = SYNC_TASKS + 1  # its tasks' spans and the compute's
    got = sum(sum(arm.delivered.values()) for arm in arms)
    expected = runs * each + len(arms) * (SYNC_WARM_TASKS + 1)  # and each arm's warm-up
    if got >= expected:
        return f"{got:,} spans delivered for {runs} runs of {each:,} and the warm-ups ({got - expected} progress spans)"
    return f"{expected - got:,} spans MISSING of {expected:,}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", help="run only the groups whose workload contains this")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every group's time (and blocks) by this")
    parser.add_argument("--blocks", type=int, help="trials of each group, in place of each group's own")
    parser.add_argument("--out", type=Path, default=OUT, help="where bench.json and the arms' logs go")
    args = parser.parse_args()
    if args.scale <= 0 or (args.blocks is not None and args.blocks < 1):
        parser.error("--scale must be above 0 and --blocks at least 1")
    rig.pin_controller()
    began = time.perf_counter()
    rows: list[dict[str, Any]] = []
    for group in GROUPS:
        if args.only and args.only not in group.workload:
            continue
        blocks, seconds, runs = group.plan(scale=args.scale, blocks=args.blocks)
        trials = [rig.interleave(arms_of(group, logs=args.out / "logs", block=block), runs=runs, seconds=seconds,
                                 seed=block, progress=f"{group.workload} {block + 1}/{blocks}")
                  for block in range(blocks)]
        rows.extend(group_rows(group, trials))
        print(f"{group.workload}: {sum(t.seconds for t in trials):.0f} s", file=sys.stderr)
        # Written as each group ends: an interrupted run keeps the rows it measured.
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench.json").write_text(json.dumps(rows, indent=2))
        (args.out / f"runs-{group.workload}.json").write_text(json.dumps([rig.raw(trial) for trial in trials]))
    print(table.table(rows))
    print(f"\n{time.perf_counter() - began:.0f} s in all", file=sys.stderr)


if __name__ == "__main__":
    main()
