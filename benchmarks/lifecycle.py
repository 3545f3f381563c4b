"""What otel_graph adds to a short dask.distributed script's start and stop, phase by phase.

Short scripts, batch jobs and test suites start and stop clusters all day, so what
otel_graph adds there is paid in seconds, once a process. The script (this file's
``--app``) is a user's: it imports dask and distributed (instrumented, also otel_graph,
calling ``instrument_scheduler()`` with the SDK built from the ``OTEL_*`` variables), starts
a ``LocalCluster`` of 2 worker processes with 1 thread each and a ``Client``, computes one
``submit``, closes client and cluster, and exits. Each run is a fresh process. The phases,
on ``CLOCK_MONOTONIC`` (one clock for every process on Linux):

* ``imports``: from the parent starting the process (the interpreter's start included) to
  the imports done and ``instrument_scheduler()`` returned;
* ``up``: the cluster and the client started;
* ``compute``: the one ``submit`` computed;
* ``closed``: client and cluster closed;
* ``exit``: from then to the parent seeing the process end (exit hooks: otel_graph's
  delivery);
* ``total``: start to end.

A round runs ``plain`` (otel_graph never imported) and ``otel_graph`` once each, in an order
drawn afresh, back to back, so a drift of the machine's speed falls on both; a phase's
figure is the trimmed mean of the rounds' differences (``otel_graph`` minus ``plain``), with
its 95% bootstrap interval (:func:`stats.paired_difference`). Instrumented runs export over
OTLP (gRPC, then OTLP/HTTP in rounds of their own) to a receiver in another process
(``tests/otlp_receiver.py``, decoding for real), which must have received the compute's
spans.

Bytecode: an installed package's modules are compiled when it is installed. Where
``PYTHONDONTWRITEBYTECODE`` is set, a checkout's otel_graph would be compiled afresh in every
process, which a user never pays, so :func:`compile_tree` compiles it first.

The bars (issue 45): each phase within +0.1 s, the total within +0.2 s, over either protocol.

Usage::

    python benchmarks/lifecycle.py [--rounds 8] [--protocols grpc,http/protobuf]
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import stats  # noqa: E402
from children import LineProcess  # noqa: E402

PHASES = ("imports", "up", "compute", "closed", "exit", "total")
BARS = {"imports": 0.1, "up": 0.1, "compute": 0.1, "closed": 0.1, "exit": 0.1, "total": 0.2}
PROTOCOLS = ("grpc", "http/protobuf")
WAYS = ("plain", "otel_graph")

RECEIVER = """
import json, sys
sys.path.insert(0, {tests!r})
from otlp_receiver import OtlpReceiver
with OtlpReceiver() as receiver:
    print(json.dumps({{"grpc": receiver.grpc_endpoint, "http/protobuf": receiver.http_endpoint}}), flush=True)
    for line in sys.stdin:
        if line.strip() != "take":
            break
        names = [span["name"] for span in receiver.spans()]
        receiver.clear()
        print(json.dumps(names), flush=True)
"""


def app(way: str) -> None:
    """The user's script; prints its phases' monotonic readings as one JSON line."""
    marks = {}
    import dask  # noqa: F401
    import distributed  # noqa: F401

    if way == "otel_graph":
        import otel_graph

        otel_graph.instrument_scheduler()
    marks["imports"] = time.monotonic()
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0")
    client = Client(cluster)
    marks["up"] = time.monotonic()
    assert client.submit(int, 1, pure=False).result() == 1
    marks["compute"] = time.monotonic()
    client.close()
    cluster.close()
    marks["closed"] = time.monotonic()
    print("MARKS", json.dumps(marks), flush=True)


def compile_tree() -> None:
    """otel_graph's modules compiled, as installing it would (see the module docs)."""
    compileall.compile_dir(str(ROOT / "otel_graph"), quiet=1)


