"""The ``otel-graph`` command end to end: real runs writing OTLP JSON files, then report, HTML and Chrome export."""

from __future__ import annotations

import io
import json
import os
import re
import stat
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import browser
from browser import needs_chromium
from conftest import needs_distributed, subprocess_env
from otel_graph.report.analysis import critical_path, group
from otel_graph.report.otlp_read import TelemetryFile

APPS = Path(__file__).parent / "apps"
CLI = [sys.executable, "-m", "otel_graph.cli"]


def cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
        timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], env=env or subprocess_env(), cwd=cwd, capture_output=True, text=True,
                          timeout=timeout_s)


def file_env(out: Path, **extra: str) -> dict[str, str]:
    return subprocess_env(OTEL_TRACES_EXPORTER="otlp_file", OTEL_METRICS_EXPORTER="otlp_file",
                          OTEL_GRAPH_FILE_DIR=str(out), **extra)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    """A real run of a diamond graph through ``otel-graph run``, recorded to files."""
    out = tmp_path_factory.mktemp("recorded")
    run = cli("run", str(APPS / "diamond.py"), "--scheduler", "threads",
              env=file_env(out, OTEL_GRAPH_MAX_TASK_SPANS="unlimited"))
    assert run.returncode == 0, run.stderr
    assert "RESULT 42" in run.stdout
    return out


def test_run_writes_owner_only_otlp_json_files(recorded):
    for name in ("traces.jsonl", "metrics.jsonl"):
        mode = stat.S_IMODE((recorded / name).stat().st_mode)
        assert mode == 0o600, oct(mode)
    first = json.loads((recorded / "traces.jsonl").read_text().splitlines()[0])
    span = first["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    assert len(span["traceId"]) == 32 and int(span["traceId"], 16)  # hex, as OTLP/JSON requires


def test_critical_path_of_a_real_run_is_the_slow_branch(recorded):
    spans = list(TelemetryFile.open(recorded / "traces.jsonl").spans())
    (compute,) = group(spans).computes
    path = critical_path(compute)
    # slow (0.3 s) and fast (0.05 s) both feed join (0.1 s): join waited for slow.
    assert [step.span.attributes["dask.task.key"] for step in path.steps] == ["load", "slow", "join"]
    assert path.on_path_ns <= compute.wall_ns
    assert 0.4e9 <= path.on_path_ns <= compute.wall_ns


def test_report_prints_every_section(recorded):
    run = cli("report", str(recorded / "traces.jsonl"), str(recorded / "metrics.jsonl"))
    assert run.returncode == 0, run.stderr
    out = run.stdout
    for heading in ("Bottlenecks by task prefix", "Slowest tasks", "Worker balance", "Critical path"):
        assert heading in out
    table = out.split("Bottlenecks by task prefix\n")[1].split("\n\n")[0].splitlines()
    assert table[0].split()[:4] == ["prefix", "duration", "%", "total"]
    assert table[1].split()[0] == "slow", "the slowest prefix comes first"
    assert out.index("slow") < out.index("join")


def test_chrome_export_is_valid_trace_event_json(recorded, tmp_path):
    target = tmp_path / "trace.json"
    run = cli("export", "--chrome", str(recorded / "traces.jsonl"), str(recorded / "metrics.jsonl"),
              "-o", str(target))
    assert run.returncode == 0, run.stderr
    events = json.loads(target.read_text())["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    assert {e["name"] for e in complete} >= {"dask.compute", "load", "slow", "fast", "join"}
    for event in complete:
        assert isinstance(event["ts"], float) and event["dur"] >= 0
        assert isinstance(event["pid"], int) and isinstance(event["tid"], int)
    named = {e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert {e["pid"] for e in events if e["ph"] in ("X", "C")} <= named
    (slow,) = [e for e in complete if e["name"] == "slow"]
    assert 0.3e6 <= slow["dur"] < 1e6  # microseconds
    assert any(e["ph"] == "C" for e in events), "CPU/memory readings become counter tracks"


@pytest.mark.parametrize("content, message", [
    (None, "no such file"),
    ("{not json\n", ":1: not JSON"),
    ('{"hello": "world"}\n', ":1: not an OTLP JSON export request"),
    ('{"resourceSpans": [{"scopeSpans": [{"spans": [{"name": "x"}]}]}]}\n', "malformed data"),
])
def test_bad_input_gets_one_clear_line(tmp_path, content, message):
    path = tmp_path / "input.jsonl"
    if content is not None:
        path.write_text(content)
    for args in (["report", str(path)], ["export", "--chrome", str(path), "-o", str(tmp_path / "o.json")]):
        run = cli(*args)
        assert run.returncode == 2
        assert "Traceback" not in run.stderr
        (line,) = run.stderr.strip().splitlines()
        assert line.startswith("otel-graph: ") and message in line and str(path) in line


def test_a_collectors_file_exporter_output_is_read(tmp_path):
    # The collector's file exporter: same OTLP/JSON, with fields we do not write ourselves.
    line = {"resourceSpans": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "etl"}}],
                     "droppedAttributesCount": 0},
        "scopeSpans": [{"scope": {"name": "otel_graph"}, "spans": [
            {"traceId": "5b8efff798038103d269b633813fc60c", "spanId": "eee19b7ec3c1b174", "name": "dask.compute",
             "kind": 1, "flags": 256, "startTimeUnixNano": "1000000000", "endTimeUnixNano": "3000000000",
             "attributes": [{"key": "dask.graph.tasks", "value": {"intValue": "1"}}], "status": {}},
            {"traceId": "5b8efff798038103d269b633813fc60c", "spanId": "eee19b7ec3c1b175",
             "parentSpanId": "eee19b7ec3c1b174", "name": "inc", "kind": 1,
             "startTimeUnixNano": "1500000000", "endTimeUnixNano": "2500000000",
             "attributes": [{"key": "dask.task.key", "value": {"stringValue": "inc-1"}},
                            {"key": "dask.task.prefix", "value": {"stringValue": "inc"}},
                            {"key": "dask.task.nbytes", "value": {"intValue": "28"}}],
             "status": {"code": 2, "message": "ValueError: x"}}]}]}]}
    path = tmp_path / "collector.json"
    path.write_text(json.dumps(line) + "\n")
    run = cli("report", str(path))
    assert run.returncode == 0, run.stderr
    assert "1 computes, 1 tasks" in run.stdout
    row = run.stdout.split("Bottlenecks by task prefix\n")[1].splitlines()[1].split()
    assert row[0] == "inc" and row[1:3] == ["1.00", "s"] and row[-1] == "1"  # one error


