"""What otel_graph adds to a short dask.distributed script's start and stop, phase by phase.

Short scripts, batch jobs and test suites start and stop clusters all day, so what
otel_graph adds there is paid in seconds, once a process. The script is a user's
(:mod:`lifecycle_app`): it imports dask and distributed (instrumented, also otel_graph,
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

The arms (:mod:`lifecycle_app`'s ways): ``plain``; ``sdk``, the stock OpenTelemetry SDK
with OTLP exporters set up by hand in every process, which is what any OpenTelemetry there
costs; and ``otel_graph``. A round runs each arm once, in an order drawn afresh, back to
back, so a drift of the machine's speed falls on all; a comparison's figure is the trimmed
mean of the rounds' differences, with its 95% bootstrap interval
(:func:`stats.paired_difference`). Three comparisons: ``sdk`` over ``plain`` (the SDK's
own cost), ``otel_graph`` over ``plain`` (judged against the bars) and ``otel_graph`` over
``sdk`` (what otel_graph adds to the SDK, also judged against them). With ``--old REV``:
that revision's otel_graph (its own worktree and venv, as ``make bench-ab`` builds them)
against this tree's, both instrumented: what a change to this tree gained or cost.
Processes of a venv of their own are not those of this tree's: an A/A (``--old HEAD`` on a
clean tree) shows how far the two venvs differ before any change does, and a difference is
read against it. Instrumented runs export over OTLP (gRPC, then OTLP/HTTP in rounds of
their own) to a receiver in another process (``tests/otlp_receiver.py``, decoding for
real), which must have received otel_graph's task span for the compute every round.

Bytecode: an installed package's modules are compiled when it is installed. Where
``PYTHONDONTWRITEBYTECODE`` is set, a checkout's otel_graph (and anything in a venv installed
without compiling) would be compiled afresh in every process, which a user never pays, so
each arm's interpreter has its site-packages and otel_graph compiled first.

The bars (issue 45): each phase within +0.1 s, the total within +0.2 s, over either protocol.

Usage::

    python benchmarks/lifecycle.py [--rounds 10] [--protocols grpc,http/protobuf] \
        [--old REV --uv UV --python PYTHON]
"""

from __future__ import annotations

import argparse
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
from children import Receiver, Taken  # noqa: E402

PHASES = ("imports", "up", "compute", "closed", "exit", "total")
BARS = {"imports": 0.1, "up": 0.1, "compute": 0.1, "closed": 0.1, "exit": 0.1, "total": 0.2}
PROTOCOLS = ("grpc", "http/protobuf")