def run_once(way: str, *, env: dict[str, str]) -> dict[str, float]:
    """One fresh process of the script: its phases in seconds."""
    started = time.monotonic()
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--app", way], env=env,
                          capture_output=True, text=True, timeout=300)
    ended = time.monotonic()
    marks = next((json.loads(line.split(" ", 1)[1]) for line in proc.stdout.splitlines()
                  if line.startswith("MARKS ")), None)
    if proc.returncode != 0 or marks is None:
        raise RuntimeError(f"the {way} script failed ({proc.returncode}): {proc.stderr[-2000:]}")
    points = [started, marks["imports"], marks["up"], marks["compute"], marks["closed"], ended]
    phases = {name: b - a for name, a, b in zip(PHASES[:-1], points[:-1], points[1:], strict=True)}
    phases["total"] = ended - started
    return phases


def trial(protocol: str, *, rounds: int, seed: int = 0) -> dict[str, dict[str, list[float]]]:
    """``rounds`` rounds of both ways over ``protocol``: {way: {phase: [seconds a round]}}."""
    receiver = LineProcess([sys.executable, "-c", RECEIVER.format(tests=str(ROOT / "tests"))])
    try:
        endpoints = json.loads(receiver.first)
        base = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "DASK_"))}
        env = {**base, "OTEL_EXPORTER_OTLP_ENDPOINT": endpoints[protocol], "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
               "OTEL_SERVICE_NAME": "lifecycle"}
        order = random.Random(seed)
        out: dict[str, dict[str, list[float]]] = {way: {phase: [] for phase in PHASES} for way in WAYS}
        for i in range(rounds):
            ways = list(WAYS)
            order.shuffle(ways)
            for way in ways:
                phases = run_once(way, env=env)
                for phase, seconds in phases.items():
                    out[way][phase].append(seconds)
            names = json.loads(receiver.ask("take"))
            if "int" not in names:  # the submit's task span, from a worker process
                raise RuntimeError(f"round {i + 1} over {protocol}: the compute's spans did not arrive ({names})")
            print(f"{protocol} round {i + 1}/{rounds}: total {out['plain']['total'][-1]:.2f} s plain, "
                  f"{out['otel_graph']['total'][-1]:.2f} s with otel_graph", file=sys.stderr)
        return out
    finally:
        receiver.close()


def rows(protocol: str, runs: dict[str, dict[str, list[float]]]) -> list[dict[str, Any]]:
    """A row per phase: the added seconds with their interval, and the verdict against the bar."""
    out = []
    for phase in PHASES:
        added = stats.paired_difference(runs["otel_graph"][phase], runs["plain"][phase])
        plain = sorted(runs["plain"][phase])[len(runs["plain"][phase]) // 2]
        out.append({"protocol": protocol, "phase": phase, "bar": BARS[phase], "plain_s": plain,
                    "added": added.value, "lo": added.lo, "hi": added.hi, "rounds": added.rounds,
                    "verdict": stats.verdict(added, bar=BARS[phase])})
    return out


def table(all_rows: list[dict[str, Any]]) -> str:
    lines = ["| protocol | phase | plain (median) | added by otel_graph | bar | within |", "|---|---|---|---|---|---|"]
    for row in all_rows:
        word = "**no**" if row["verdict"] == "no" else row["verdict"]
        lines.append(f"| {row['protocol']} | {row['phase']} | {row['plain_s']:.2f} s | "
                     f"{row['added']:+.3f} s [{row['lo']:+.3f}, {row['hi']:+.3f}] | ≤ +{row['bar']:.1f} s | {word} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--app", choices=WAYS, help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--protocols", default=",".join(PROTOCOLS))
    parser.add_argument("--out", type=Path, default=HERE / "out")
    args = parser.parse_args()
    if args.app:
        app(args.app)
        return
    if args.rounds < 2:
        parser.error("--rounds must be at least 2")
    compile_tree()
    all_rows = []
    for protocol in args.protocols.split(","):
        all_rows.extend(rows(protocol, trial(protocol, rounds=args.rounds)))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "lifecycle.json").write_text(json.dumps(all_rows, indent=2))
    print(table(all_rows))


if __name__ == "__main__":
    main()
