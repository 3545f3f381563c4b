"""A page in a real headless Chromium (Debian's ``chromium``, driven by Playwright).

Shared by the tests that render what otel-graph writes for people to look at (the HTML
report, the docs site) and by ``tests/screenshot.py``, which takes the README's picture.
:func:`page` collects every console error and uncaught exception of the page in
``page.problems``; :data:`INKED_CANVASES` counts the canvases, shadow roots included, that
have drawn anything (Bokeh's plots draw into such canvases once its JavaScript has run).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
#: Skips a test where Debian's chromium is missing, except in CI (``make test`` installs it as root).
needs_chromium = pytest.mark.skipif(not os.path.exists(CHROMIUM) and os.environ.get("CI") != "true",
                                    reason="Debian chromium is installed by `make test` (as root)")

INKED_CANVASES = """() => {
    const canvases = [];
    const walk = (root) => root.querySelectorAll('*').forEach(el => {
        if (el.tagName === 'CANVAS') canvases.push(el);
        if (el.shadowRoot) walk(el.shadowRoot);
    });
    walk(document);
    return canvases.filter(c => {
        if (!c.width || !c.height) return false;
        const data = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        for (let i = 3; i < data.length; i += 4) if (data[i] !== 0) return true;
        return false;
    }).length;
}"""

#: The text of every leaf element a person could read, shadow roots included (no styles or scripts).
LEAF_TEXT = """() => {
    let out = '';
    const walk = (root) => root.querySelectorAll('*').forEach(el => {
        if (el.shadowRoot) walk(el.shadowRoot);
        if (!el.children.length && !['STYLE', 'SCRIPT'].includes(el.tagName)) out += ' ' + (el.textContent || '');
    });
    walk(document);
    return out;
}"""


#: What the plots draw as text on their canvases: lane names, legend labels, titles and axis labels.
DRAWN_TEXT = """() => {
    const out = [];
    for (const view of Bokeh.index.query(() => true)) {
        const model = view.model;
        const name = model.constructor.__name__;
        if (name === 'Figure') {
            out.push(model.title.text, ...(model.y_range.factors || []));
            for (const axis of [...model.below, ...model.left]) out.push(axis.axis_label || '');
        } else if (name === 'Legend') {
            for (const item of model.items) out.push(item.label.value || '');
        }
    }
    return out.join('\\n');
}"""


# The trace browser (otel_graph.report.waterfall), found by its models' names.
# The page position of the first row whose data match, and its index; the plot scrolled into view.
SPAN_BAR = """(pick) => {
    const doc = Bokeh.documents[0];
    const plot = doc.get_model_by_name("trace-browser-waterfall");
    const d = doc.get_model_by_name("trace-browser-spans").data;
    let i = 0;
    while (i < d.row.length && !Object.entries(pick).every(([k, v]) => String(d[k][i]).includes(v))) i++;
    if (i === d.row.length) return null;
    const view = Bokeh.index.find_one(plot);
    view.el.scrollIntoView({block: "center"});
    const box = view.canvas_view.el.getBoundingClientRect();
    return {i, x: box.left + view.frame.x_scale.compute((d.left[i] + d.right[i]) / 2),
            y: box.top + view.frame.y_scale.compute(d.row[i])};
}"""
MODEL_TEXT = "(name) => { const m = Bokeh.documents[0].get_model_by_name(name); return m.text ?? m.value; }"
# What a person reads in a Div: its rendered text (Bokeh draws a Div in a shadow root, with its styles).
SHOWN_TEXT = """(name) => {
    const view = Bokeh.index.find_one(Bokeh.documents[0].get_model_by_name(name));
    const root = view.el.shadowRoot ?? view.el;
    return Array.from(root.children).filter((e) => e.tagName !== "STYLE" && e.tagName !== "LINK")
        .map((e) => e.innerText).join(" ");
}"""
ROW_LABELS = "() => Array.from(Bokeh.documents[0].get_model_by_name('trace-browser-spans').data.label)"
COMPUTE_OPTIONS = "() => Bokeh.documents[0].get_model_by_name('trace-browser-select').options"


def click_span(page: Any, **pick: str) -> None:
    """Click the bar of the first row whose data hold ``pick``'s values; it must be the row selected."""
    page.wait_for_timeout(600)  # at a person's pace: two clicks closer in time are a double click to Bokeh
    bar = page.evaluate(SPAN_BAR, pick)  # measured after the wait: a re-laid-out page has settled
    assert bar is not None, f"no row with {pick}: {page.evaluate(ROW_LABELS)}"
    page.mouse.click(bar["x"], bar["y"])
    selected = "() => Bokeh.documents[0].get_model_by_name('trace-browser-spans').selected.indices"
    page.wait_for_function(f"() => ({selected})()[0] === {bar['i']}", timeout=10_000)


def choose_compute(page, text: str) -> str:
    """Choose the compute whose Select option holds ``text`` in the page's <select>; its option's label."""
    (label,) = [label for _, label in page.evaluate(COMPUTE_OPTIONS) if text in label]
    page.locator("select").filter(has_text=label).select_option(label=label)
    number = json.dumps(label.split(" · ")[0])
    page.wait_for_function(f"() => ({MODEL_TEXT})('trace-browser-summary').includes({number})")
    return label


@contextmanager
def page(*, width: int = 1400, height: int = 1000) -> Iterator[Any]:
    """A fresh page of a headless Chromium; its console errors gather in ``page.problems``."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            opened = browser.new_page(viewport={"width": width, "height": height})
            problems: list[str] = []
            opened.on("console", lambda message: problems.append(message.text) if message.type == "error" else None)
            opened.on("pageerror", lambda error: problems.append(str(error)))
            opened.problems = problems
            yield opened
        finally:
            browser.close()
