"""The HTML report as a person sees it, in headless Chromium.

The page of a real ``otel-graph demo`` run (local schedulers, a failure, a LocalCluster with
worker processes, on the embedded default) is opened and read through BokehJS, the way a
person reads it: legends beside the plots, never over a bar or a line, and not cut off;
every plot on one time axis; lanes and series named by worker, pid and thread number,
never by a thread ident or an instance hash; the critical path on a track of its own and
outlined in black; the table sortable by its numbers and written for people; no error in
the console.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import browser
from browser import needs_chromium
from conftest import needs_distributed, subprocess_env
from test_cli import cli

#: (title, frame [left, top, right, bottom], canvas [width, height], x range id, legends' boxes), per plot.
PLOTS = """() => {
    const plots = [];
    for (const view of Bokeh.index.query(() => true)) {
        // The trace browser's waterfall has no legend: its own test reads it.
        const browsing = (view.model.name || '').startsWith('trace-browser');
        if (view.model.constructor.__name__ !== 'Figure' || browsing) continue;
        const frame = view.frame.bbox;
        const legends = [...view.renderer_views.values()]
            .filter(v => v.model.constructor.__name__ === 'Legend')
            .map(v => [v.bbox.left, v.bbox.top, v.bbox.right, v.bbox.bottom]);
        plots.push([view.model.title.text, [frame.left, frame.top, frame.right, frame.bottom],
                    [view.bbox.width, view.bbox.height], view.model.x_range.id, legends]);
    }
    return plots;
}"""

#: The task stream's bars: (lane, outline colour, outline width) per bar.
BARS = """() => {
    for (const view of Bokeh.index.query(() => true)) {
        if (view.model.constructor.__name__ !== 'GlyphRenderer') continue;
        const data = view.model.data_source.data;
        if (!data.lane) continue;
        return [...data.lane].map((lane, i) => [lane, data.line[i], data.width[i]]);
    }
    return [];
}"""


@pytest.fixture(scope="module")
def demo_page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("demo") / "out"
    run = cli("demo", "--out", str(out), env=subprocess_env(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9"),
              cwd=out.parent)
    assert run.returncode == 0, run.stderr[-3000:]
    return out / "report.html"


@pytest.mark.slow  # the demo: a QR decomposition, then a LocalCluster
@needs_distributed
@needs_chromium
def test_the_report_reads_at_a_glance(demo_page: Path, tmp_path: Path) -> None:
    with browser.page(width=1400, height=1400) as page:
        page.goto(demo_page.as_uri())
        page.wait_for_function(f"() => ({browser.INKED_CANVASES})() >= 3", timeout=60_000)
        plots = page.evaluate(PLOTS)
        bars = page.evaluate(BARS)
        text = page.evaluate(browser.LEAF_TEXT) + "\n" + page.evaluate(browser.DRAWN_TEXT)
        page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
        first_before = page.evaluate(TABLE_FIRST_PREFIX)
        page.get_by_text("tasks", exact=True).first.click()  # sort by the task count, ascending
        first_after = page.evaluate(TABLE_FIRST_PREFIX)
        page.wait_for_timeout(600)
        page.get_by_text("time in tasks", exact=True).first.click()  # ascending: µs before ms before s
        by_time = page.evaluate(TABLE_COLUMN, 1)
        problems = page.problems

    titles = [title for title, *_ in plots]
    assert titles[0].startswith("Task stream") and "CPU" in titles and "Memory (resident)" in titles
    for title, (_, _, right, _), (width, height), _, legends in plots:
        assert legends, f"{title}: has a legend"
        for l_left, _, l_right, l_bottom in legends:
            assert l_left >= right - 1, f"{title}: the legend overlaps the plotted area"
            assert l_bottom <= height and l_right <= width, f"{title}: the legend is cut off"
    assert len({x_range for *_, x_range, _ in plots}) == 1, "zoom one plot, all follow"

    assert not re.search(r"\b\d{12,}\b", text), "a raw thread ident is shown"
    assert not re.search(r"\b[0-9a-f]{8}\b", text), "an instance hash is shown"
    assert re.search(r"worker \d+ \(127\.0\.0\.1:\d+\) · thread 0", text) and re.search(r"pid \d+ · thread 0", text)

    critical = [(width, line) for lane, line, width in bars if lane == "critical path (longest compute)"]
    assert critical and all(line == "#000000" and width >= 2 for width, line in critical)
    outlined = [lane for lane, line, width in bars if line == "#000000" and lane != "critical path (longest compute)"]
    assert len(outlined) == len(critical), "the path is outlined in its own lanes too"

    assert re.search(r"\d+(\.\d)? (ms|µs|s)\b", text) and re.search(r"\d+\.\d (kB|MB)\b", text)
    assert first_before != first_after, "the table sorted on a click of its header"
    times = [_seconds(cell) for cell in by_time]
    assert len(times) > 3 and times == sorted(times), f"'time in tasks' sorts as times, not text: {by_time}"
    assert problems == []


#: The cells of one column of the bottleneck table, top to bottom, as shown.
TABLE_COLUMN = """(column) => {
    const rows = [];
    const walk = (root) => root.querySelectorAll('*').forEach(el => {
        if (el.shadowRoot) walk(el.shadowRoot);
        if (el.classList && el.classList.contains('slick-row')) rows.push(el);
    });
    walk(document);
    rows.sort((a, b) => parseFloat(a.style.top) - parseFloat(b.style.top));
    return rows.map(row => row.querySelectorAll('.slick-cell')[column].textContent.trim());
}"""


def _seconds(text: str) -> float:
    number, unit = text.split()
    return float(number) * {"s": 1, "ms": 1e-3, "µs": 1e-6}[unit]


#: The prefix in the bottleneck table's first row, as shown.
TABLE_FIRST_PREFIX = """() => {
    const cell = document.querySelector('.slick-row .slick-cell');
    if (cell) return cell.textContent;
    let found = null;
    const walk = (root) => root.querySelectorAll('*').forEach(el => {
        if (el.shadowRoot) walk(el.shadowRoot);
        if (!found && el.classList && el.classList.contains('slick-cell')) found = el.textContent;
    });
    walk(document);
    return found;
}"""
