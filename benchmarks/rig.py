"""The controller's side of a benchmark: arms run finely interleaved, and their runs paired.

A comparison is between *arms* (:mod:`arm`): long-lived processes that each run one
workload one way, run after run. A shared machine's speed drifts by tens of percent
within seconds, so two runs timed one after the other see different machines.
:func:`interleave` therefore runs all the arms at once and takes turns between them: each
arm's process group runs for one turn (``slice_s``, 50 ms) while the others are paused
(``SIGSTOP``), then the next, in an order drawn afresh every cycle, until every arm has
done its runs. Only one arm runs at a time, on one core (``ARM_CPU``), so none competes
with another, and every stretch of the machine's speed falls on all of them alike.

A run's wall time is the time it was running: the part of its ``start``-``end`` span
that falls in its arm's turns. A run of one arm is paired with what the other arm's runs
took *at the same time* (:func:`paired`: their times, weighted by how much of the run
they overlap), and the pairs go to :mod:`stats`. Only runs that lie between every arm's
first turn and the moment every arm had done its runs are kept; each arm warmed up before
its first turn (:mod:`arm`).

Each instrumented arm exports over OTLP/gRPC to a :class:`children.Receiver` of its own
(``tests/otlp_receiver.py``, decoding for real), in the arm's process group, so that it
runs exactly when its arm does, and never in the arm's process, whose CPU time is counted.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import math
import os
import platform
import random
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from children import Receiver, in_group

HERE = Path(__file__).resolve().parent
#: Every arm's process laid out alike: no address-space randomisation (where setarch can turn
#: it off); with one hash seed, set in Arm.start(), two arms of one tree are the same process.
SAME_LAYOUT = ["setarch", platform.machine(), "-R"] if shutil.which("setarch") else []
#: Where there are two cores or more, every arm (and its children) runs on the last one and
#: the controller and the receivers on the others (see pin_controller()): an arm resumed on
#: whichever core was free would meet a core of another speed than the arm before it.
_CPUS = sorted(os.sched_getaffinity(0))
ARM_CPU = _CPUS[-1] if len(_CPUS) > 1 else None
ON_ARM_CPU = ["taskset", "-c", str(ARM_CPU)] if ARM_CPU is not None and shutil.which("taskset") else []


def pin_controller() -> None:
    """Keep this process, and the receivers it starts, off the arms' core."""
    if ON_ARM_CPU:
        os.sched_setaffinity(0, set(_CPUS[:-1]))


@dataclass
class Run:
    """One run of an arm's workload: monotonic times, and what it cost."""

    start: float
    computed: float
    end: float
    cpu_s: float
    wall_s: float = 0.0  # the part of start..end the arm was running
    compute_s: float = 0.0  # the part of start..computed the arm was running


