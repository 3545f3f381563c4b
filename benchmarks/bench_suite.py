"""What otel_graph costs a peer's test suite: part of dask's own tests, plain and instrumented.

The test modules shipped in the dask wheel for the local schedulers, delayed, base, order,
tracebacks, bag and array core, run by pytest plain and with otel_graph instrumenting
every test's schedulers (``tests/peer/otel_graph_peer.py``, which calls
``instrument_scheduler()`` at start-up as a user would), exporting over OTLP/gRPC to a
receiver in another process. Each run is a pytest process of its own, alternating plain
and instrumented; the ratio is over those pairs of runs, with its 95% interval
(:mod:`stats`). A run of about a minute and a half each way makes this slow to resolve: a
few percent takes many runs. It fails if any test fails either way. Bar: <= 1.10x.

Usage::

    python benchmarks/bench_suite.py [--repeat 3] [--json rows.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import stats  # noqa: E402
from children import Receiver  # noqa: E402

BAR = 1.10
#: The dask test modules: the local schedulers, delayed, bag, array core.
DASK_SUITE = ("dask.tests.test_local", "dask.tests.test_threaded", "dask.tests.test_multiprocessing",
              "dask.tests.test_delayed", "dask.tests.test_base", "dask.tests.test_order", "dask.tests.test_traceback",
              "dask.bag.tests.test_bag", "dask.array.tests.test_array_core")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3, help="runs of the suite, each way")
    parser.add_argument("--json", help="write the row here")
    args = parser.parse_args()
    if args.repeat < 2:
        parser.error(f"--repeat {args.repeat}: an interval needs at least 2 rounds")
    receiver = Receiver()
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    # test_binary_operator_delegation needs pytest-mock, which otel_graph's test set does not install;
    # test_interrupt raises KeyboardInterrupt in the main thread from a timer, and a signal that lands
    # outside the scheduler's wait can leave plain Dask waiting forever.
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               "-k", "not test_binary_operator_delegation and not test_interrupt", "--pyargs", *DASK_SUITE]
    stats_file = Path(tempfile.mkdtemp(prefix="otel-graph-bench-suite-")) / "stats"
    traced_env = {**base_env, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests" / "peer"), str(ROOT)]),
                  "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                  "OTEL_SERVICE_NAME": "otel-graph-bench-dask-suite", "OTEL_GRAPH_PEER_STATS": str(stats_file)}
    plain: list[float] = []
    traced: list[float] = []
    try:
        for round_ in range(args.repeat):
            ways = [(base_env, [], plain), (traced_env, ["-p", "otel_graph_peer"], traced)]
            for env, extra, out in ways[::-1] if round_ % 2 else ways:  # each way first in turn
                start = time.perf_counter()
                run = subprocess.run(command + extra, env=env, capture_output=True, text=True,
                                     cwd=tempfile.gettempdir())
                out.append(time.perf_counter() - start)
                if run.returncode != 0:
                    raise SystemExit(f"dask-suite failed{' instrumented' if extra else ''}:\n{run.stdout[-3000:]}")
                print(f"dask-suite {'instrumented' if extra else 'plain'}: {out[-1]:.0f} s", file=sys.stderr)
    finally:
        receiver.close()
    summary = run.stdout.strip().splitlines()[-1]
    delivery = json.loads(stats_file.read_text())
    ratio = stats.paired(traced, plain)
    row = {"workload": "dask-suite", "bar": BAR, "ratio": ratio.ratio, "lo": ratio.lo, "hi": ratio.hi,
           "rounds": ratio.rounds, "verdict": stats.verdict(ratio, bar=BAR),
           "detail": (f"{statistics.median(plain):.0f} s plain, {statistics.median(traced):.0f} s instrumented "
                      f"({summary}; {delivery['spans_exported']:,} spans exported, "
                      f"{delivery['spans_undelivered']} undelivered, a run)")}
    print(f"dask-suite  {ratio.ratio:.3f}× [{ratio.lo:.3f}, {ratio.hi:.3f}]  {row['verdict']}  {row['detail']}")
    if args.json:
        Path(args.json).write_text(json.dumps([row], indent=2))


if __name__ == "__main__":
    main()
