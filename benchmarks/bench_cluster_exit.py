"""How long a dask.distributed script takes to end after its last compute, with a faulty collector.

On a cluster the exit is several in a row: each worker's teardown delivers what it
recorded, then the worker process exits (delivering what is left), then the client's
process does. With the collector down or hung, each of these once waited out
``OTEL_GRAPH_EXIT_TIMEOUT`` (1 s) in turn. The bar (issue 6): every process exits within
2 s of its last compute.

The user's script is ``tests/apps/cluster.py`` (a LocalCluster of 2 worker processes,
one small compute, then ``with`` blocks closing client and cluster), configured by
``OTEL_*`` variables, run once per scenario and protocol per round: ``plain``
(``OTEL_SDK_DISABLED=true``), ``healthy``, ``down`` (nothing listens: refused) and
``hung`` (the receiver accepts and never answers). The figure is the time from the
script printing its RESULT to the process ending, as the parent sees it.

Usage::

    python benchmarks/bench_cluster_exit.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from conftest import subprocess_env  # noqa: E402
from otlp_receiver import OtlpReceiver  # noqa: E402

APP = ROOT / "tests" / "apps" / "cluster.py"
SCENARIOS = ("plain", "healthy", "down", "hung")
PROTOCOLS = ("grpc", "http/protobuf")


def run(scenario: str, protocol: str) -> tuple[float, str]:
    """Seconds from RESULT to exit, and the RESULT line."""
    with OtlpReceiver(hang=scenario == "hung") as receiver:
        endpoint = receiver.grpc_endpoint if protocol == "grpc" else receiver.http_endpoint
        if scenario == "down":
            receiver.stop()
        env = subprocess_env(OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_EXPORTER_OTLP_PROTOCOL=protocol,
                             OTEL_GRAPH_RESOURCES="false")
        if scenario == "plain":
            env["OTEL_SDK_DISABLED"] = "true"
        proc = subprocess.Popen([sys.executable, str(APP)], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True)
        result_at, result = float("nan"), ""
        for line in proc.stdout:
            if line.startswith("RESULT"):
                result_at, result = time.monotonic(), line.strip()
        proc.wait()
        return time.monotonic() - result_at, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.repeat):
        for protocol in PROTOCOLS:
            for scenario in SCENARIOS:
                took, result = run(scenario, protocol)
                assert result == "RESULT 210", (scenario, protocol, result)
                times.setdefault((scenario, protocol), []).append(took)
    print(f"bench_cluster_exit, {time.strftime('%Y-%m-%d %H:%M %Z')}: RESULT to exit, s "
          f"(median / max of {args.repeat}); bar 2 s")
    for (scenario, protocol), each in times.items():
        print(f"{protocol:<14}{scenario:<9}{statistics.median(each):6.2f} /{max(each):5.2f}")


if __name__ == "__main__":
    main()