def test_report_shows_a_progress_bar_on_a_terminal_and_none_when_piped(recorded, tmp_path):
    import pty

    args = [*CLI, "report", str(recorded / "traces.jsonl"), "--html", str(tmp_path / "page.html")]
    piped = subprocess.run(args, env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert piped.returncode == 0 and "reading [" not in piped.stderr and "writing" not in piped.stderr
    leader, follower = pty.openpty()
    with os.fdopen(leader, "rb", buffering=0) as terminal:
        run = subprocess.run(args, env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=follower, timeout=120)
        os.close(follower)
        shown = b""
        while True:
            try:
                chunk = terminal.read(4096)
            except OSError:  # the terminal's other end closed: all was read
                break
            if not chunk:
                break
            shown += chunk
    assert run.returncode == 0
    text = shown.decode("utf-8", "replace")
    assert re.search(r"reading \[#{36}\] 100%", text), text
    assert f"writing {tmp_path / 'page.html'}" in text


@pytest.mark.slow
@needs_distributed  # the demo's second part runs on a LocalCluster
def test_demo_on_the_embedded_default(tmp_path):
    closed = "http://127.0.0.1:9"  # discard port: nothing answers, so files are the default
    run = cli("demo", "--out", str(tmp_path / "out"), env=subprocess_env(OTEL_EXPORTER_OTLP_ENDPOINT=closed),
              cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "no collector answers" in run.stdout
    assert "the pipeline failed as planned" in run.stdout
    assert "Critical path" in run.stdout and "qr" in run.stdout
    for name in ("traces.jsonl", "metrics.jsonl", "report.html"):
        assert (tmp_path / "out" / name).stat().st_size > 0, name
    assert "[####" in run.stdout, "the ProgressBar showed"
    assert "QR rebuilt on the cluster" in run.stdout and "tcp://127.0.0.1:" in run.stdout, \
        "the LocalCluster part's worker processes wrote their task spans into the same files"


@needs_chromium
def test_html_report_renders_in_a_real_headless_browser(recorded, tmp_path):
    page_path = tmp_path / "report.html"
    run = cli("report", str(recorded / "traces.jsonl"), str(recorded / "metrics.jsonl"), "--html", str(page_path))
    assert run.returncode == 0, run.stderr
    assert "cdn.bokeh.org" not in page_path.read_text(), "self-contained: no network needed"
    with browser.page() as page:
        page.goto(page_path.as_uri())
        painted = page.wait_for_function(f"() => ({browser.INKED_CANVASES})() >= 3", timeout=30_000)
        inked = page.evaluate(browser.INKED_CANVASES)
        text = page.evaluate(browser.LEAF_TEXT) + page.evaluate(browser.DRAWN_TEXT)
        problems = page.problems
    assert painted and inked >= 3, "the task stream and the reading plots drew"
    assert "Task stream" in text and "slow" in text
    assert problems == []


def _otlp_line(spans: list[dict]) -> str:
    return json.dumps({"resourceSpans": [{"resource": {"attributes": []}, "scopeSpans": [{"spans": spans}]}]})


def _hand_span(span_id: str, name: str, start_ms: int, end_ms: int, parent: str = "",
               attributes: dict | None = None) -> dict:
    def value(v: object) -> dict:
        if isinstance(v, list):
            return {"arrayValue": {"values": [value(x) for x in v]}}
        if isinstance(v, bool):
            return {"boolValue": v}
        if isinstance(v, float):
            return {"doubleValue": v}
        return {"intValue": str(v)} if isinstance(v, int) else {"stringValue": str(v)}

    return {"traceId": "ab" * 16, "spanId": span_id, "parentSpanId": parent, "name": name,
            "startTimeUnixNano": str(start_ms * 10**6), "endTimeUnixNano": str(end_ms * 10**6),
            "attributes": [{"key": k, "value": value(v)} for k, v in (attributes or {}).items()]}


def test_critical_path_on_a_hand_built_graph(tmp_path):
    # a(0-10) and b(0-30) feed c(35-50), which feeds d(55-60); e(0-5) stands alone.
    # c waited for b (it ended last), so the path is b -> c -> d: 50 ms on it, 10 ms of gaps.
    def task(span_id: str, key: str, start: int, end: int, deps: list[str], count: int | None = None) -> dict:
        return _hand_span(span_id, key, start, end, parent="00" * 8, attributes={
            "dask.task.key": key, "dask.task.prefix": key, "dask.task.dependencies": deps,
            "dask.task.dependency_count": count or len(deps)})

    spans = [_hand_span("00" * 8, "dask.compute", 0, 65, attributes={"dask.graph.tasks": 5}),
             task("01" * 8, "a", 0, 10, []), task("02" * 8, "b", 0, 30, []),
             task("03" * 8, "c", 35, 50, ["a", "b"]), task("04" * 8, "d", 55, 60, ["c"], count=40),
             task("05" * 8, "e", 0, 5, [])]
    path = tmp_path / "hand.jsonl"
    path.write_text(_otlp_line(spans) + "\n")
    (compute,) = group(TelemetryFile.open(path).spans()).computes
    found = critical_path(compute)
    assert [step.span.attributes["dask.task.key"] for step in found.steps] == ["b", "c", "d"]
    assert (found.on_path_ns, found.gaps_ns) == (50 * 10**6, 10 * 10**6)
    assert [step.truncated for step in found.steps] == [False, False, True]  # d listed 1 of 40
    run = cli("report", str(path))
    assert run.returncode == 0, run.stderr
    assert "3 tasks; on the path 50.0 ms (77% of wall), idle gaps 10.0 ms" in run.stdout
    assert "more dependencies than were recorded" in run.stdout


def test_the_report_counts_tasks_recovered_for_a_lost_worker(tmp_path):
    def task(span_id: str, key: str) -> dict:
        return _hand_span(span_id, "inc", 0, 10, parent="00" * 8,
                          attributes={"dask.task.key": key, "dask.task.prefix": "inc", "dask.worker.id": "tcp://a:1"})

    recovered = _hand_span("03" * 8, "inc", 0, 30, parent="00" * 8, attributes={
        "dask.task.prefix": "inc", "dask.task.count": 3, "dask.task.aggregate": True, "dask.task.recovered": True,
        "dask.task.duration.sum": 0.03, "dask.worker.id": "tcp://b:1"})
    spans = [_hand_span("00" * 8, "dask.compute", 0, 40, attributes={"dask.graph.tasks": 5}),
             task("01" * 8, "inc-1"), task("02" * 8, "inc-2"), recovered]
    path = tmp_path / "lost.jsonl"
    path.write_text(_otlp_line(spans) + "\n")
    run = cli("report", str(path))
    assert run.returncode == 0, run.stderr
    assert "1 computes, 5 tasks (2 with their own span)" in run.stdout
    assert "3 tasks ran on workers lost before their spans left them" in run.stdout
    (row,) = [line.split() for line in run.stdout.splitlines() if line.startswith("inc ")][:1]
    assert row[4] == "5", row  # "inc", "50.0 ms", "100.0", tasks: the prefix's count includes them


@pytest.mark.parametrize("attribute, value", [
    ("dask.task.count", {"stringValue": "many"}),
    ("dask.task.duration.sum", {"doubleValue": "NaN"}),
    ("dask.task.dependencies", {"intValue": "3"}),
])
def test_wrongly_typed_attributes_get_one_clear_line(tmp_path, attribute, value):
    span = _hand_span("01" * 8, "inc", 0, 10, parent="00" * 8, attributes={"dask.task.prefix": "inc"})
    span["attributes"].append({"key": attribute, "value": value})
    path = tmp_path / "typed.jsonl"
    path.write_text("\n" + _otlp_line([_hand_span("00" * 8, "dask.compute", 0, 20), span]) + "\n")
    run = cli("report", str(path))
    assert run.returncode == 2 and "Traceback" not in run.stderr
    (line,) = run.stderr.strip().splitlines()
    assert line.startswith(f"otel-graph: {path}:2: malformed data"), line  # the real line number


def test_run_behaves_like_python(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text("import sys\nprint('ARGV', sys.argv[1:], __file__)\nraise ValueError('from the script')\n")
    run = cli("run", str(script), "--flag", "x")
    assert run.returncode == 1
    assert f"ARGV ['--flag', 'x'] {script}" in run.stdout
    assert "ValueError: from the script" in run.stderr and "Traceback" in run.stderr
    script.write_text("import sys\nsys.exit('fatal: bad config')\n")
    run = cli("run", str(script))
    assert run.returncode == 1 and "fatal: bad config" in run.stderr


# -- fuzzing the reader and the analyses --------------------------------------------------------------
_KEYS = ("a", "b", "c", "d", "e")
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=8,
)


def _places(node: object) -> list[tuple[object, object]]:
    """Every (container, key or index) of a JSON document, to replace what is there."""
    found: list[tuple[object, object]] = []
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in items:
        found.append((node, key))
        found.extend(_places(child))
    return found


@st.composite
def _telemetry_lines(draw: st.DrawFn) -> str:
    """A compute of up to five tasks whose dependencies may form cycles, times that may run
    backwards, and then up to three values anywhere replaced by any JSON."""
    count = draw(st.integers(1, 5))
    tasks = [_hand_span(f"{i + 1:016x}", _KEYS[i], draw(st.integers(0, 100)), draw(st.integers(0, 100)),
                        parent="00" * 8, attributes={
                            "dask.task.key": _KEYS[i], "dask.task.prefix": _KEYS[i],
                            "dask.task.dependencies": draw(st.lists(st.sampled_from(_KEYS[:count]), max_size=3)),
                            "dask.task.dependency_count": draw(st.integers(0, 4))})
             for i in range(count)]
    document = json.loads(_otlp_line([_hand_span("00" * 8, "dask.compute", 0, 100,
                                                 attributes={"dask.graph.tasks": count}), *tasks]))
    for _ in range(draw(st.integers(0, 3))):
        container, key = draw(st.sampled_from(_places(document)))
        container[key] = draw(_json)  # type: ignore[index]
    return json.dumps(document)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(line=_telemetry_lines())
def test_any_telemetry_file_is_reported_or_refused_in_one_line(tmp_path, line):
    from otel_graph.cli import main

    path = tmp_path / "fuzz.jsonl"
    path.write_text(line + "\n")
    for args in (["report", str(path)], ["export", "--chrome", str(path), "-o", str(tmp_path / "out.json")]):
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            code = main(args)  # anything raised here fails the test
        said = err.getvalue().strip().splitlines()
        assert code == 0 or (code == 2 and len(said) == 1 and said[0].startswith("otel-graph: ")), (code, said)