def clean_env() -> dict[str, str]:
    """This process's environment without its ``OTEL_*`` and ``DASK_*`` variables."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "DASK_"))}


def export_env(receiver: Receiver, protocol: str, *, service: str) -> dict[str, str]:
    """A clean environment whose OpenTelemetry exports to ``receiver`` over ``protocol``."""
    return {**clean_env(), "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoints[protocol],
            "OTEL_EXPORTER_OTLP_PROTOCOL": protocol, "OTEL_SERVICE_NAME": service}


def span_counts(taken: Taken) -> dict[str, int]:
    """Spans taken by name, whatever their service."""
    counts: dict[str, int] = {}
    for by_name in taken.spans.values():
        for name, n in by_name.items():
            counts[name] = counts.get(name, 0) + n
    return counts


#: An arm: its label, the interpreter it runs the script with, and the way it runs it.
Arm = tuple[str, str, str]
APP = HERE / "lifecycle_app.py"


def compile_tree(python: str) -> None:
    """What ``python`` imports, compiled, as installing it would (see the module docs): its
    site-packages (``make venv`` compiles its own at install; a venv ``bench-ab`` built for an
    old tree is not) and the otel_graph it imports (a checkout's, installed editable)."""
    subprocess.run([python, "-c", "import compileall, os, sysconfig, otel_graph; "
                    "compileall.compile_dir(sysconfig.get_path('purelib'), quiet=1, workers=0); "
                    "compileall.compile_dir(os.path.dirname(otel_graph.__file__), quiet=1)"], check=True)


def run_once(python: str, way: str, *, env: dict[str, str]) -> dict[str, float]:
    """One fresh process of the script: its phases in seconds."""
    started = time.monotonic()
    proc = subprocess.run([python, str(APP), way], env=env, capture_output=True, text=True, timeout=300)
    ended = time.monotonic()
    marks = next((json.loads(line.split(" ", 1)[1]) for line in proc.stdout.splitlines()
                  if line.startswith("MARKS ")), None)
    if proc.returncode != 0 or marks is None:
        raise RuntimeError(f"the {way} script under {python} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    points = [started, marks["imports"], marks["up"], marks["compute"], marks["closed"], ended]
    phases = {name: b - a for name, a, b in zip(PHASES[:-1], points[:-1], points[1:], strict=True)}
    phases["total"] = ended - started
    return phases


def trial(protocol: str, arms: list[Arm], *, rounds: int, seed: int = 0) -> dict[str, dict[str, list[float]]]:
    """``rounds`` rounds of ``arms`` over ``protocol``: {label: {phase: [seconds a round]}}."""
    receiver = Receiver()
    try:
        env = export_env(receiver, protocol, service="lifecycle")
        order = random.Random(seed)
        out: dict[str, dict[str, list[float]]] = {label: {phase: [] for phase in PHASES} for label, _, _ in arms}
        for i in range(rounds):
            shuffled = list(arms)
            order.shuffle(shuffled)
            for label, python, way in shuffled:
                for phase, seconds in run_once(python, way, env=env).items():
                    out[label][phase].append(seconds)
            names = span_counts(receiver.take())
            if "int" not in names:  # the submit's task span, from a worker process
                raise RuntimeError(f"round {i + 1} over {protocol}: the compute's spans did not arrive ({names})")
            if any(way == "sdk" for _, _, way in arms) and names.get("set-up") != 3:  # one from each process
                raise RuntimeError(f"round {i + 1} over {protocol}: the sdk arm's spans did not all arrive ({names})")
            print(f"{protocol} round {i + 1}/{rounds}: total "
                  + ", ".join(f"{label} {out[label]['total'][-1]:.2f} s" for label, _, _ in arms), file=sys.stderr)
        return out
    finally:
        receiver.close()


#: (new, old, judged against the bars) for each comparison of the default arms.
COMPARISONS = (("sdk", "plain", False), ("otel_graph", "plain", True), ("otel_graph", "sdk", True))


def rows(runs: dict[str, dict[str, list[float]]], comparisons: tuple[tuple[str, str, bool], ...], *,
         bars: dict[str, float], **labels: str) -> list[dict[str, Any]]:
    """A row per comparison and phase of ``runs`` ({arm: {phase: [seconds a round]}}):
    ``new``'s seconds less ``old``'s with their interval, and the verdict against the phase's
    bar (``bars``; a phase without one has none) where the comparison is judged. Each row
    also carries ``labels`` (the protocol, say), which :func:`table` shows first."""
    out = []
    for new, old, judged in comparisons:
        for phase in runs[old]:
            added = stats.paired_difference(runs[new][phase], runs[old][phase])
            before = sorted(runs[old][phase])[(len(runs[old][phase]) - 1) // 2]
            bar = bars.get(phase) if judged else None
            out.append({**labels, "phase": phase, "new": new, "old": old, "bar": bar, "old_s": before,
                        "added": added.value, "lo": added.lo, "hi": added.hi, "rounds": added.rounds,
                        "verdict": stats.verdict(added, bar=bar) if bar is not None else None})
    return out


def table(all_rows: list[dict[str, Any]], *, labels: tuple[str, ...] = ("protocol",)) -> str:
    """A markdown table of :func:`rows`, with the ``labels`` columns first."""
    lines = ["| " + " | ".join(labels) + " | phase | arm - base | base (median) | added | bar | within |",
             "|---" * (len(labels) + 6) + "|"]
    for row in all_rows:
        bar = f"≤ +{row['bar']:.1f} s" if row["bar"] is not None else "—"
        word = {"no": "**no**", None: "—"}.get(row["verdict"], row["verdict"])
        lines.append("| " + " | ".join(str(row[label]) for label in labels) + f" | {row['phase']} | "
                     f"{row['new']} - {row['old']} | {row['old_s']:.2f} s | "
                     f"{row['added']:+.3f} s [{row['lo']:+.3f}, {row['hi']:+.3f}] | {bar} | {word} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--protocols", default=",".join(PROTOCOLS))
    parser.add_argument("--old", help="a git revision: its otel_graph against this tree's, both instrumented")
    parser.add_argument("--uv", help="with --old: the uv that builds its venv")
    parser.add_argument("--python", help="with --old: the interpreter its venv is made with")
    parser.add_argument("--out", type=Path, default=HERE / "out")
    args = parser.parse_args()
    if args.rounds < 2:
        parser.error("--rounds must be at least 2")
    arms: list[Arm] = [(way, sys.executable, way) for way in ("plain", "sdk", "otel_graph")]
    comparisons = COMPARISONS
    if args.old:
        if not (args.uv and args.python):
            parser.error("--old needs --uv and --python (make bench-lifecycle OLD=... passes them)")
        from ab import old_tree

        # As bench-ab takes them: a relative path would miss from the worktree uv runs in.
        uv, python = (str(Path(p).absolute()) if os.sep in p else p for p in (args.uv, args.python))
        old_python = old_tree(args.old, uv=uv, python=python, trees=args.out.absolute() / "trees")
        arms = [("old", str(old_python), "otel_graph"), ("new", sys.executable, "otel_graph")]
        comparisons = (("new", "old", False),)
    for python in {python for _, python, way in arms if way == "otel_graph"}:
        compile_tree(python)
    all_rows = []
    for protocol in args.protocols.split(","):
        all_rows.extend(rows(trial(protocol, arms, rounds=args.rounds), comparisons, bars=BARS, protocol=protocol))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "lifecycle.json").write_text(json.dumps(all_rows, indent=2))
    print(table(all_rows))


if __name__ == "__main__":
    main()
