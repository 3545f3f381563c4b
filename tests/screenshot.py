"""Take the docs' pictures of the HTML report of ``otel-graph demo``, in headless Chromium.

``make screenshot`` runs it (``python tests/screenshot.py docs/images``): the demo runs on the
embedded default (no collector: an endpoint nothing listens on), and its report is opened as
:mod:`browser` opens it for the tests. Two pictures:

* ``report.png``: the top of the page (task stream, readings);
* ``trace-browser.png``: the trace browser on the demo's failing compute, its failed task
  clicked, as a person would.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import browser
from conftest import subprocess_env

WIDTH, HEIGHT = 1400, 1100


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        files = Path(scratch) / "out"
        env = subprocess_env(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9")  # discard: nothing answers
        subprocess.run([sys.executable, "-m", "otel_graph.cli", "demo", "--out", str(files)], env=env, cwd=scratch,
                       check=True, stdout=subprocess.DEVNULL, timeout=600)
        with browser.page(width=WIDTH, height=HEIGHT) as page:
            page.goto((files / "report.html").as_uri())
            page.wait_for_function(f"() => ({browser.INKED_CANVASES})() >= 3", timeout=60_000)
            page.screenshot(path=str(out / "report.png"), clip={"x": 0, "y": 0, "width": WIDTH, "height": HEIGHT})
            browser.choose_compute(page, "failed")
            browser.click_span(page, status="ERROR", what="task")
            page.wait_for_function(f"() => ({browser.MODEL_TEXT})('trace-browser-details').includes('Error')")
            page.mouse.move(0, 0)  # no hover tooltip in the picture
            section = page.evaluate("""() => {
                const view = Bokeh.index.find_one(Bokeh.documents[0].get_model_by_name('trace-browser-title'));
                const box = view.el.getBoundingClientRect();
                return box.top + window.scrollY;
            }""")
            page.screenshot(path=str(out / "trace-browser.png"), full_page=True,
                            clip={"x": 0, "y": section, "width": WIDTH, "height": HEIGHT})
            if page.problems:
                raise SystemExit(f"the report logged errors: {page.problems}")
    print(f"wrote {out / 'report.png'} and {out / 'trace-browser.png'}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/images"))
