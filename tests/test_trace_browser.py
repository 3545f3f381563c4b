"""The HTML report's trace browser: real instrumented runs, read back, drawn in a real headless Chromium.

Three runs of the test apps write OTLP JSON files: a compute whose task fails, a compute past
a span budget of 4 (so an aggregate span stands for the rest), and tasks starting spans of
their own with a compute nested in one. The page is the command's (``otel-graph report
--html``) when it holds the trace browser, else the browser's layout alone
(:func:`otel_graph.report.waterfall.trace_browser`) in a page of its own. A person's view is
checked: the waterfall draws, a click on the failed task's bar shows its exception, the
Select switches computes, the aggregate says how many tasks it stands for, no console error.
A compute of 100,000 task spans, built in memory, checks the caps and the page's size.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import browser
import subprocesses
from browser import needs_chromium
from otel_graph.report import otlp_read
from otel_graph.report.analysis import Compute, group
from otel_graph.report.otlp_read import Span, TelemetryFile
from otel_graph.report.text import Loaded, load
from otel_graph.report.trace_rows import MAX_ROWS, waterfall
from otel_graph.report.waterfall import trace_browser
from test_cli import _hand_span, _otlp_line, cli, file_env

COLOURS = {"inc": "#1f77b4", "boom": "#ff7f0e", "work": "#2ca02c", "nested": "#9467bd"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """traces.jsonl of each run: ``failing`` (boom raises), ``budget`` (20 tasks, 4 spans), ``user`` (own spans)."""
    out = {}
    for name, app, args, extra in (
        ("failing", "compute.py", ["--scheduler", "threads", "--tasks", "5", "--fail", "--flush"], {}),
        ("budget", "compute.py", ["--scheduler", "threads", "--tasks", "20", "--flush"],
         {"OTEL_GRAPH_MAX_TASK_SPANS": "4"}),
        ("user", "user_spans.py", ["--scheduler", "threads"], {}),
    ):
        directory = tmp_path_factory.mktemp(name)
        run = subprocesses.run_app(app, *args, env=file_env(directory, OTEL_GRAPH_RESOURCES="false", **extra))
        assert "FLUSHED True" in run.stdout, run.stdout + run.stderr[-3000:]
        out[name] = directory / "traces.jsonl"
    return out


def _page(paths: list[Path], target: Path) -> str:
    """The report's page for ``paths``, as the command writes it."""
    run = cli("report", *map(str, paths), "--html", str(target))
    assert run.returncode == 0, run.stderr
    page = target.read_text(encoding="utf-8")
    assert "trace-browser-select" in page, "the report's page holds the trace browser"
    return page


@needs_chromium
def test_a_person_browses_the_traces_of_real_runs(runs, tmp_path):
    paths = [runs["failing"], runs["budget"], runs["user"]]
    computes = group(s for p in paths for s in TelemetryFile.open(p).spans()).computes
    (budget,) = [c for c in computes if c.task_count == 20]
    aggregated = sum(int(s.attributes["dask.task.count"]) for s in budget.tasks if "dask.task.count" in s.attributes)
    assert aggregated >= 10, "the budget of 4 spans left most of the 20 tasks to an aggregate span"
    _page(paths, tmp_path / "report.html")
    with browser.page() as page:
        page.goto((tmp_path / "report.html").as_uri())
        page.wait_for_function("() => window.Bokeh && Bokeh.documents.length && "
                               "Bokeh.documents[0].get_model_by_name('trace-browser-waterfall')", timeout=30_000)
        assert page.wait_for_function(f"() => ({browser.INKED_CANVASES})() >= 1", timeout=30_000)
        assert "Trace browser" in page.evaluate(browser.LEAF_TEXT)

        failing = browser.choose_compute(page, "failed")
        labels = page.evaluate(browser.ROW_LABELS)
        assert labels[0] == "dask.compute" and any("('boom', 0)" in label for label in labels), labels
        browser.click_span(page, what="task", status="ERROR")
        page.wait_for_function(f"() => ({browser.MODEL_TEXT})('trace-browser-details').includes('RuntimeError')")
        shown = page.evaluate(browser.SHOWN_TEXT, "trace-browser-details")
        assert "RuntimeError: task failed on purpose at 1" in shown and "in boom" in shown, shown[-2000:]
        assert "dask.task.key" in shown and "('boom', 0)" in shown, "the attributes table"
        assert re.search(r"Ran on pid \d+ · thread \d+\.", shown), "the lane's name, as the task stream says it"

        browser.choose_compute(page, "· 20 tasks")
        assert page.evaluate(browser.ROW_LABELS) != labels, "the rows are the other compute's"
        said = page.evaluate(browser.SHOWN_TEXT, "trace-browser-summary")
        assert f"{aggregated} of its 20 tasks have no span of their own" in said, said
        assert not any("boom" in label for label in page.evaluate(browser.ROW_LABELS))
        browser.click_span(page, what="aggregate")
        page.wait_for_function(f"() => ({browser.MODEL_TEXT})('trace-browser-details').includes('Stands for')")
        said = page.evaluate(browser.SHOWN_TEXT, "trace-browser-details")
        assert f"Stands for {aggregated} inc tasks past the span budget" in said, said
        rows = page.evaluate(browser.ROW_LABELS)
        assert f"· inc ×{aggregated} tasks (aggregate)" in rows, rows

        browser.choose_compute(page, "#1 ")  # back to the first: the failing compute's rows come back
        assert "failed" in failing and page.evaluate(browser.ROW_LABELS) == labels
        problems = page.problems
    assert problems == []


