"""Names a person reads in the report: processes, worker threads, prefixes' colours, sizes and times.

Telemetry says where a task ran in identifiers (a thread ident such as ``140488749348544``,
a worker's ``tcp://`` address, a process's instance UUID); the report shows names:

* a **process** is its dask.distributed worker (``worker 0 (127.0.0.1:35689)``), else its
  pid (``pid 4242``, a processes-scheduler worker or the process that computed), with its
  host where the data comes from more than one;
* a **lane** is a thread of a process, numbered 0, 1, … in the order they first ran a task
  (``worker 0 (127.0.0.1:35689) · thread 1``);
* a **prefix** keeps one colour in every plot and table of a page (:class:`Palette`): the
  prefixes that took the most time get the most distinct colours; red is kept for failures
  and black for the critical path;
* times and sizes are written for people: ``12.3 ms``, ``16.8 MB``.

>>> Labeller([]).process({"dask.worker.id": "tcp://10.0.0.1:8786", "dask.worker.name": "0"}, {})
'worker 0 (10.0.0.1:8786)'
>>> Labeller([]).process({"dask.worker.id": "140488749348544", "thread.id": 140488749348544},
...                      {"process.pid": 4242})
'pid 4242'
>>> seconds(0.0123), size(16_800_056)
('12.3 ms', '16.8 MB')
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from otel_graph.naming import PREFIX_COLOURS

#: Failed tasks' bars, whatever their prefix.
FAILED = "#d62728"
#: The critical path's outline and its own track.
CRITICAL = "#000000"
#: The prefixes' colours, the first ten the strongest (shared with the NVTX ranges).
COLOURS = PREFIX_COLOURS


class Palette:
    """A colour per task prefix, the same in every plot and table of one page.

    Prefixes are given most time first; past the 18 colours they repeat.
    """

    def __init__(self, prefixes: Iterable[str]) -> None:
        self._colours: dict[str, str] = {}
        for prefix in prefixes:
            self._colours.setdefault(prefix, COLOURS[len(self._colours) % len(COLOURS)])
        self._ranks = {prefix: rank for rank, prefix in enumerate(self._colours)}

    def __getitem__(self, prefix: str) -> str:
        return self._colours.get(prefix, COLOURS[6])

    def as_dict(self) -> dict[str, str]:
        return dict(self._colours)

    def rank(self, prefix: str) -> int:
        """The prefix's place in the order given (most time first); unknown ones last."""
        return self._ranks.get(prefix, len(self._ranks))


def _address(text: str) -> str:
    return text.split("://", 1)[-1]


class Labeller:
    """Process and lane names for the spans and points of one report."""

    def __init__(self, resources: Iterable[Mapping[str, Any]]) -> None:
        hosts = {str(r.get("host.name")) for r in resources if r.get("host.name")}
        #: Whether names say their host: the data comes from more than one.
        self.with_host = len(hosts) > 1
        self._threads: dict[str, dict[Any, int]] = {}
        self._gpus: dict[str, dict[str, int]] = {}

    def process(self, attributes: Mapping[str, Any], resource: Mapping[str, Any]) -> str:
        """Who ran a task (from its span's attributes) or sent a reading (from its resource)."""
        name = attributes.get("dask.worker.name", resource.get("dask.worker.name"))
        worker = str(attributes.get("dask.worker.id", resource.get("dask.worker.id", "")))
        if name is not None or worker.startswith(("tcp://", "tls://", "inproc://", "ucx://", "ws://", "wss://")):
            # A worker started without --name is named by its address: say it once.
            named = name is not None and _address(str(name)) != _address(worker)
            label = f"worker {name}" if named else f"worker {_address(worker)}" if worker else f"worker {name}"
            if named and worker:
                label += f" ({_address(worker)})"
            return self._on_host(label, resource)
        thread = attributes.get("thread.id")
        if worker and thread is not None and worker != str(thread):  # the processes scheduler: a pool's pid
            label = f"pid {worker}"
        else:
            label = f"pid {resource.get('process.pid', '?')}"
        return self._on_host(label, resource)

    def _on_host(self, label: str, resource: Mapping[str, Any]) -> str:
        if self.with_host and resource.get("host.name"):
            label += f" on {resource['host.name']}"
        return label

    def gpu(self, attributes: Mapping[str, Any], resource: Mapping[str, Any]) -> str:
        """``GPU 0 (NVIDIA A100)``: numbered per host in the order first seen, never by its UUID."""
        host = str(resource.get("host.name", ""))
        numbers = self._gpus.setdefault(host, {})
        number = numbers.setdefault(str(attributes.get("hw.id", "")), len(numbers))
        name = attributes.get("hw.name")
        label = f"GPU {number}" + (f" ({name})" if name else "")
        return label + (f" on {host}" if self.with_host and host else "")

    def lane(self, attributes: Mapping[str, Any], resource: Mapping[str, Any]) -> str:
        """A task's lane: its process and that process's thread number, counted as first seen.

        Give spans in start order, so that thread 0 is the one that ran first.
        """
        process = self.process(attributes, resource)
        thread = attributes.get("thread.id", attributes.get("dask.worker.id"))
        if thread == 0 and process.startswith("worker"):  # a worker that did not know the thread says 0
            return f"{process} · thread ?"
        threads = self._threads.setdefault(process, {})
        number = threads.setdefault(thread, len(threads))
        return f"{process} · thread {number}"


def seconds(value: float) -> str:
    """``12.3 ms``, ``2.31 s``, ``850 µs``."""
    if value < 0:
        return "-" + seconds(-value)
    if value >= 100:
        return f"{value:.0f} s"
    if value >= 1:
        return f"{value:.2f} s"
    if value >= 1e-3:
        return f"{value * 1e3:.1f} ms"
    return f"{value * 1e6:.0f} µs"


def size(value: float) -> str:
    """``16.8 MB``, ``512 B``: decimal units, as the text report and the plots' axes write them."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(value) < 1000 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"
