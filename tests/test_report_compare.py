"""``otel-graph report --compare``: two real runs of one job; which prefixes got slower, whether the
critical path changed."""

from __future__ import annotations

from pathlib import Path

import pytest

from test_cli import APPS, cli, file_env


def _record(out: Path, *args: str) -> Path:
    run = cli("run", str(APPS / "diamond.py"), *args, env=file_env(out, OTEL_GRAPH_MAX_TASK_SPANS="unlimited"))
    assert run.returncode == 0, run.stderr
    return out / "traces.jsonl"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {"both": _record(tmp_path_factory.mktemp("both"), "--again"),
            "usual": _record(tmp_path_factory.mktemp("usual")),
            "usual again": _record(tmp_path_factory.mktemp("again")),
            "swapped": _record(tmp_path_factory.mktemp("swapped"), "--swap")}


def _compared(*args: str) -> str:
    done = cli("report", "--compare", *args)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("files", [("both",), ("usual", "swapped")])
def test_the_slower_prefix_and_the_new_critical_path_are_named(runs: dict[str, Path], files: tuple[str, ...]) -> None:
    out = _compared(*(str(runs[name]) for name in files))
    assert "Comparing two runs of __main__" in out  # named after the script's module: no name() here
    rows = out.split("Prefixes, most task time added first\n")[1].split("\n\n")[0].splitlines()[1:]
    ratios = {row.split()[0]: float(next(cell for cell in row.split() if cell.endswith("x"))[:-1]) for row in rows}
    assert rows[0].startswith("fast ") and ratios["fast"] > 3  # 0.05 s -> 0.4 s: the most time added
    assert ratios["slow"] < 0.3 and 0.5 < ratios["join"] < 2  # sleeps: a loaded machine stretches them
    assert "Critical path: changed" in out
    assert "before: load -> slow -> join" in out and "after : load -> fast -> join" in out


def test_a_run_like_the_last_has_the_same_path(runs: dict[str, Path]) -> None:
    out = _compared(str(runs["usual"]), str(runs["usual again"]))
    assert "Critical path: the same prefixes in the same order" in out
    assert "before: load -> slow -> join" in out and "after : load -> slow -> join" in out


def test_what_cannot_be_compared_gets_one_clear_line(runs: dict[str, Path], tmp_path: Path) -> None:
    cases = [
        ((str(runs["usual"]),), "nothing to compare: no two computes in the file share one; fingerprints found: "),
        ((str(runs["both"]), "--fingerprint", "0123456789abcdef"),
         "nothing to compare: no two runs with fingerprint 0123456789abcdef"),
        ((str(runs["usual"]),) * 3, "--compare takes one file or two"),
        ((str(runs["usual"]),) * 2, "nothing to compare: both files give the same run (trace "),
        ((str(runs["both"]), "--html", str(tmp_path / "x.html")), "--html does not go with --compare"),
    ]
    for args, message in cases:
        done = cli("report", "--compare", *args)
        assert done.returncode == 2 and done.stdout == "", done.stdout
        (line,) = done.stderr.splitlines()
        assert line.startswith(f"otel-graph: {message}"), line
    # Telemetry from before fingerprints: the compute spans without one.
    unmarked = tmp_path / "unmarked.jsonl"
    unmarked.write_text("\n".join(line.replace('"dask.graph.fingerprint"', '"x.other"')
                                   for line in runs["both"].read_text().splitlines()) + "\n")
    done = cli("report", "--compare", str(unmarked))
    assert done.returncode == 2 and "no compute here carries dask.graph.fingerprint" in done.stderr
