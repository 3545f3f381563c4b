"""Sphinx configuration of the otel-graph docs site (``make docs``).

Pages are Markdown (MyST). Reference pages are generated from the code that defines what
they list (``_ext/otel_graph_docs.py``), so they cannot drift from it. Warnings are errors
(``make docs`` passes ``-W``): a broken reference or page fails ``make test``.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))

from otel_graph import __version__  # noqa: E402

project = "otel-graph"
author = "the otel-graph developers"
release = version = __version__

extensions = ["myst_parser", "sphinxcontrib.mermaid", "otel_graph_docs"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
# ```mermaid fences render as diagrams, as they do on GitHub.
myst_fence_as_directive = ["mermaid"]
# The version the pages load from the CDN; the Makefile's MERMAID_VERSION, which the docs
# test renders the diagrams with, must match it (tests/test_docs_site.py checks).
mermaid_version = "11.12.1"
myst_heading_anchors = 3
html_theme = "alabaster"
html_title = "otel-graph"
