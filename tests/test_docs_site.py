"""The docs site as a reader's browser shows it.

The site is built as ``make docs`` builds it and opened in a real headless Chromium
(:mod:`browser`). Its diagrams are drawn in the reader's browser by Mermaid, which the
pages load from a CDN; the test serves that same version from the copy ``make test``
unpacks (``.tools/node/mermaid``), so it runs offline and fails where a diagram does not
draw. The generated reference pages are checked to hold the catalogues' rows.
"""

from __future__ import annotations

import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

import browser
from browser import needs_chromium
from otel_graph.config import CHOICES, OWN_VARIABLES, STANDARD_VARIABLES
from otel_graph.conventions import ATTRIBUTES, EVENTS, METRICS, RESOURCE, SPANS

ROOT = Path(__file__).resolve().parent.parent
MERMAID = ROOT / ".tools" / "node" / "mermaid" / "dist"
CDN = re.compile(r"https://cdn\.jsdelivr\.net/npm/mermaid@([0-9.]+)/dist/(.+)")
needs_mermaid = pytest.mark.skipif(not MERMAID.is_dir() and os.environ.get("CI") != "true",
                                   reason="make test unpacks Mermaid into .tools/node/mermaid")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    build = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
                            str(ROOT / "docs"), str(out)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-3000:]
    return out


def _makefile_mermaid() -> str:
    (version,) = re.findall(r"^MERMAID_VERSION := (\S+)$", (ROOT / "Makefile").read_text(), re.M)
    return version


def test_the_pages_load_the_mermaid_the_tests_draw_with(site: Path) -> None:
    loaded = {match.group(1) for match in CDN.finditer((site / "design.html").read_text(encoding="utf-8"))}
    assert loaded == {_makefile_mermaid()}


def test_the_readme_shows_the_report() -> None:
    (picture,) = re.findall(r"!\[[^\]]+\]\(([^)]+\.png)\)", (ROOT / "README.md").read_text(encoding="utf-8"))
    data = (ROOT / picture).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk, first after the signature
    assert width >= 1000 and height >= 600, "a readable screenshot (make screenshot)"


def test_the_changelog_keeps_a_changelog() -> None:
    """Keep a Changelog 1.1.0: releases newest first, each with its date, under the usual headings."""
    from otel_graph import __version__

    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert text.startswith("# Changelog\n") and "keepachangelog.com/en/1.1.0" in text
    releases = re.findall(r"^## (.+)$", text, re.M)
    assert releases and releases[0] == "[Unreleased]"
    dated = [re.fullmatch(r"\[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})", r) for r in releases[1:]]
    assert all(dated), releases
    assert __version__ in text.split("\n## ")[1] or __version__ == dated[0].group(1)  # the current version's entry
    assert set(re.findall(r"^### (.+)$", text, re.M)) <= {"Added", "Changed", "Deprecated", "Removed", "Fixed",
                                                           "Security"}


def test_the_reference_pages_hold_every_catalogued_name(site: Path) -> None:
    kinds = re.findall(r"^```\{otel-graph-span\} (\S+)$", (ROOT / "docs" / "telemetry.md").read_text(), re.M)
    assert sorted(kinds) == sorted(SPANS), "every kind of span has its section"
    telemetry = (site / "telemetry.html").read_text(encoding="utf-8")
    configuration = (site / "configuration.html").read_text(encoding="utf-8")
    for name in (*ATTRIBUTES, *METRICS, *EVENTS, *RESOURCE):
        assert f"<code class=\"docutils literal notranslate\"><span class=\"pre\">{name}</span></code>" \
            in telemetry, name
    for variable in (*OWN_VARIABLES, *STANDARD_VARIABLES, *CHOICES):
        assert f"<span class=\"pre\">{variable}</span>" in configuration, variable


#: Pages for users: what the software does and how to use it, not how it was made.
USER_PAGES = [ROOT / "README.md", *(page for page in sorted((ROOT / "docs").glob("*.md"))
                                    if page.name not in ("design.md", "development.md"))]


def test_the_readme_is_short_and_the_user_pages_carry_no_history() -> None:
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 250
    history = re.compile(r"\b20\d\d-\d\d-\d\d\b|\b[0-9a-f]{7,40}\b(?<=[a-f]\w{6})|\bsessions?\b|\bissue \d+|"
                         r"\buntil now\b|\bbefore this change\b", re.I)
    found = [(page.name, match.group()) for page in USER_PAGES
             for match in history.finditer(page.read_text(encoding="utf-8"))]
    assert found == []


@needs_chromium
@needs_mermaid
def test_every_diagram_draws_in_a_browser(site: Path) -> None:
    pages = sorted(path for path in site.glob("*.html") if 'class="mermaid"' in path.read_text(encoding="utf-8"))
    assert pages, "the design page has diagrams"
    served: list[tuple[str, str]] = []

    def from_the_unpacked_copy(route) -> None:
        version, rest = CDN.fullmatch(route.request.url).groups()
        served.append((version, rest))  # checked after the page: a failure here would only stall it
        route.fulfill(path=str(MERMAID / rest), content_type="text/javascript")

    # Tall enough that every diagram is on screen: off-screen ones are drawn when scrolled to.
    with browser.page(width=1400, height=20_000) as page:
        page.route(CDN, from_the_unpacked_copy)
        for path in pages:
            page.goto(path.as_uri())
            # Drawn: processed by Mermaid, with a flowchart laid out (a syntax error draws an error
            # diagram instead, of another role).
            page.wait_for_function("""() => {
                const diagrams = [...document.querySelectorAll('pre.mermaid')];
                return diagrams.length > 0 && diagrams.every(d => d.hasAttribute('data-mermaid-render-failed')
                    || (d.querySelector('svg') || {getAttribute: () => null}).getAttribute('aria-roledescription'));
            }""", timeout=30_000)
            drawn = page.evaluate("""() => [...document.querySelectorAll('pre.mermaid')].map(d => {
                const svg = d.querySelector('svg');
                const box = svg && svg.viewBox.baseVal;
                return svg ? [svg.getAttribute('aria-roledescription'), box.width * box.height] : null;
            })""")
            assert drawn and all(each and each[0].startswith("flowchart") and each[1] > 0 for each in drawn), \
                (path.name, drawn)
        problems = page.problems
    assert ("" if not served else served[0][0], "mermaid.esm.min.mjs") == (_makefile_mermaid(), served[0][1])
    assert {version for version, _ in served} == {_makefile_mermaid()}
    assert problems == []
