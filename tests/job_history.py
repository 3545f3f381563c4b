"""Days of a job's runs in a few seconds: real runs, their metrics placed back in time, backfilled.

Alerts about a job's history ("slower than usual", "did not run") need days of it. Here
each run is a real one: ``apps/jobs.py`` computes the job with otel_graph and exports its
metrics over OTLP to an :class:`~otlp_receiver.OtlpReceiver`; after each run,
:class:`History` reads what the collector's ``prometheus`` exporter would then serve
(:class:`~collector_exporter.CollectorExposition`, the stack's naming) and notes it at the
run's place in the synthesised timeline. :meth:`History.openmetrics` then writes the
samples Prometheus would have scraped every :data:`STEP_S`:

* a long-lived process (``lives=True``, a service computing the job now and then): each
  series from its first run to the timeline's end;
* a short-lived one (a cron job): each series until :data:`EXPIRY_S` after its process's
  last run, as the collector keeps serving a silent process's series that long
  (``metric_expiration`` in ``collector/otelcol-config.yaml``).

:func:`backfill` turns that file into TSDB blocks with ``promtool tsdb create-blocks-from
openmetrics``, for a :class:`~prometheus_server.PrometheusServer` to start on.

Usage::

    history = History(receiver, now=time.time())
    with history.process("etl", name="nightly", lives=True) as process:
        for day in range(8, 0, -1):
            process.run(at=history.now - day * 86400, task_ms=20)
    backfill(history.openmetrics(), data_dir)
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from collector_exporter import CollectorExposition, exporter_settings
from otlp_receiver import OtlpReceiver
from prometheus_server import PROMTOOL
from subprocesses import otlp_env

APP = Path(__file__).parent / "apps" / "jobs.py"
#: Seconds between the synthesised scrapes: within Prometheus's 5-minute lookback.
STEP_S = 240
#: How long the collector serves a silent process's series: its exporter's metric_expiration.
_EXPIRATION = str(exporter_settings().get("metric_expiration", "5m"))
EXPIRY_S = int(_EXPIRATION[:-1]) * {"s": 1, "m": 60, "h": 3600}[_EXPIRATION[-1]]
#: Families the job rules read (the rest of what a run exports is left out: smaller blocks,
#: which promtool makes in one pass over the file per two hours of the timeline) ...
FAMILIES = re.compile(r"dask_compute_")
#: ... and of a histogram, its count, sum and +Inf bucket (the rules read no other bucket).
_BUCKETS = re.compile(r'_bucket$')

Series = tuple[str, tuple[tuple[str, str], ...]]  # (sample name, labels)


class History:
    """The samples of the runs noted so far, on a timeline ending at ``now`` (Unix seconds)."""

    def __init__(self, receiver: OtlpReceiver, *, now: float) -> None:
        self.now = int(now) // STEP_S * STEP_S
        self._receiver = receiver
        self._exposition = CollectorExposition(receiver)
        self._points: dict[Series, list[tuple[int, float]]] = {}
        self._types: dict[str, str] = {}  # family -> type
        self._family_of: dict[Series, str] = {}
        #: Instance -> when its series stop (None: at the end of the timeline).
        self._ends: dict[str, int | None] = {}

    @contextmanager
    def process(self, service: str, *, name: str, lives: bool, scheduler: str = "sync") -> Iterator[Process]:
        """A process of ``service`` running job ``name`` on ``scheduler`` (``apps/jobs.py``'s); it
        lives to the timeline's end or not."""
        process = Process(self, service, name, scheduler)
        try:
            yield process
        except BaseException:
            process.kill()
            raise
        process.close()
        for instance in process.instances:
            self._ends[instance] = None if lives else process.last_run + EXPIRY_S

    def note(self, at: int, service: str) -> set[str]:
        """What the exposition serves of ``service`` now, as scraped at ``at``; the instances seen."""
        instances = set()
        for family in self._exposition.collect():
            if not FAMILIES.match(family.name):
                continue
            self._types[family.name] = family.type
            for sample in family.samples:
                if sample.labels.get("job") != service or (_BUCKETS.search(sample.name)
                                                           and sample.labels.get("le") != "+Inf"):
                    continue
                instances.add(sample.labels.get("instance", ""))
                series = (sample.name, tuple(sorted(sample.labels.items())))
                self._family_of[series] = family.name
                points = self._points.setdefault(series, [])
                if not points or points[-1][1] != sample.value:
                    points.append((at, sample.value))
        return instances

    def openmetrics(self) -> str:
        """The scrapes, as OpenMetrics with timestamps, ``# EOF`` last."""
        by_family: dict[str, dict[tuple, dict[int, list[str]]]] = {}
        for series, points in self._points.items():
            name, labels = series
            instance = dict(labels).get("instance", "")
            end = self._ends.get(instance)
            end = self.now if end is None else min(end, self.now)
            group = tuple(item for item in labels if item[0] != "le")
            at_times = by_family.setdefault(self._family_of[series], {}).setdefault(group, {})
            text = "{" + ",".join(f'{key}="{_escape(value)}"' for key, value in labels) + "}"
            index = 0
            for at in range(points[0][0], end + 1, STEP_S):
                while index + 1 < len(points) and points[index + 1][0] <= at:
                    index += 1
                at_times.setdefault(at, []).append(f"{name}{text} {points[index][1]!r} {at}")
        lines = []
        for family, groups in sorted(by_family.items()):
            lines.append(f"# TYPE {family} {self._types[family]}")
            for _, at_times in sorted(groups.items()):
                for at in sorted(at_times):
                    lines += sorted(at_times[at], key=_in_point_order)
        return "\n".join([*lines, "# EOF", ""])


class Process:
    """One ``apps/jobs.py --serve`` process; :meth:`run` runs the job and notes its metrics."""

    def __init__(self, history: History, service: str, name: str, scheduler: str) -> None:
        self._history = history
        self._service = service
        self.instances: set[str] = set()
        self.last_run = 0
        self._proc = subprocess.Popen([sys.executable, str(APP), "--serve", "--name", name, "--scheduler", scheduler],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env=otlp_env(history._receiver.grpc_endpoint, "grpc",
                                                              service=service, OTEL_TRACES_EXPORTER="none"))

    def run(self, *, at: float, **job: Any) -> None:
        """Run the job with ``job``'s keywords (``apps/jobs.py``'s); its metrics as of ``at``."""
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(json.dumps(job) + "\n")
        self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        if not line:  # it died: say why
            self._proc.wait(timeout=60)
            raise AssertionError(self._proc.stderr.read()[-3000:])
        assert line.strip() == "RAN True", line
        self.last_run = int(at) // STEP_S * STEP_S
        self.instances |= self._history.note(self.last_run, self._service)

    def close(self) -> None:
        _, err = self._proc.communicate(timeout=120)
        assert self._proc.returncode == 0, err[-3000:]

    def kill(self) -> None:
        self._proc.kill()
        self._proc.communicate()


def backfill(openmetrics: str, data_dir: Path) -> None:
    """TSDB blocks of ``openmetrics`` in ``data_dir``, through ``promtool``."""
    source = data_dir.parent / "history.om"
    source.write_text(openmetrics)
    made = subprocess.run([str(PROMTOOL), "tsdb", "create-blocks-from", "openmetrics", "--quiet", str(source),
                           str(data_dir)], capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _in_point_order(line: str) -> tuple[int, float]:
    """A histogram's point: its buckets by bound, then its count and sum."""
    name = line.split("{", 1)[0]
    if name.endswith("_bucket"):
        bound = re.search(r'le="([^"]+)"', line)
        return 0, float(bound.group(1)) if bound else 0.0
    return (1 if name.endswith("_count") else 2), 0.0
