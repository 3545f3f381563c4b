"""``otel-graph report`` and ``export`` on inputs no run of ours writes, but files get: absurd
values, cut lines, spans twice, a missing compute, hostile keys, skewed clocks; and the
files the command writes (private, never through a symlink), with stdout a closed pipe."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import subprocess_env
from otel_graph.report.analysis import critical_path, group
from otel_graph.report.otlp_read import TelemetryFile
from test_cli import CLI, _hand_span, _otlp_line, cli

COMPUTE_ID = "00" * 8


def _task(span_id: str, key: str, start_ms: int, end_ms: int, deps: tuple[str, ...] = (), **attributes: object) -> dict:
    return _hand_span(span_id, key.split("-")[0], start_ms, end_ms, parent=COMPUTE_ID, attributes={
        "dask.task.key": key, "dask.task.prefix": key.split("-")[0], "dask.worker.id": "w1",
        "dask.task.dependencies": list(deps), "dask.task.dependency_count": len(deps), **attributes})


def _compute(start_ms: int = 0, end_ms: int = 100) -> dict:
    return _hand_span(COMPUTE_ID, "dask.compute", start_ms, end_ms)


def _write(path: Path, *lines: list[dict]) -> Path:
    path.write_text("".join(_otlp_line(spans) + "\n" for spans in lines))
    return path


def _report_rows(stdout: str, section: str) -> list[list[str]]:
    """The rows of one table of the text report, split on whitespace, header left out."""
    return [line.split() for line in stdout.split(section + "\n")[1].split("\n\n")[0].splitlines()[1:]]


def test_throughput_is_megabytes_per_second(tmp_path):
    # 100 MB out of a task of 1 s: 100 MB/s (bytes / ns is 10^3 MB/s).
    path = _write(tmp_path / "tp.jsonl", [_compute(0, 2000), _task("01" * 8, "load-1", 0, 1000,
                                                                    **{"dask.task.nbytes": 100_000_000})])
    run = cli("report", str(path))
    assert run.returncode == 0, run.stderr
    (row,) = _report_rows(run.stdout, "Bottlenecks by task prefix")
    assert row[0] == "load" and row[9] == "100.0", row  # prefix, 1.00 s, 100.0 %, 1, 1.00 s, 100.0 MB, MB/s


def _absurd_duration() -> dict:
    return _hand_span("09" * 8, "x", 0, 10, parent=COMPUTE_ID, attributes={
        "dask.task.prefix": "x", "dask.task.count": 3, "dask.task.duration.sum": 1e300})


def _absurd_time() -> dict:
    span = _task("09" * 8, "x-1", 0, 10)
    span["endTimeUnixNano"] = str(10**400)
    return span


@pytest.mark.parametrize("bad, counted", [
    (_absurd_duration, "1 dask.task.duration.sum (span skipped)"),
    (lambda: _task("09" * 8, "x-1", 0, 10, **{"dask.task.nbytes": 10**400}), "1 dask.task.nbytes (dropped)"),
    (_absurd_time, "1 times past OTLP's 64 bits (span skipped)"),
])
def test_absurd_values_are_left_out_and_counted(tmp_path, bad, counted):
    path = _write(tmp_path / "absurd.jsonl", [_compute(), _task("01" * 8, "ok-1", 0, 50), bad()])
    for args in (["report", str(path)], ["export", "--chrome", str(path), "-o", str(tmp_path / "o.json")]):
        run = cli(*args)
        assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr
        (line,) = run.stderr.strip().splitlines()
        assert line == f"otel-graph: {path}: out-of-range values left out: {counted}"


@pytest.mark.parametrize("orjson", [True, False])
def test_a_lone_surrogate_in_a_key_is_printed_escaped(tmp_path, orjson):
    # JSON allows "\ud800"; the standard library reads it, orjson refuses it, UTF-8 cannot encode it.
    path = tmp_path / "surrogate.jsonl"
    path.write_text(_otlp_line([_compute(), _task("01" * 8, "load-1", 0, 50)]).replace("load-1", "load-\\ud800") + "\n")
    block = "" if orjson else "sys.modules['orjson'] = None; "
    code = f"import sys; {block}from otel_graph.cli import main; sys.exit(main(sys.argv[1:]))"
    out = tmp_path / "r.html"
    run = subprocess.run([sys.executable, "-c", code, "report", str(path), "--html", str(out)],
                         env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stderr == "", run.stderr
    assert "load-\\ud800" in run.stdout
    assert "load-\\ud800" in out.read_text(encoding="utf-8")


def test_a_terminal_encoding_without_the_characters_gets_them_escaped(tmp_path):
    path = _write(tmp_path / "cjk.jsonl", [_compute(), _task("01" * 8, "load-数据", 0, 50)])
    run = subprocess.run([*CLI, "report", str(path)], env=subprocess_env(PYTHONIOENCODING="latin-1"),
                         capture_output=True, timeout=120)
    assert run.returncode == 0 and run.stderr == b"", run.stderr
    assert "load-\\u6570\\u636e" in run.stdout.decode("latin-1")


def test_the_same_span_twice_counts_once(tmp_path):
    # Spans are (trace id, span id): the same file twice counts once, and another trace
    # reusing the span ids is another compute.
    line = [_compute(), _task("01" * 8, "a-1", 0, 40), _task("02" * 8, "b-1", 50, 90, ("a-1",))]
    other = json.loads(_otlp_line(line))
    for span in other["resourceSpans"][0]["scopeSpans"][0]["spans"]:
        span["traceId"] = "cd" * 16
    path = _write(tmp_path / "t.jsonl", line)
    path.write_text(path.read_text() + json.dumps(other) + "\n")
    run = cli("report", str(path), str(path))
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("2 computes, 4 tasks (4 with their own span)"), run.stdout
    assert "6 spans read more than once (the same trace and span id" in run.stdout
    target = tmp_path / "trace.json"
    run = cli("export", "--chrome", str(path), str(path), "-o", str(target))
    assert run.returncode == 0, run.stderr
    assert len([e for e in json.loads(target.read_text())["traceEvents"] if e["ph"] == "X"]) == 6


def test_tasks_of_a_missing_compute_are_reported_as_an_incomplete_compute(tmp_path):
    # A compute killed before its span ended: its tasks name a parent no file holds.
    tasks = [_task(f"{i:016x}", f"big-{i}", 10 * i, 10 * i + 30) for i in range(1, 4)]
    path = _write(tmp_path / "orphans.jsonl", tasks)
    run = cli("report", str(path))
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("1 computes, 3 tasks (3 with their own span)"), run.stdout
    assert "1 of the computes incomplete: 3 tasks whose dask.compute span is missing" in run.stdout
    assert "no dask.compute spans found" not in run.stdout
    assert f"Critical path of the compute at {COMPUTE_ID} (3 tasks, wall 50.0 ms, incomplete" in run.stdout


def test_output_files_are_user_only_and_never_written_through_a_symlink(tmp_path):
    path = _write(tmp_path / "t.jsonl", [_compute(), _task("01" * 8, "a-1", 0, 40)])
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    previous = os.umask(0o022)  # the usual umask, which leaves new files world-readable
    try:
        for name, args in (("page.html", ["report", str(path), "--html"]),
                           ("trace.json", ["export", "--chrome", str(path), "-o"])):
            target = tmp_path / name
            target.symlink_to(victim)  # planted where the output goes
            run = cli(*args, str(target))
            assert run.returncode == 0, run.stderr
            assert victim.read_text() == "keep me", "the symlink was followed"
            assert not target.is_symlink() and target.stat().st_size > 0
            assert stat.S_IMODE(target.stat().st_mode) == 0o600, "created user-only: mode 0600"
            target.chmod(0o644)  # an existing, readable file is replaced by a private one
            assert cli(*args, str(target)).returncode == 0
            assert stat.S_IMODE(target.stat().st_mode) == 0o600
    finally:
        os.umask(previous)
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".otel-graph-")], "no temporary left"


def test_a_cut_line_is_skipped_and_counted(tmp_path):
    # JsonLinesFile on a full disk: a line cut short, then the next write joined onto it.
    first = _otlp_line([_compute(), _task("01" * 8, "a-1", 0, 40)])
    second = _otlp_line([_task("02" * 8, "b-1", 50, 90, ("a-1",))])
    third = _otlp_line([_task("03" * 8, "c-1", 90, 95, ("b-1",))])
    path = tmp_path / "cut.jsonl"
    path.write_text(f"{first}\n{second[:70]}{third}\n{third.replace('03' * 8, '04' * 8)}\n")
    for args in (["report", str(path)], ["export", "--chrome", str(path), "-o", str(tmp_path / "o.json")]):
        run = cli(*args)
        assert run.returncode == 0, run.stderr
        (line,) = run.stderr.strip().splitlines()
        assert line.startswith(f"otel-graph: {path}: skipped 1 unreadable line (the first, line 2: not JSON"), line
    assert cli("report", str(path)).stdout.startswith("1 computes, 2 tasks")


@pytest.mark.parametrize("content, message", [("", ": empty: no OTLP JSON lines"), ("\n\n", ": empty"),
                                              ("{cut\n{cut\n", ":1: not JSON")])
def test_a_file_with_no_readable_line_is_refused(tmp_path, content, message):
    path = tmp_path / "nothing.jsonl"
    path.write_text(content)
    run = cli("report", str(path))
    assert run.returncode == 2
    (line,) = run.stderr.strip().splitlines()
    assert line.startswith(f"otel-graph: {path}{message}"), line


def test_a_closed_stdout_still_gets_the_html_written(tmp_path):
    # `otel-graph report f.jsonl --html r.html | head`, with head gone before the report is printed.
    path = _write(tmp_path / "t.jsonl", [_compute(), _task("01" * 8, "a-1", 0, 40)])
    page = tmp_path / "r.html"
    child = subprocess.Popen([*CLI, "report", str(path), "--html", str(page)], env=subprocess_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    child.stdout.close()  # before the child has imported anything, so its first write meets EPIPE
    try:
        stderr = child.communicate(timeout=120)[1].decode()
    finally:
        child.kill()
    assert child.returncode == 0 and stderr == "", stderr
    assert page.stat().st_size > 0


def test_untrusted_text_is_escaped_and_long_cells_cut(tmp_path):
    path = _write(tmp_path / "hostile.jsonl", [
        _compute(), _task("01" * 8, "load-\x1b]0;pwned\x07\x1b[2J\u202e", 0, 40, **{"dask.worker.id": "w\x9b1"}),
        _task("02" * 8, "huge-" + "x" * 100_000, 0, 30)])
    run = cli("report", str(path))
    assert run.returncode == 0, run.stderr
    assert not any(ord(c) < 32 and c != "\n" or 0x7f <= ord(c) < 0xa0 or c == "\u202e" for c in run.stdout)
    assert "load-\\x1b]0;pwned\\x07\\x1b[2J\\u202e" in run.stdout and "w\\x9b1" in run.stdout
    assert max(len(line) for line in run.stdout.splitlines()) < 250
    assert "huge-xxx" in run.stdout and "x…x" in run.stdout


def test_chrome_track_ids_stay_exact_json_integers(tmp_path):
    path = _write(tmp_path / "tid.jsonl", [_compute(), _task("01" * 8, "a-1", 0, 10, **{"thread.id": 10**30}),
                                           _task("02" * 8, "a-2", 10, 20, **{"thread.id": 10**30}),
                                           _task("03" * 8, "a-3", 0, 20, **{"thread.id": 140_000_000_000_007})])
    target = tmp_path / "trace.json"
    run = cli("export", "--chrome", str(path), "-o", str(target))
    assert run.returncode == 0, run.stderr
    tasks = {e["args"]["dask.task.key"]: e for e in json.loads(target.read_text())["traceEvents"]
             if e.get("cat") == "task"}
    assert all(isinstance(e["tid"], int) and 0 <= e["tid"] < 2**53 for e in tasks.values())
    assert tasks["a-1"]["tid"] == tasks["a-2"]["tid"], "one thread, one track"
    assert tasks["a-3"]["tid"] == 140_000_000_000_007, "a real thread ident is kept"


def _aggregated_a(end_ms: int) -> dict:
    return _hand_span("09" * 8, "a", 0, end_ms, parent=COMPUTE_ID, attributes={
        "dask.task.prefix": "a", "dask.task.count": 1, "dask.task.aggregate": True,
        "dask.task.duration.sum": end_ms / 1e3})


def test_a_dependency_folded_into_an_aggregate_is_not_shown_as_idle_time(tmp_path):
    # c-1 waited for a-1 (aggregated, its aggregate ending at 40 ms) and b-1 (0-10 ms): the
    # 35 ms before c-1 may be a-1's compute time, not idle time.
    def spans(aggregate_end_ms: int) -> list[dict]:
        return [_compute(), _aggregated_a(aggregate_end_ms), _task("02" * 8, "b-1", 0, 10),
                _task("03" * 8, "c-1", 45, 90, ("a-1", "b-1"))]

    path = _write(tmp_path / "agg.jsonl", spans(40))
    (compute,) = group(TelemetryFile.open(path).spans()).computes
    found = critical_path(compute)
    assert [(s.span.attributes["dask.task.key"], s.unseen) for s in found.steps] == [("b-1", {}), ("c-1", {"a": 1})]
    assert (found.gaps_ns, found.unseen_ns) == (0, 35 * 10**6)
    run = cli("report", str(path))
    assert "idle gaps 0 µs, and 35.0 ms waiting on aggregated tasks (not known to be idle)" in run.stdout
    assert "c-1       c      w1    45.0 ms   45.0 ms  35.0 ms via 1 aggregated a" in run.stdout
    # An aggregate that ended before b-1 did cannot have held c-1 back: the gap is idle.
    (compute,) = group(TelemetryFile.open(_write(tmp_path / "early.jsonl", spans(5))).spans()).computes
    found = critical_path(compute)
    assert [s.unseen for s in found.steps] == [{}, {}] and found.gaps_ns == 35 * 10**6


def test_the_path_starts_from_a_sink_despite_clock_skew(tmp_path):
    # Worker A's clock is ahead: a-1 seems to end (1.7 s) after b-1, which depends on it, ends (1.5 s).
    path = _write(tmp_path / "skew.jsonl", [_compute(1000, 2000), _task("01" * 8, "a-1", 1100, 1700),
                                             _task("02" * 8, "b-1", 800, 1500, ("a-1",))])
    (compute,) = group(TelemetryFile.open(path).spans()).computes
    assert [s.span.attributes["dask.task.key"] for s in critical_path(compute).steps] == ["a-1", "b-1"]


def test_an_offset_before_the_compute_started_is_a_signed_duration(tmp_path):
    path = _write(tmp_path / "early.jsonl", [_compute(1000, 2000), _task("01" * 8, "b-1", 800, 1500)])
    run = cli("report", str(path))
    (row,) = _report_rows(run.stdout, "Critical path of the compute at 0000000000000000 (1 tasks, wall 1.00 s)")[1:]
    assert row[3:5] == ["-200.0", "ms"], row


@pytest.mark.parametrize("endpoint", ["http://localhost:99999", "http://[::1"])
def test_the_demo_with_an_endpoint_that_cannot_be_read_says_so_in_one_line(tmp_path, endpoint):
    # The demo asked for the collector's port itself, and urllib raised on these (a traceback).
    run = cli("demo", "--out", str(tmp_path / "out"), env=subprocess_env(OTEL_EXPORTER_OTLP_ENDPOINT=endpoint),
              cwd=tmp_path)
    assert run.returncode == 2, run.stderr[-3000:]
    assert run.stderr.strip().splitlines() == [
        f"otel-graph: OTEL_EXPORTER_OTLP_ENDPOINT={endpoint!r} is not valid; accepted values: a URL such as "
        "http://localhost:4317"]


def test_a_prefix_s_gpu_columns_average_only_the_hosts_its_tasks_ran_on():
    # Host a's GPU is busy while its prefix runs there; host b's sits idle meanwhile. Averaging
    # every host's readings said 50%.
    from otel_graph.report.analysis import prefix_table
    from otel_graph.report.otlp_read import Point, Span

    def span(span_id: str, name: str, start_ms: int, end_ms: int, host: str, parent: str = COMPUTE_ID,
             **attributes: object) -> Span:
        return Span("ab" * 16, span_id, parent, name, start_ms * 10**6, end_ms * 10**6, attributes, 0,
                    {"host.name": host})

    spans = [span(COMPUTE_ID, "dask.compute", 0, 100, "a", parent=""),
             span("01" * 8, "train", 0, 100, "a", **{"dask.task.prefix": "train", "dask.task.key": "train-1"})]
    points = [Point("hw.gpu.utilization", t * 10**6, value, {"hw.id": "0"}, {"host.name": host})
              for t in range(10, 100, 10) for host, value in (("a", 1.0), ("b", 0.0))]
    (row,) = prefix_table(group(spans).computes, points)
    assert row.gpu_utilization == 1.0
