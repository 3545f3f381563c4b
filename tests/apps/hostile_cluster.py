"""The hostile input of ``hostile.py``, on a LocalCluster with worker processes (tests/test_hostile.py).

On dask.distributed a task's key, result and exception travel between processes, and
a worker builds the spans: other code than the local schedulers'. Every compute here is
one that distributed itself accepts: it refuses bytes keys, strings with lone
surrogates cannot cross its comms, and a result whose size passes int64 hangs its
worker (msgpack cannot send the size); run with ``--plain`` it is not instrumented, so the
test can compare the RESULT lines. Also: a storm of 200 failed tasks with long stack
traces in one compute, each failure reaching the client as distributed's own error.
"""

from __future__ import annotations

import sys

import cloudpickle
from distributed import Client, LocalCluster, wait

import hostile  # its task functions, shipped to the workers by value
from hostile import Raises, Weird, boom, deep_fail, total, user_span_with_a_bad_name

cloudpickle.register_pickle_by_value(hostile)


def main(*, plain: bool) -> None:
    import otel_graph

    handle = None if plain else otel_graph.instrument_scheduler()
    deep: object = "deep"
    for level in range(40):
        deep = (deep, level)
    graph = {
        ("ключ-🔑", 1): (len, "abc"),  # distributed takes str, int, float and tuples of them
        7: (Weird,),
        "raises": (Raises,),
        "k" * 1_000_000: (len, "x"),
        deep: (len, "deep"),
        "user": (user_span_with_a_bad_name,),
    }
    with LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        results = client.get(graph, list(graph))
        wide = {**{("part", i): (int, i) for i in range(10_000)},
                "wide": (total, *[("part", i) for i in range(10_000)])}
        print("RESULT", results[0], type(results[1]).__name__, type(results[2]).__name__, results[4],
              client.get(wide, "wide"), flush=True)
        try:
            client.get({"fail-1": (boom, 1)}, "fail-1")
        except ValueError as exc:
            print("RAISED", type(exc).__name__, len(str(exc)) > 1_000_000, flush=True)
        futures = client.map(deep_fail, range(200), key=[f"storm-{i}" for i in range(200)])
        wait(futures)
        print("STORM", sum(f.status == "error" for f in futures), flush=True)
        del futures
        if handle is not None:
            print("FLUSHED", handle.flush(timeout_s=60), handle.stats(workers=True), flush=True)


if __name__ == "__main__":
    main(plain="--plain" in sys.argv[1:])