def test_the_waterfall_holds_every_span_under_the_compute(runs):
    loaded = load([runs["user"]], progress=False)
    outer = max(loaded.computes, key=lambda c: c.task_count)
    rows = waterfall(outer, loaded.traces[outer.root.trace_id], colour_of=COLOURS)
    labels = rows.columns["label"]
    assert labels[0] == "dask.compute" and rows.shown == rows.total
    assert labels.count("· · user.step") == 20 and labels.count("· · · user.inner") == 20, labels
    assert "· · dask.compute" in labels, "the compute nested in a task, under it"
    assert labels.count("· · · · user.step") == 1, "and the span of that compute's task"
    assert labels.index("· · user.step") == labels.index("· · · user.inner") - 1, "depth first"
    assert not any("user.outside" in label for label in labels), "a span outside any compute is not under it"
    # The analyses still see tasks only: neither users' spans nor the nested compute count as the outer's tasks.
    assert outer.tasks and all("dask.task.prefix" in s.attributes and s.name != "dask.compute" for s in outer.tasks)
    assert outer.task_count == 21


def test_a_failed_span_keeps_its_exception_and_a_healthy_one_nothing_more(runs):
    spans = list(TelemetryFile.open(runs["failing"]).spans())
    (boom,) = [s for s in spans if s.name == "boom"]
    assert boom.failed and boom.exception is not None
    kind, message, stack = boom.exception
    assert (kind, message) == ("RuntimeError", "task failed on purpose at 1")
    assert "in boom" in stack and boom.status_message
    assert all(s.exception is None for s in spans if not s.failed)
    assert all("code.function.name" in s.attributes for s in spans if s.name == "inc")


def test_exception_text_is_bounded_per_file(tmp_path, monkeypatch):
    def failed(i: int) -> dict:
        span = _hand_span(f"{i + 1:016x}", "t", 0, 10, parent="00" * 8, attributes={"dask.task.prefix": "t"})
        span["status"] = {"code": 2, "message": f"ValueError: {i}"}
        span["events"] = [{"name": "exception", "attributes": [
            {"key": "exception.type", "value": {"stringValue": "ValueError"}},
            {"key": "exception.message", "value": {"stringValue": f"{i} " + "m" * 5000}},
            {"key": "exception.stacktrace", "value": {"stringValue": "s" * 30_000 + f" end {i}"}}]}]
        return span

    broken = failed(9)
    broken["events"] = [{"name": "exception", "attributes": [{"no key": 1}]}, "not an event"]
    path = tmp_path / "storm.jsonl"
    path.write_text(_otlp_line([_hand_span("00" * 8, "dask.compute", 0, 20), *map(failed, range(6)), broken]) + "\n")
    monkeypatch.setattr(otlp_read, "EXCEPTION_CHARS", 40_000)
    spans = {s.span_id: s for s in TelemetryFile.open(path).spans()}
    first = spans[f"{1:016x}"].exception
    assert first is not None and len(first[1]) == 4096 and len(first[2]) == 16384 and first[2].endswith(" end 0")
    last = spans[f"{6:016x}"].exception
    assert last is not None and len(last[1]) == 200 and last[2].endswith(" end 5"), "past the budget: cut short"
    assert spans[f"{10:016x}"].exception is None and spans[f"{10:016x}"].failed, "an unreadable event is left out"


def _big_compute(tasks: int) -> tuple[Compute, list[Span]]:
    """One compute of ``tasks`` task spans, one of them failed, as the reader makes them."""
    root = Span("ab" * 16, "root", "", "dask.compute", 0, tasks * 10**6, {"dask.scheduler": "threads"}, 0, {})
    spans = [root]
    for i in range(tasks):
        attributes = {"dask.task.key": f"('load-9a8b', {i})", "dask.task.prefix": "load", "dask.worker.id": "w1",
                      "dask.task.dependencies": [], "dask.task.dependency_count": 0, "code.function.name": "load"}
        spans.append(Span("ab" * 16, f"{i:016x}", "root", "load", i * 10**6, i * 10**6 + 500_000 + i % 977, attributes,
                          2 if i == 5_000 else 0, {"host.name": "h"}, "", ("OSError", "disk full", "") if i == 5_000
                          else None))
    return Compute(root, spans[1:]), spans


