"""A real Prometheus server for tests (Debian's ``prometheus`` package), scraping given targets.

:class:`PrometheusServer` writes a config that scrapes each target every second, starts
``prometheus`` on a free local port with its storage in a temporary directory, and
waits until it is ready. ``query(expr)`` runs an instant query through the HTTP API
(``/api/v1/query``) and returns the result vector; a query that does not parse raises
:class:`QueryError` with Prometheus's own message. ``wait_for(expr, predicate)`` waits,
on Prometheus's answers and a deadline, until the result satisfies ``predicate``.
``honor_labels=True`` keeps the targets' own ``job`` and ``instance`` labels, as the
stack's Prometheus does for the collector's exporter. ``data_dir`` starts it on storage
made beforehand (blocks backfilled by ``promtool``: ``job_history.py``), and ``query(expr,
at=...)`` evaluates at a given time.

Usage::

    with PrometheusServer({"etl": ["127.0.0.1:9464"]}) as prometheus:
        assert prometheus.wait_for("up", lambda r: r and r[0]["value"] == 1, timeout_s=30)
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ports import free_port

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")


class QueryError(AssertionError):
    """Prometheus refused a query (it does not parse, or it failed)."""


class PrometheusServer:
    def __init__(self, jobs: Mapping[str, Sequence[str]], *, scrape_interval_ms: int = 1000,
                 honor_labels: bool = False, data_dir: Path | None = None) -> None:
        if PROMETHEUS is None:
            raise RuntimeError("prometheus is not installed (make test installs Debian's package as root)")
        self._dir = Path(tempfile.mkdtemp(prefix="otel-graph-prometheus-"))
        self.port = free_port()
        lines = ["global:", f"  scrape_interval: {scrape_interval_ms}ms",
                 f"  evaluation_interval: {scrape_interval_ms}ms", "scrape_configs:"]
        for job, targets in jobs.items():
            lines += [f"  - job_name: {json.dumps(job)}", f"    honor_labels: {json.dumps(honor_labels)}",
                      "    static_configs:",
                      f"      - targets: {json.dumps(list(targets))}"]
        self.config = self._dir / "prometheus.yml"
        self.config.write_text("\n".join(lines) + "\n")
        self._proc: subprocess.Popen | None = None
        self.data_dir = data_dir or self._dir / "data"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> PrometheusServer:
        self._log = (self._dir / "prometheus.log").open("w")
        self._proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={self.config}", f"--storage.tsdb.path={self.data_dir}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"prometheus exited: {(self._dir / 'prometheus.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as reply:
                    if reply.status == 200:
                        return self
            except OSError:
                time.sleep(0.1)  # not listening yet: the server gives no other readiness signal
        raise RuntimeError("prometheus did not become ready in 60 s")

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(20)
            except subprocess.TimeoutExpired:
                self._proc.kill()
            self._proc = None
            self._log.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def query(self, expr: str, *, at: float | None = None) -> list[dict[str, Any]]:
        """Instant query (at ``at``, Unix seconds; None: now); each result is {"metric": labels, "value": float}."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr, **({} if at is None else
                                                                                    {"time": str(at)})})
        try:
            with urllib.request.urlopen(url, timeout=10) as reply:
                body = json.load(reply)
        except urllib.error.HTTPError as exc:
            body = json.load(exc)
            raise QueryError(f"{expr!r}: {body.get('errorType')}: {body.get('error')}") from None
        data = body["data"]
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": float(data["result"][1])}]
        return [{"metric": r["metric"], "value": float(r["value"][1])} for r in data["result"]]

    def wait_for(self, expr: str, predicate: Callable[[list[dict[str, Any]]], bool], *,
                 timeout_s: float) -> bool:
        """Re-query until ``predicate`` holds on the result (it changes at each 1 s scrape)."""
        deadline = time.monotonic() + timeout_s
        while True:
            if predicate(self.query(expr)):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.25)  # Prometheus has no push notification for new samples
