"""Take the README's picture: the HTML report of ``otel-graph demo``, in headless Chromium.

``make screenshot`` runs it (``python tests/screenshot.py docs/images/report.png``): the demo
runs on the embedded default (no collector: an endpoint nothing listens on), and the top of
the report it writes is saved as a PNG, as :mod:`browser` renders it for the tests.
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
    with tempfile.TemporaryDirectory() as scratch:
        files = Path(scratch) / "out"
        env = subprocess_env(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9")  # discard: nothing answers
        subprocess.run([sys.executable, "-m", "otel_graph.cli", "demo", "--out", str(files)], env=env, cwd=scratch,
                       check=True, stdout=subprocess.DEVNULL, timeout=600)
        with browser.page(width=WIDTH, height=HEIGHT) as page:
            page.goto((files / "report.html").as_uri())
            page.wait_for_function(f"() => ({browser.INKED_CANVASES})() >= 3", timeout=60_000)
            out.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(out), clip={"x": 0, "y": 0, "width": WIDTH, "height": HEIGHT})
            if page.problems:
                raise SystemExit(f"the report logged errors: {page.problems}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/images/report.png"))