def test_a_100k_task_compute_is_drawn_within_the_row_cap_and_a_small_page(tmp_path):
    import bokeh.embed
    import bokeh.resources

    compute, spans = _big_compute(100_000)
    rows = waterfall(compute, spans, colour_of={"load": "#1f77b4"})
    assert rows.shown == MAX_ROWS == len(rows.columns["row"]) and rows.total == 100_001
    assert rows.columns["label"][0] == "dask.compute"
    assert "· ('load-9a8b', 5000)" in rows.columns["label"], "the failed task is kept"
    assert rows.columns["exc_message"][rows.columns["label"].index("· ('load-9a8b', 5000)")] == "disk full"
    assert "· ('load-9a8b', 99999)" in rows.columns["label"], "the critical path: the task that ended last"
    assert "· ('load-9a8b', 976)" in rows.columns["label"], "the longest task"
    assert "· ('load-9a8b', 977)" not in rows.columns["label"], "one of the shortest"
    layout = trace_browser(Loaded([compute], [], traces={compute.root.trace_id: spans}), colour_of={"load": "#1f77b4"})
    summary = layout.select_one({"name": "trace-browser-summary"}).text
    assert "2,000 of 100,001 spans shown" in summary
    page = tmp_path / "big.html"
    page.write_text(bokeh.embed.file_html(layout, resources=bokeh.resources.INLINE, title="big"), encoding="utf-8")
    size = page.stat().st_size
    print(f"100k-task compute: page of {size / 1e6:.2f} MB")
    assert size < 5e6, size


def test_the_computes_listed_are_capped_longest_and_failed_first():
    root = Span("t", "r0", "", "dask.compute", 0, 10, {}, 0, {})
    computes = [Compute(root._replace(trace_id=f"t{i}", span_id=f"r{i}", end_ns=10 + i, status_code=2 * (i == 0)))
                for i in range(6)]
    layout = trace_browser(Loaded(computes, []), colour_of={}, max_computes=2)
    options = layout.select_one({"name": "trace-browser-select"}).options
    assert [re.match(r"#(\d+) ", label).group(1) for _, label in options] == ["1", "5", "6"]
    assert "Listed: 3 of the 6 computes" in layout.select_one({"name": "trace-browser-title"}).text


@needs_chromium
def test_hostile_text_shows_as_text(tmp_path):
    hostile = "<img src=x onerror=window.pwned=1>"
    # The prefix too: the bottleneck table shows it through an HTML template.
    task = _hand_span("01" * 8, "x", 0, 10, parent="00" * 8, attributes={
        "dask.task.prefix": f"x{hostile}", "dask.task.key": f"x-{hostile}", "dask.worker.name": hostile,
        hostile: hostile})
    task["status"] = {"code": 2, "message": hostile}
    task["events"] = [{"name": "exception", "attributes": [
        {"key": "exception.type", "value": {"stringValue": "<b>Bold</b>"}},
        {"key": "exception.message", "value": {"stringValue": hostile}},
        {"key": "exception.stacktrace", "value": {"stringValue": "</pre><script>window.pwned=2</script>"}}]}]
    path = tmp_path / "hostile.jsonl"
    path.write_text(_otlp_line([_hand_span("00" * 8, "dask.compute", 0, 20), task]) + "\n")
    _page([path], tmp_path / "hostile.html")
    with browser.page() as page:
        page.goto((tmp_path / "hostile.html").as_uri())
        page.wait_for_function("() => window.Bokeh && Bokeh.documents.length && "
                               "Bokeh.documents[0].get_model_by_name('trace-browser-waterfall')", timeout=30_000)
        page.wait_for_function(f"() => ({browser.INKED_CANVASES})() >= 1", timeout=30_000)
        browser.click_span(page, status="ERROR", what="task")
        page.wait_for_function(f"() => ({browser.MODEL_TEXT})('trace-browser-details').includes('Bold')")
        shown = page.evaluate(browser.SHOWN_TEXT, "trace-browser-details")
        page.wait_for_timeout(500)  # an injected <img>'s onerror would have fired by now
        pwned = page.evaluate("() => window.pwned ?? null")
        injected = page.evaluate("""() => {
            let found = 0;
            const walk = (root) => root.querySelectorAll('*').forEach(el => {
                if (el.shadowRoot) walk(el.shadowRoot);
                if (['IMG', 'SCRIPT'].includes(el.tagName) && !el.closest('head')) found += el.tagName === 'IMG';
            });
            walk(document);
            return found;
        }""")
        table = page.evaluate(browser.LEAF_TEXT)
        problems = page.problems
    assert shown.count(hostile) >= 3 and "<b>Bold</b>" in shown and "<script>window.pwned=2</script>" in shown
    assert pwned is None and injected == 0 and problems == []
    assert f"x{hostile}" in table, "the table shows the hostile prefix as text"
