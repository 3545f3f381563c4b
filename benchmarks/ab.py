"""The A/B command: this tree against another revision, interleaved in one run.

``make bench-ab OLD=<git rev> [ROWS=a,b]`` checks the other revision out in a worktree
(``trees/<commit>`` in ``--out``, ``benchmarks/out``), builds its own venv there from its own ``uv.lock``
(kept for the next time), and then, for each row, runs an arm of each tree side by side
(:mod:`rig`): the old tree's interpreter and otel_graph, and this tree's, both instrumented
the same way, taking turns on one core, in the blocks, time and runs that ``make bench`` gives
the row's workload. Both arms run this tree's harness and workloads, so that only
otel_graph differs. It prints, per row, new over old with its 95% interval (:mod:`stats`),
beside the same ratio of CPU time, and writes the rows to ``ab.json`` in ``--out``: a
list of ``{"workload", "ratio", "lo", "hi", ...}``.

A ratio under 1 is the new tree being faster. A change to a hot path is worth keeping
when its interval lies under 1; an A/B of a revision against itself (``OLD=HEAD`` on a
clean tree) shows the floor. Usage::

    python benchmarks/ab.py --old REV [--rows sync-100k,threads-2k] [--scale 1] [--blocks N] [--out DIR] \
        --uv UV --python PYTHON
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import rig  # noqa: E402
import stats  # noqa: E402
import table  # noqa: E402
from bench import GROUPS, UNLIMITED  # noqa: E402

#: Each row: its workload, and the options both arms instrument with.
ROWS: dict[str, tuple[str, dict[str, Any]]] = {
    "sync-100k": ("sync-100k", {}),
    "sync-100k-unlimited": ("sync-100k", UNLIMITED),
    "threads-2k": ("threads-2k", {}),
    "tiny-sync-2k": ("tiny-sync-2k", {}),
    "tiny-array-200": ("tiny-array-200", {}),
    "distributed-5k": ("distributed-5k", {}),
}


def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def failed(what: str, error: subprocess.CalledProcessError) -> SystemExit:
    said = "\n".join((error.stderr or "").strip().splitlines()[-40:]) if isinstance(error.stderr, str) else ""
    return SystemExit(f"bench-ab: {what} failed ({error.returncode})" + (f":\n{said}" if said else ""))


def old_tree(rev: str, *, uv: str, python: str, trees: Path) -> Path:
    """The interpreter of ``rev``'s own venv, in a worktree of its own, built from its lock."""
    try:
        commit = git("rev-parse", "--verify", f"{rev}^{{commit}}")
    except subprocess.CalledProcessError:
        raise SystemExit(f"bench-ab: OLD={rev!r} names no commit of this repository") from None
    tree = trees / commit
    if not (tree / ".git").exists():
        trees.mkdir(parents=True, exist_ok=True)
        try:
            git("worktree", "add", "--detach", "--force", str(tree), commit)
        except subprocess.CalledProcessError as error:
            raise failed(f"git worktree add of {rev} at {tree}", error) from None
    venv = tree / ".venv"
    stamp = venv / ".installed-lock"
    if not stamp.exists():
        print(f"bench-ab: building {rev} ({commit[:12]})'s venv from its uv.lock", file=sys.stderr)
        env = {**os.environ, "UV_PROJECT_ENVIRONMENT": str(venv), "UV_PYTHON_DOWNLOADS": "never"}
        try:
            subprocess.run([uv, "sync", "--locked", "--all-extras", "--python", python, "-q"], cwd=tree, env=env,
                           check=True, stderr=subprocess.PIPE, text=True)
        except FileNotFoundError:
            raise SystemExit(f"bench-ab: no uv at {uv!r} (make venv bootstraps one)") from None
        except subprocess.CalledProcessError as error:
            raise failed(f"uv sync of {rev}'s lock in {tree}", error) from None
        stamp.touch()
    return venv / "bin" / "python"


def ab_row(name: str, *, old_python: Path, scale: float, blocks: int | None, logs: Path,
           origins: dict[str, dict[str, Any]]) -> dict[str, Any]:
    workload, options = ROWS[name]
    group = next(g for g in GROUPS if g.workload == workload)
    blocks, seconds, runs = group.plan(scale=scale, blocks=blocks)
    trials = []
    for block in range(blocks):
        arms = [rig.Arm(label, workload, "otel_graph", options=options, python=str(python), pinned=group.pinned,
                        log=logs / f"ab-{name}-{block + 1}-{label}.log")
                for label, python in (("old", old_python), ("new", Path(sys.executable)))]
        trials.append(rig.interleave(arms, runs=runs, seconds=seconds, seed=block,
                                     progress=f"{name} {block + 1}/{blocks}"))
        origins.update({arm.label: arm.origin for arm in arms})
    wall = stats.paired_blocks([rig.paired(t, "new", "old") for t in trials])
    cpu = stats.paired_blocks([rig.paired(t, "new", "old", "cpu_s") for t in trials])
    return {"workload": name, "ratio": wall.ratio, "lo": wall.lo, "hi": wall.hi, "rounds": wall.rounds,
            "cpu_ratio": cpu.ratio, "cpu_lo": cpu.lo, "cpu_hi": cpu.hi}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--old", required=True, help="the git revision to compare this tree with")
    parser.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, of: {', '.join(ROWS)}")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every row's time (and blocks) by this")
    parser.add_argument("--blocks", type=int, help="trials of each row, in place of make bench's")
    parser.add_argument("--uv", required=True, help="the uv that builds the old tree's venv")
    parser.add_argument("--python", required=True, help="the interpreter the old tree's venv is made with")
    parser.add_argument("--out", type=Path, default=HERE / "out", help="where ab.json, the logs and trees go")
    args = parser.parse_args()
    if args.scale <= 0 or (args.blocks is not None and args.blocks < 1):
        parser.error("--scale must be above 0 and --blocks at least 1")
    names = [name.strip() for name in args.rows.split(",") if name.strip()]
    unknown = [name for name in names if name not in ROWS]
    if unknown or not names:
        raise SystemExit(f"bench-ab: unknown rows {', '.join(unknown) or '(none given)'}; "
                         f"the rows are {', '.join(ROWS)}")
    # A path relative to here (as make passes it) would miss from the worktree uv runs in;
    # a bare name is looked up on PATH.
    uv, python = (str(Path(p).absolute()) if os.sep in p else p for p in (args.uv, args.python))
    out = args.out.absolute()
    old_python = old_tree(args.old, uv=uv, python=python, trees=out / "trees")
    rig.pin_controller()
    origins: dict[str, dict[str, Any]] = {}
    rows = [ab_row(name, old_python=old_python, scale=args.scale, blocks=args.blocks, logs=out / "logs",
                   origins=origins) for name in names]
    print(f"new: this tree (otel_graph from {origins['new'].get('otel_graph')}); "
          f"old: {args.old} (from {origins['old'].get('otel_graph')})")
    for label in ("new", "old"):
        found = origins[label].get("versions") or {}
        print(f"{label}: " + ", ".join(f"{name} {version or '(none)'}" for name, version in found.items()))
    print(table.ab_table(rows))
    out.mkdir(parents=True, exist_ok=True)
    (out / "ab.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