@dataclass
class Arm:
    """One side of a comparison, running in a process group of its own (see :mod:`arm`).

    ``python`` is the interpreter of the tree under test; ``label`` names the arm in the
    results and is its ``service.name``. ``pinned``: on the arms' core (see ``ARM_CPU``), or
    on every core, for a cluster whose processes should run side by side. What the arm
    writes to stderr goes to ``log``.
    """

    label: str
    workload: str
    way: str
    options: dict[str, Any] = field(default_factory=dict)
    python: str = sys.executable
    env: dict[str, str] = field(default_factory=dict)
    pinned: bool = True
    log: Path = HERE / "out" / "logs" / "arm.log"
    receiver: Receiver | None = field(default=None, repr=False)
    runs: list[Run] = field(default_factory=list, repr=False)
    completed: int | None = field(default=None, repr=False)  # runs done, as the arm said at its end
    delivered: dict[str, int] = field(default_factory=dict, repr=False)  # spans its receiver got, by name
    windows: list[tuple[float, float]] = field(default_factory=list, repr=False)
    origin: dict[str, Any] = field(default_factory=dict, repr=False)  # its python, otel_graph, versions
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _group: int = 0
    _pending: bytes = b""

    def start(self, timers: dict[str, str] | None = None) -> None:
        """Start the arm and wait for it to be ready; it is left paused. An instrumented
        arm's environment takes ``timers`` (see :func:`paced_timers`), then its own ``env``."""
        spec = json.dumps({"workload": self.workload, "way": self.way, "options": self.options})
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        env.pop("PYTHONPATH", None)
        if self.way == "otel_graph":
            self.receiver = Receiver()
            env.update(OTEL_EXPORTER_OTLP_ENDPOINT=self.receiver.endpoint, OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
                       OTEL_SERVICE_NAME=self.label, **(timers or {}))
        env.update(PYTHONHASHSEED="0", **self.env)
        group = self.receiver.pid if self.receiver is not None else 0
        cpus = ON_ARM_CPU if self.pinned else ["taskset", "-c", ",".join(map(str, _CPUS))] if ON_ARM_CPU else []
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("wb") as log:
            self._proc = subprocess.Popen([*cpus, *SAME_LAYOUT, self.python, str(HERE / "arm.py"), spec],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=env,
                                          cwd=str(HERE), preexec_fn=in_group(group))
        self._group = group or self._proc.pid
        assert self._proc.stdout is not None
        ready = self._proc.stdout.readline()
        if not ready.startswith(b'{"ready"'):
            raise SystemExit(f"arm {self.label} did not start: see {self.log}")
        self.origin = json.loads(ready)["ready"]
        self.pause()

    @property
    def running(self) -> bool:
        return self._proc is not None

    def pause(self) -> None:
        os.killpg(self._group, signal.SIGSTOP)

    def resume(self) -> None:
        os.killpg(self._group, signal.SIGCONT)

    def send(self, command: str) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        self._proc.stdin.write(command.encode() + b"\n")
        self._proc.stdin.flush()

    def turn(self, slice_s: float) -> None:
        """Let the arm run for ``slice_s``, reading what it writes meanwhile."""
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        began = time.monotonic()
        deadline = began + slice_s
        self.resume()
        ended = False
        while (left := deadline - time.monotonic()) > 0 and not ended:
            if select.select([fd], [], [], left)[0]:
                data = os.read(fd, 1 << 16)
                ended = not data
                self._pending += data
        self.pause()
        self.windows.append((began, time.monotonic()))
        *lines, self._pending = self._pending.split(b"\n")
        for line in lines:
            answer = json.loads(line)
            if "runs" in answer:
                self.completed = answer["runs"]
            else:
                self.runs.append(Run(**answer))
        if ended:
            self._finish()

    def _finish(self) -> None:
        assert self._proc is not None
        self.resume()
        code = self._release(120)
        if self.receiver is not None:
            self.delivered = self.receiver.take().spans.get(self.label, {})
            self.receiver.close()
        if code != 0 or self.completed is None:
            raise SystemExit(f"arm {self.label} ended with {code}: see {self.log}")

    def kill(self) -> None:
        """Kill the arm's process group (its receiver too), and reap and close what was left."""
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._group, signal.SIGKILL)
            self._release(None)
        if self.receiver is not None:
            self.receiver.close()

    def _release(self, timeout: float | None) -> int:
        """Reap the arm's process and close its pipes; its exit code."""
        assert self._proc is not None
        code = self._proc.wait(timeout)
        for pipe in (self._proc.stdin, self._proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        self._proc = None
        return code


@dataclass
class Trial:
    """Every arm's runs, and the stretch of time in which they all took turns."""

    arms: dict[str, Arm]
    kept_from: float  # every arm had had its first turn
    kept_until: float  # every arm had done its runs, and was told to stop
    seconds: float

    def kept(self, label: str) -> list[Run]:
        return [r for r in self.arms[label].runs if r.start >= self.kept_from and r.end <= self.kept_until]


def _running(windows: list[tuple[float, float]], start: float, end: float) -> float:
    """Seconds of [start, end] that fall in the running windows (sorted, apart)."""
    first = bisect.bisect_right(windows, (start, math.inf)) - 1
    total = 0.0
    for a, b in windows[max(first, 0):]:
        if a >= end:
            break
        total += max(0.0, min(b, end) - max(a, start))
    return total


def _next_cycle(cycle: list[Arm], rng: random.Random) -> list[Arm]:
    """The running arms in a fresh random order, one turn each, the last cycle's last arm
    not first: every arm gets as many turns, and as many switches, as every other."""
    running = [arm for arm in cycle if arm.running]
    rng.shuffle(running)
    if len(running) > 1 and running[0] is cycle[-1]:
        running[0], running[-1] = running[-1], running[0]
    return running


def paced_timers(arms: int) -> dict[str, str]:
    """otel_graph's periodic work, ``arms`` times further apart on the wall clock.

    Taking turns with ``arms - 1`` others, an arm runs about one second in ``arms``; its
    metric exports, drains and progress spans, timed on the wall clock, would come that
    many times as often per second of its running as in a process of its own. Spaced out
    so, they come as often as by default. (This tree's defaults: in an A/B, both trees get
    the same.)
    """
    from otel_graph.config import OTEL_GRAPH_DRAIN_INTERVAL, OTEL_GRAPH_PROGRESS_INTERVAL, load_settings

    defaults = load_settings({})
    return {"OTEL_METRIC_EXPORT_INTERVAL": f"{defaults.metric_export_interval_ms * arms:g}",
            OTEL_GRAPH_DRAIN_INTERVAL: f"{defaults.drain_interval_s * arms:g}",
            OTEL_GRAPH_PROGRESS_INTERVAL: f"{defaults.progress_interval_s * arms:g}"}


def interleave(arms: Sequence[Arm], *, runs: int, seconds: float = 0.0, slice_s: float = 0.05, seed: int = 0,
               progress: str = "") -> Trial:
    """Run the arms at once, taking turns, until each has done ``runs`` runs side by side
    and they have taken turns for ``seconds`` since each had its first: a trial fills its
    time on a fast machine, and still has its runs on a slow one.

    The arms start in an order drawn from ``seed``, as their turns are: no arm is always
    the first to take its memory or its turn. Instrumented arms get :func:`paced_timers`
    (where their own ``env`` does not set them). At the end, an instrumented arm finishes
    its run and exits as a script does (its exit hook delivering what is left); the others
    are killed at once.
    """
    began = time.perf_counter()
    rng = random.Random(seed)
    timers = paced_timers(len(arms))
    try:
        for arm in rng.sample(list(arms), len(arms)):
            arm.start(timers)
        for arm in arms:
            arm.send("go")
        cycle = _next_cycle(list(arms), rng)
        kept_from = kept_until = math.inf
        shown = -1
        while cycle:
            for arm in cycle:
                arm.turn(slice_s)
            if kept_from == math.inf:
                kept_from = max(arm.windows[0][0] for arm in arms)
            counts = [len([r for r in arm.runs if r.start >= kept_from]) for arm in arms]
            if kept_until == math.inf and min(counts) >= runs and time.monotonic() - kept_from >= seconds:
                kept_until = time.monotonic()
                for arm in arms:
                    if arm.receiver is not None:
                        arm.send("stop")
                    else:
                        arm.kill()
            if progress and min(counts) != shown:
                shown = min(counts)
                print(f"\r{progress}: {shown} runs ({runs} at least, {seconds:.0f} s)", end="", file=sys.stderr,
                      flush=True)
            cycle = _next_cycle(cycle, rng)
    finally:
        for arm in arms:
            arm.kill()
        if progress:
            print(file=sys.stderr)
    for arm in arms:
        for run in arm.runs:
            run.wall_s = _running(arm.windows, run.start, run.end)
            run.compute_s = _running(arm.windows, run.start, run.computed)
    return Trial({arm.label: arm for arm in arms}, kept_from, kept_until, time.perf_counter() - began)


def raw(trial: Trial) -> dict[str, Any]:
    """The trial as plain data: the kept stretch, and each arm's runs."""
    return {"kept_from": trial.kept_from, "kept_until": trial.kept_until,
            "arms": {label: [vars(run) for run in arm.runs] for label, arm in trial.arms.items()}}


def paired(trial: Trial, measured: str, reference: str, what: str = "wall_s") -> tuple[list[float], list[float]]:
    """Each kept run of ``measured`` against what ``reference``'s runs took meanwhile.

    The reference's figure for a run is the mean of its runs' figures, each weighted by
    how much of the run's span it overlaps; its runs outside the kept stretch count too,
    since they were timed alongside all the same.
    """
    ours, theirs = [], []
    others = trial.arms[reference].runs
    for run in trial.kept(measured):
        weights = [(max(0.0, min(o.end, run.end) - max(o.start, run.start)), getattr(o, what)) for o in others]
        total = sum(w for w, _ in weights)
        if total <= 0:
            continue
        ours.append(getattr(run, what))
        theirs.append(sum(w * v for w, v in weights) / total)
    return ours, theirs
