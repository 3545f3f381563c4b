"""Running the test apps (``tests/apps/*.py``) and Dask's own commands as a user would.

A test that needs otel_graph exactly as a user gets it (its SDK built from OTEL_*
variables, the interpreter's exit, worker processes of their own) runs an app in a fresh
interpreter: :func:`run_app` runs one to its end and returns its :class:`Run`, whose
:meth:`Run.value` reads what the app printed as ``LABEL value`` lines. :func:`otlp_env`
is the environment that exports to a receiver (:mod:`otlp_receiver`); clusters started
from the command line read their scheduler's address with :func:`wait_for_address`, and
are stopped with :func:`stop_all`.

>>> run = Run(stdout="RESULT 55\\nFLUSHED True\\n", stderr="", returncode=0)
>>> run.value("RESULT"), run.value("FLUSHED")
('55', 'True')
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from conftest import subprocess_env

APPS = Path(__file__).parent / "apps"


def printed(stdout: str, label: str, *, stderr: str = "") -> str:
    """What the app printed after ``label`` on a line of its own."""
    for line in stdout.splitlines():
        if line.startswith(label + " "):
            return line[len(label) + 1:]
    raise AssertionError(f"{label} not printed; stdout={stdout!r} stderr={stderr[-4000:]!r}")


@dataclass
class Run:
    """An app run to its end."""

    stdout: str
    stderr: str
    returncode: int
    #: From the end of the app's last compute (its ``LAST_COMPUTE_END`` line) to its exit.
    exit_latency_s: float = 0.0

    def value(self, label: str) -> str:
        return printed(self.stdout, label, stderr=self.stderr)


def run_app(app: str | Path, *args: str, env: dict[str, str], timeout_s: float = 120,
            check: bool = True) -> Run:
    """Run ``app`` (a file of ``tests/apps``, or a path) with ``args`` to its end; with
    ``check``, it must exit cleanly."""
    proc = subprocess.run([sys.executable, str(APPS / app), *args], env=env, capture_output=True, text=True,
                          timeout=timeout_s)
    exited = time.monotonic()
    run = Run(proc.stdout, proc.stderr, proc.returncode)
    if "LAST_COMPUTE_END" in proc.stdout:  # the app's own time.monotonic(), printed as it finished
        run.exit_latency_s = exited - float(run.value("LAST_COMPUTE_END"))
    if check:
        assert run.returncode == 0, run.stderr[-4000:]
    return run


def otlp_env(endpoint: str, protocol: str = "grpc", *, service: str = "etl-test", **extra: str) -> dict[str, str]:
    """An environment that exports every signal to ``endpoint`` over OTLP; ``extra`` settings win."""
    settings = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
                "OTEL_SERVICE_NAME": service}
    return subprocess_env(**{**settings, **extra})


def without_otel(env: dict[str, str]) -> dict[str, str]:
    """``env`` with no OTEL_* setting: a process that must get its settings elsewhere."""
    return {k: v for k, v in env.items() if not k.startswith("OTEL_")}


def wait_for_address(path: Path, proc: subprocess.Popen, timeout_s: float = 60) -> str:
    """The address ``dask scheduler --scheduler-file path`` listens on, once it does."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"scheduler exited with {proc.returncode}")
        try:
            return json.loads(path.read_text())["address"]
        except (FileNotFoundError, ValueError, KeyError):
            time.sleep(0.05)  # the CLI's only readiness signal is this file appearing
    raise AssertionError("scheduler did not start")


def stop_all(procs: list[subprocess.Popen]) -> None:
    """SIGTERM to each (the last started first), as an operator stops a cluster; killed past 30 s."""
    import signal

    for proc in reversed(procs):
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
