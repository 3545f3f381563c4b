"""The README's install line works as written, in a fresh virtual environment.

The Quickstart's ``pip install`` line is read from ``README.md`` and run as it stands, in a
copy of this checkout, into a new venv (from the package index, as a new user's would be);
the Quickstart's own example then runs there, exporting to a real OTLP receiver.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import venv
from pathlib import Path

import pytest

from otlp_receiver import OtlpReceiver
from test_docs_examples import python_blocks

ROOT = Path(__file__).resolve().parent.parent


def readme_install() -> list[str]:
    """The arguments of the Quickstart's ``pip install`` line."""
    quickstart = (ROOT / "README.md").read_text().split("## Quickstart", 1)[1]
    line = re.search(r"^pip install (.+)$", quickstart, re.MULTILINE)
    assert line is not None, "the Quickstart has no pip install line"
    return shlex.split(line.group(1))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_readme_install_line_installs_a_working_otel_graph(tmp_path: Path) -> None:
    if shutil.which("git") is None:
        pytest.skip("git is needed to copy the checkout")
    checkout = tmp_path / "otel-graph"
    # The files a checkout holds (tracked ones, as they are now), not this tree's venvs and caches.
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        if (ROOT / name).is_file():
            (checkout / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, checkout / name)
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PYTHON", "VIRTUAL_ENV"))}
    install = subprocess.run([str(python), "-m", "pip", "install", "-q", *readme_install()], cwd=checkout, env=env,
                             capture_output=True, text=True, timeout=840)
    unreachable = ("Failed to establish a new connection", "Temporary failure in name resolution")
    if install.returncode != 0 and any(words in install.stderr for words in unreachable):
        pytest.skip(f"no package index can be reached here: {install.stderr[-500:]}")
    assert install.returncode == 0, install.stderr[-3000:]
    example = python_blocks(ROOT / "README.md")[0]
    with OtlpReceiver() as receiver:
        run = subprocess.run([str(python), "-c", example], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                             env={**env, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.grpc_endpoint,
                                  "OTEL_GRAPH_RESOURCES": "false"})
        assert run.returncode == 0, run.stderr[-3000:]
        assert receiver.wait_for(lambda r: any(s["name"] == "dask.compute" for s in r.spans()), timeout_s=30)
