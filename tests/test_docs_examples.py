"""Every Python example in the README and the docs runs, as written.

Each ```python block of ``README.md`` and ``docs/*.md`` runs alone in a fresh interpreter,
with otel_graph from this checkout and its telemetry going to OTLP JSON files in a
temporary directory (``otlp_file``): a block must be complete in itself, as a reader
would copy it. One that computes with the providers otel_graph builds must leave its
``dask.compute`` span in the file.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import subprocess_env

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_blocks(path: Path) -> list[str]:
    return _BLOCK.findall(path.read_text(encoding="utf-8"))


EXAMPLES = [(page, index, code) for page in PAGES for index, code in enumerate(python_blocks(page))]


def test_the_examples_are_found() -> None:
    assert python_blocks(ROOT / "README.md")[0].startswith("import dask.array as da")
    assert {page.name for page, _, _ in EXAMPLES} >= {"README.md", "distributed.md"}


@pytest.mark.slow  # a QR decomposition, a LocalCluster
@pytest.mark.parametrize("page, index, code", EXAMPLES,
                         ids=[f"{page.name}-{index}" for page, index, _ in EXAMPLES])
def test_example_runs(page: Path, index: int, code: str, tmp_path: Path) -> None:
    env = subprocess_env(OTEL_TRACES_EXPORTER="otlp_file", OTEL_METRICS_EXPORTER="otlp_file",
                         OTEL_GRAPH_FILE_DIR=str(tmp_path), OTEL_GRAPH_RESOURCES="false")
    run = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=180)
    assert run.returncode == 0, f"{page.name} example {index} failed:\n{run.stderr[-3000:]}"
    if ".compute()" in code and "tracer_provider=" not in code:
        traces = (tmp_path / "traces.jsonl").read_text(encoding="utf-8")
        assert '"dask.compute"' in traces
