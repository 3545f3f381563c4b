"""The user's script :mod:`lifecycle` times: a short dask.distributed job, start to exit.

``python lifecycle_app.py plain|otel_graph``: imports dask and distributed (with ``otel_graph``,
also otel_graph, calling ``instrument_scheduler()``), starts a ``LocalCluster`` of 2 worker
processes with 1 thread each and a ``Client``, computes one ``submit``, closes client and
cluster, and prints the ``time.monotonic()`` reading after each phase as one JSON line
(``MARKS {...}``). It imports nothing else, so that its imports are the user's.
"""

from __future__ import annotations

import json
import sys
import time


def main(way: str) -> None:
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


if __name__ == "__main__":
    main(sys.argv[1])
