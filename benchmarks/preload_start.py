"""What ``--preload otel_graph`` adds to ``dask scheduler`` and ``dask worker`` starting and stopping.

Clusters started from the command line (batch jobs, HPC allocations) take otel_graph as a
preload (:mod:`otel_graph.cluster.preload`). Each round starts, for each arm, a
``dask scheduler`` and, against a plain scheduler shared by the trial, a ``dask worker``
(its nanny and one worker process, one thread), each a fresh process, and times:

* ``ready``: from the launch to the process being ready: for the scheduler, running, its
  preloads and plugins started (the :mod:`preload_ready` preload says so); for the worker,
  its ``Registered to:`` line, which distributed writes once the worker's preloads are done
  and the scheduler has it;
* ``stop``: from ``SIGTERM`` to the process gone (what it delivers on the way out).

The arms, as in :mod:`lifecycle`: ``plain``; ``sdk``, the stock OpenTelemetry SDK with OTLP
exporters set up by hand in a preload (:func:`lifecycle_app.dask_setup`), what any
OpenTelemetry there costs; ``otel_graph`` (``--preload otel_graph``). Both export over
OTLP, gRPC then HTTP in trials of their own, to a receiver in another process, which must
get the sdk arm's two spans and otel_graph's metric points every round. In a round
the arms run in an order drawn afresh; each comparison is the trimmed mean of the rounds'
differences with its 95% bootstrap interval (:func:`stats.paired_difference`). The bar
(issue 45): ``ready`` within +0.1 s of plain.

Usage::

    python benchmarks/preload_start.py [--rounds 8] [--protocols grpc,http/protobuf]
"""

from __future__ import annotations

import argparse
import json
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from children import Receiver  # noqa: E402
from lifecycle import COMPARISONS, PROTOCOLS, clean_env, compile_tree, export_env, rows, span_counts, table  # noqa: E402

ARMS = ("plain", "sdk", "otel_graph")
PRELOADS = {"plain": [], "sdk": [str(HERE / "lifecycle_app.py")], "otel_graph": ["otel_graph"]}
PHASES = ("ready", "stop")
BAR_S = 0.1
DASK = str(Path(sys.executable).parent / "dask")


class Started:
    """A ``dask`` command line started now, its stderr lines read as they come."""

    def __init__(self, argv: list[str], *, env: dict[str, str]) -> None:
        self.launched = time.monotonic()
        self._proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, text=True)
        self._lines: queue.Queue[tuple[float, str]] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self._proc.stderr is not None
        for line in self._proc.stderr:
            self._lines.put((time.monotonic(), line))

    def until(self, text: str, *, timeout_s: float = 60.0) -> tuple[float, str]:
        """When the first line holding ``text`` came, and the line."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                at, line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.stop()
                raise RuntimeError(f"no {text!r} within {timeout_s} s: {''.join(self.seen)[-2000:]}") from None
            self.seen.append(line)
            if text in line:
                return at, line

    def stop(self) -> float:
        """SIGTERM, then the seconds until the process is gone."""
        began = time.monotonic()
        self._proc.send_signal(signal.SIGTERM)
        try:
            self._proc.wait(60)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
            raise RuntimeError("a dask process did not stop within 60 s of SIGTERM") from None
        return time.monotonic() - began


def preload_args(arm: str, *, last: list[str]) -> list[str]:
    """``--preload`` arguments for ``arm``'s preloads, then ``last``'s."""
    return [arg for preload in PRELOADS[arm] + last for arg in ("--preload", preload)]


def start_scheduler(arm: str, *, env: dict[str, str]) -> dict[str, float]:
    process = Started([DASK, "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                       *preload_args(arm, last=[str(HERE / "preload_ready.py")])], env=env)
    ready, _ = process.until("READY")
    return {"ready": ready - process.launched, "stop": process.stop()}


def start_worker(arm: str, scheduler: str, *, env: dict[str, str]) -> dict[str, float]:
    process = Started([DASK, "worker", scheduler, "--nthreads", "1", "--nworkers", "1", "--no-dashboard",
                       "--host", "127.0.0.1", *preload_args(arm, last=[])], env=env)
    ready, _ = process.until("Registered to:")
    return {"ready": ready - process.launched, "stop": process.stop()}


def trial(protocol: str, *, rounds: int, seed: int = 0) -> dict[str, dict[str, dict[str, list[float]]]]:
    """{role: {arm: {phase: [seconds a round]}}} over ``protocol``."""
    receiver = Receiver()
    scheduler = Started([DASK, "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard"], env=clean_env())
    try:
        address = scheduler.until("Scheduler at:")[1].split()[-1]
        env = export_env(receiver, protocol, service="preload-start")
        out = {role: {arm: {phase: [] for phase in PHASES} for arm in ARMS} for role in ("scheduler", "worker")}
        order = random.Random(seed)
        for i in range(rounds):
            for role in ("scheduler", "worker"):
                arms = list(ARMS)
                order.shuffle(arms)
                for arm in arms:
                    took = start_scheduler(arm, env=env) if role == "scheduler" else start_worker(arm, address, env=env)
                    for phase, seconds in took.items():
                        out[role][arm][phase].append(seconds)
            taken = receiver.take()
            # The sdk arm's scheduler and worker each end one span; otel_graph's export their readings.
            if span_counts(taken).get("set-up") != 2 or not taken.points:
                raise RuntimeError(f"round {i + 1} over {protocol}: not all arms delivered ({taken})")
            print(f"{protocol} round {i + 1}/{rounds}: ready " + ", ".join(
                f"{role} {arm} {out[role][arm]['ready'][-1]:.2f} s" for role in out for arm in ARMS), file=sys.stderr)
        return out
    finally:
        scheduler.stop()
        receiver.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--protocols", default=",".join(PROTOCOLS))
    parser.add_argument("--out", type=Path, default=HERE / "out")
    args = parser.parse_args()
    if args.rounds < 2:
        parser.error("--rounds must be at least 2")
    compile_tree(sys.executable)
    all_rows = []
    for protocol in args.protocols.split(","):
        for role, runs in trial(protocol, rounds=args.rounds).items():
            all_rows.extend(rows(runs, COMPARISONS, bars={"ready": BAR_S}, protocol=protocol, process=role))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "preload_start.json").write_text(json.dumps(all_rows, indent=2))
    print(table(all_rows, labels=("protocol", "process")))


if __name__ == "__main__":
    main()
