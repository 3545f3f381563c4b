"""A page in a real headless Chromium (Debian's ``chromium``, driven by Playwright).

Shared by the tests that render what otel-graph writes for people to look at (the HTML
report, the docs site) and by ``tests/screenshot.py``, which takes the README's picture.
:func:`page` collects every console error and uncaught exception of the page in
``page.problems``; :data:`INKED_CANVASES` counts the canvases, shadow roots included, that
have drawn anything (Bokeh's plots draw into such canvases once its JavaScript has run).
"""

from __future__ import annotations

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
