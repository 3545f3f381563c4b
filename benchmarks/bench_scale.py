"""Does otel_graph hold at scale? Accounting, metric completeness, span budget, memory, leaks.

Every run is a fresh child process, so its peak RSS (``VmHWM``, what ``ru_maxrss`` reads) is its own; each
exports over OTLP/gRPC (``--protocol http/protobuf``: over HTTP) to one receiver
(``tests/otlp_receiver.py``) in another process, which is cleared before a run and
summarised after the child has exited (by then its exit hook has delivered the last
metric points). Workloads:

* ``sync-1m``: a tree reduction with ``--tasks`` leaves (fan-in 10, so 1.11x as many
  tasks) as a raw graph dict, on the sync scheduler, without and with otel_graph
  (default span budget, time includes ``flush()``). Bars: peak RSS <= 1.15x, wall
  <= 1.25x (the core bar of 100k no-op sync tasks).
* ``distributed-100k``: the same tree with ``--tasks / 10`` leaves on a LocalCluster of 2
  worker processes x 2 threads. Peak RSS is the client process (which hosts the
  scheduler) and, separately, the sum of every worker and nanny process's peak (VmHWM).
* ``loop-sync`` / ``loop-threads``: ``--tasks / 100`` computes of 5 tasks each (keys
  tokenized per compute, as collections make them); RSS and thread counts at a tenth of
  the loop, halfway and at its end (memory that levels off shows in the second half), and
  otel_graph's per-compute tables after it.

For each instrumented run the receiver checks, per ``dask.compute`` root: task spans +
sum of ``dask.task.count`` on aggregate spans == ``dask.graph.tasks`` == the graph's
size; task spans within the budget; and the last cumulative ``dask.task.duration``
count == the tasks run. Usage::

    python benchmarks/bench_scale.py [--tasks 1000000] [--repeat 1] [--only loop]

Results go to ``benchmarks/results/scale-<time>.json``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from statistics import median
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT / "tests")]

from children import LineProcess  # noqa: E402

BUDGET = 1000  # OTEL_GRAPH_MAX_TASK_SPANS' default, left unset in the children


class ScaleReceiver(LineProcess):
    """The receiver process, answering ``clear`` and ``summary`` (this file's ``--receiver``)."""

    def __init__(self) -> None:
        super().__init__([sys.executable, __file__, "--receiver"])
        grpc, http = self.first.split()
        self.endpoints = {"grpc": grpc, "http/protobuf": http}


def serve_receiver() -> None:
    from otlp_receiver import OtlpReceiver

    with OtlpReceiver() as receiver:
        print(receiver.grpc_endpoint, receiver.http_endpoint, flush=True)
        for line in sys.stdin:
            command = line.strip()
            if command == "clear":
                receiver.clear()
                print("ok", flush=True)
            elif command == "summary":
                print(json.dumps(summarize(receiver.spans(), receiver.metrics())), flush=True)
            else:
                break


def summarize(spans: list[dict], points: list[dict]) -> dict[str, Any]:
    """Span accounting per compute, and the last cumulative task count per histogram series."""
    roots = {s["span_id"]: s for s in spans if s["name"] == "dask.compute"}
    task_spans, aggregated, aggregates = Counter(), Counter(), Counter()
    for span in spans:
        parent = span["parent_span_id"]
        if parent not in roots or "dask.task.prefix" not in span["attributes"]:
            continue  # progress spans are the root's children too
        if span["attributes"].get("dask.task.aggregate"):
            aggregates[parent] += 1
            aggregated[parent] += span["attributes"]["dask.task.count"]
        else:
            task_spans[parent] += 1
    computes = [{"graph_tasks": root["attributes"].get("dask.graph.tasks"), "task_spans": task_spans[sid],
                 "aggregate_spans": aggregates[sid], "aggregated_tasks": aggregated[sid]}
                for sid, root in roots.items()]
    # A histogram series is (process, attributes); cumulative points grow, so the latest counts all.
    latest: dict[tuple, dict] = {}
    for point in points:
        if point["name"] != "dask.task.duration":
            continue
        series = (point["resource"].get("service.instance.id"), tuple(sorted(point["attributes"].items())))
        if point["temporality"] == 1:  # delta: every point adds up
            series += (point["time_ns"],)
        if series not in latest or point["time_ns"] >= latest[series]["time_ns"]:
            latest[series] = point
    by_prefix: Counter = Counter()
    for point in latest.values():
        by_prefix[point["attributes"].get("dask.task.prefix", "")] += point["count"]
    biggest = max(computes, key=lambda c: c["graph_tasks"] or 0, default=None)
    return {
        "computes": len(computes), "biggest": biggest,
        "accounting_mismatches": sum(c["task_spans"] + c["aggregated_tasks"] != c["graph_tasks"] for c in computes),
        "max_task_spans": max((c["task_spans"] for c in computes), default=0),
        "max_spans_per_trace": max((c["task_spans"] + c["aggregate_spans"] + 1 for c in computes), default=0),
        "histogram_count_by_prefix": dict(by_prefix),
    }


# -- the children ---------------------------------------------------------------------------
def tree(leaves: int, name: str = "leaf", sums: str = "sum") -> tuple[dict, Any]:
    """A sum over ``leaves`` ones, fan-in 10: builtins only, so workers unpickle nothing of ours."""
    graph: dict = {(name, i): (int, 1) for i in range(leaves)}
    level, width = [(name, i) for i in range(leaves)], 0
    while len(level) > 1:
        width += 1
        nxt = [(f"{sums}-l{width}", j) for j in range((len(level) + 9) // 10)]  # prefix: sums
        for j, key in enumerate(nxt):
            graph[key] = (sum, level[j * 10:(j + 1) * 10])
        level = nxt
    return graph, level[0]


def instrument(on: bool) -> Any:
    if not on:
        return None
    import otel_graph

    return otel_graph.instrument_scheduler()


def finish(handle: Any, row: dict, started: float) -> dict:
    """Flush (timed: the telemetry is part of the cost) and note the handle's counters."""
    if handle is not None:
        row["flushed"] = handle.flush(timeout_s=600)
        row["stats"] = handle.stats()
    row["wall_s"] = time.perf_counter() - started
    return row


def child_sync(leaves: int, on: bool) -> dict:
    import dask

    graph, root = tree(leaves)
    handle = instrument(on)
    row = {"tasks": len(graph), "rss_before_mb": rss_mb()}
    started = time.perf_counter()
    assert dask.get(graph, root) == leaves
    return {**finish(handle, row, started), "peak_rss_mb": rss_mb(field="VmHWM")}


def child_distributed(leaves: int, on: bool) -> dict:
    import psutil
    from distributed import Client, LocalCluster

    handle = instrument(on)  # before any Client: the documented way, plugins go on at connect
    graph, root = tree(leaves)
    warm, warm_root = tree(20, "warm", "warmsum")
    with LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        client.get(warm, warm_root)  # imports and connections on every worker, untimed
        if handle is not None:
            handle.flush(timeout_s=60)
        row = {"tasks": len(graph)}
        started = time.perf_counter()
        assert client.get(graph, root) == leaves
        row = finish(handle, row, started)
        workers = psutil.Process().children(recursive=True)
        row["workers_peak_rss_mb"] = sum(rss_mb(p.pid, "VmHWM") for p in workers)  # nannies too
        # Mapped library pages, shared between the workers in physical memory (gRPC's are ~8 MB).
        row["workers_rss_file_mb"] = sum(rss_mb(p.pid, "RssFile") for p in workers)
    row["peak_rss_mb"] = rss_mb(field="VmHWM")
    return row


def child_loop(computes: int, on: bool, scheduler: str) -> dict:
    from operator import add

    import dask.local
    import dask.threaded
    import psutil

    get = dask.threaded.get if scheduler == "threads" else dask.local.get_sync
    handle = instrument(on)
    me, samples = psutil.Process(), {}
    started = time.perf_counter()
    for i in range(1, computes + 1):
        token = uuid.uuid4().hex
        graph = {(f"load-{token}", j): (int, j) for j in range(3)}
        graph[f"add-{token}"] = (sum, list(graph))
        graph[f"final-{token}"] = (add, f"add-{token}", 1)
        assert get(graph, f"final-{token}") == 4
        if i in (computes // 10, computes // 2, computes):  # a level second half: no growth
            gc.collect()
            samples[i] = {"rss_mb": rss_mb(), "threads": threading.active_count(), "os_threads": me.num_threads(),
                          "computes not yet settled": len(handle._tracker._records) if handle else 0}
    row = finish(handle, {"tasks": 5 * computes, "samples": samples}, started)
    row["tables"] = tables(handle) if handle is not None else {}
    row["peak_rss_mb"] = rss_mb(field="VmHWM")
    return row


def tables(handle: Any) -> dict[str, Any]:
    """otel_graph's state that could grow per compute, read through private names (best effort)."""
    from dask.utils import key_split

    from otel_graph.telemetry import attributes
    from otel_graph.telemetry.compute_record import ComputeRecord

    tracker, owned, out = handle._tracker, handle._owned, {}

    def records() -> int:
        gc.collect()  # a record and its SpanPlan's callbacks form a cycle: only gc frees them
        return sum(type(o) is ComputeRecord for o in gc.get_objects())

    probes = {
        "tracker._records": lambda: len(tracker._records),
        "ComputeRecord alive": records,
        "ComputeRecord alive after one more flush": lambda: handle.flush(timeout_s=60) and records(),
        "metric attribute sets": lambda: len(tracker._metrics._attributes) + len(tracker._metrics._by_prefix),
        "histogram series": lambda: sum(len(h.series) for h in owned.histograms._histograms),
        "span processor queue": lambda: len(owned.span_processor._queue),
        "dask key_split cache": lambda: key_split.cache_info().currsize,
        "key_text cache": lambda: attributes._rendered.cache_info().currsize,
    }
    for name, probe in probes.items():
        try:
            out[name] = probe()
        except Exception as exc:  # other people are editing these internals: report, do not fail
            out[name] = f"unreadable: {type(exc).__name__}"
    return out


def rss_mb(pid: int | None = None, field: str = "VmRSS") -> float:
    """Current (VmRSS) or peak (VmHWM) RSS of a process; psutil has no peak for another process."""
    for line in Path(f"/proc/{pid or 'self'}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


CHILDREN = {
    "sync-1m": lambda n, on: child_sync(n, on),
    "distributed-100k": lambda n, on: child_distributed(max(n // 10, 10), on),
    "loop-sync": lambda n, on: child_loop(max(n // 100, 10), on, "sync"),
    "loop-threads": lambda n, on: child_loop(max(n // 100, 10), on, "threads"),
}


# -- the parent -----------------------------------------------------------------------------
def run_child(name: str, tasks: int, on: bool, receiver: ScaleReceiver, protocol: str) -> dict:
    receiver.ask("clear")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoints[protocol], OTEL_EXPORTER_OTLP_PROTOCOL=protocol,
               OTEL_SERVICE_NAME="bench-scale", PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, __file__, "--child", name, "--tasks", str(tasks)]
                          + (["--instrumented"] if on else []),
                          env=env, stdout=subprocess.PIPE, text=True, check=True)
    row = json.loads(done.stdout.strip().splitlines()[-1])
    if on:
        row["received"] = json.loads(receiver.ask("summary"))
    return row


def verdict(plain: list[dict], inst: list[dict]) -> dict[str, Any]:
    """Medians of the runs, and the checks on what the receiver got from the last instrumented one."""
    last, got = inst[-1], inst[-1]["received"]
    tasks, big, loop = last["tasks"], got["biggest"] or {}, "samples" in last
    counted = big.get("task_spans", 0) + big.get("aggregated_tasks", 0)
    out: dict[str, Any] = {"tasks": tasks, "flushed": all(r.get("flushed") for r in inst), "stats": last["stats"]}
    for key in ("wall_s", "peak_rss_mb", "rss_before_mb", "workers_peak_rss_mb", "workers_rss_file_mb"):
        if key in last:
            out[key] = (median(r[key] for r in plain), median(r[key] for r in inst))
    out["wall_ratio"] = out["wall_s"][1] / out["wall_s"][0]
    out["wall_s_each"] = ([round(r["wall_s"], 2) for r in plain], [round(r["wall_s"], 2) for r in inst])
    out["rss_ratio"] = out["peak_rss_mb"][1] / out["peak_rss_mb"][0]
    if "workers_peak_rss_mb" in out:
        out["workers_rss_ratio"] = out["workers_peak_rss_mb"][1] / out["workers_peak_rss_mb"][0]
    out["accounting"] = (f"largest compute: {big.get('task_spans')} task spans + {big.get('aggregated_tasks')} "
                         f"aggregated = {counted}, dask.graph.tasks {big.get('graph_tasks')}, graph "
                         f"{5 if loop else tasks}; {got['computes']} computes, {got['accounting_mismatches']} off")
    out["accounting_ok"] = got["accounting_mismatches"] == 0 and (
        got["computes"] == tasks // 5 if loop else counted == big.get("graph_tasks") == tasks)
    by_prefix = got["histogram_count_by_prefix"]
    out["histogram_count"] = sum(v for k, v in by_prefix.items() if not k.startswith("warm"))
    out["metrics_ok"] = out["histogram_count"] == tasks
    out["max_task_spans"], out["max_spans_per_trace"] = got["max_task_spans"], got["max_spans_per_trace"]
    out["budget_ok"] = got["max_task_spans"] <= BUDGET
    if loop:
        out["samples"] = {"plain": plain[-1]["samples"], "otel": last["samples"]}
        out["tables"] = last["tables"]
        out["overhead_per_compute_ms"] = (out["wall_s"][1] - out["wall_s"][0]) / (tasks // 5) * 1000
    return out


def print_table(results: dict[str, dict]) -> None:
    print(f"{'workload':<17}{'tasks':>9}{'wall plain/otel s':>19}{'ratio':>7}{'peak RSS MB':>13}{'ratio':>7}"
          "  accounting / metrics (histogram count) / budget (max task spans)")
    for name, r in results.items():
        ok = {True: "ok", False: "FAIL"}
        wall, rss = "{:.2f}/{:.2f}".format(*r["wall_s"]), "{:.0f}/{:.0f}".format(*r["peak_rss_mb"])
        print(f"{name:<17}{r['tasks']:>9}{wall:>19}{r['wall_ratio']:>7.3f}{rss:>13}{r['rss_ratio']:>7.3f}  "
              f"{ok[r['accounting_ok']]} / {ok[r['metrics_ok']]} ({r['histogram_count']}) / "
              f"{ok[r['budget_ok']]} ({r['max_task_spans']})")
        for key in ("wall_s_each", "accounting", "rss_before_mb", "workers_peak_rss_mb", "workers_rss_ratio",
                    "workers_rss_file_mb", "overhead_per_compute_ms", "samples", "tables", "stats"):
            if key in r:
                print(f"    {key}: {r[key]}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=1_000_000, help="leaves of sync-1m; the others scale")
    parser.add_argument("--repeat", type=int, default=1, help="child pairs per workload, alternating")
    parser.add_argument("--only", help="run only the workloads whose name contains this")
    parser.add_argument("--protocol", choices=("grpc", "http/protobuf"), default="grpc",
                        help="OTEL_EXPORTER_OTLP_PROTOCOL of the children")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--instrumented", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--receiver", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.receiver:
        return serve_receiver()
    if args.child:
        return print(json.dumps(CHILDREN[args.child](args.tasks, args.instrumented)))

    receiver, results = ScaleReceiver(), {}
    try:
        for name in [n for n in CHILDREN if not args.only or args.only in n]:
            runs: dict[bool, list[dict]] = {False: [], True: []}
            for _ in range(args.repeat):
                for on in (False, True):
                    runs[on].append(run_child(name, args.tasks, on, receiver, args.protocol))
            results[name] = verdict(runs[False], runs[True])
            print(f"-- {name}: {json.dumps(results[name])}", file=sys.stderr, flush=True)
    finally:
        receiver.close()
    print_table(results)
    out = HERE / "results" / time.strftime("scale-%Y%m%d-%H%M%S.json")
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "results": results}, indent=2))
    print(f"written {out}")


if __name__ == "__main__":
    main()
