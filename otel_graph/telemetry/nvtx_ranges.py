"""NVTX ranges, so NVIDIA Nsight Systems shows Dask's tasks and computes on its timeline.

With ``OTEL_GRAPH_NVTX=true`` (or ``instrument_scheduler(nvtx=True)``) each task runs inside
an NVTX range of the ``dask`` domain, pushed and popped in the thread that runs it: the
caller's (sync), a pool's thread or process, a dask.distributed worker's thread (an
``async def`` task gets a start/end range, as its awaits interleave with other tasks on the
event loop). Each compute is a start/end range too, since a distributed compute may end on
another thread than it began on. Nsight Systems draws them above the CUDA kernels the task
launched, and its NVTX reports (``nsys stats --report nvtx_sum``, the GPU projection) add up
time per range name.

What a range says:

* its message is the task's prefix (``inc``, ``rechunk-merge``), as the task's span is named.
  Nsight sums per message, so this gives time per prefix; a message per key would give 10^5
  rows of one instance each. Past :data:`MAX_PREFIXES` prefixes a process names the rest
  ``(other prefixes)``, as the task metrics do;
* the task's key rides on an NVTX mark just inside the range's start (Nsight shows it on
  hovering; a report matches it to its range by thread and time), so one task can be matched
  in Nsight and in Jaeger by its key (``dask.task.key``). Not the range's payload: a payload is
  a number, or with numpy a typed blob that tools show as bytes. The mark's message is a
  string registered for it alone (the binding's own cache of registered strings would keep
  every key here); the tool keeps it, as it keeps every message it records;
* its colour is the prefix's, picked from :data:`otel_graph.naming.PREFIX_COLOURS` by a hash
  of the prefix that is the same in every process and run;
* its category is ``task``. A compute's range is named ``dask.compute``, in category
  ``compute``, with a mark naming its trace (``trace_id=4bf92f35...``): Jaeger finds the trace
  by that id.

The binding is the ``nvtx`` package (the ``gpu`` extra; 0.2.14 or later), imported when first
asked for. NVTX costs next to nothing with no tool attached; here that costs nothing at all: a
tool attaches at the process's start (Nsight sets ``NVTX_INJECTION64_PATH``), and when the
``dask`` domain says none listens, :func:`process_ranges` returns None and nothing is wrapped.

Nothing here raises into a task: a failing NVTX call is counted and said once in the log.
"""

from __future__ import annotations

import logging
import threading
import zlib
from typing import Any

from otel_graph.config import OTEL_GRAPH_NVTX
from otel_graph.errors import ConfigurationError
from otel_graph.naming import OTHER_PREFIXES, PREFIX_COLOURS, fold_prefix, key_to_str, task_prefix

logger = logging.getLogger("otel_graph")

#: The NVTX domain every range and mark is in.
DOMAIN = "dask"
#: Prefixes a process names its ranges by; past it, :data:`OTHER_PREFIXES`.
MAX_PREFIXES = 2000
#: What the compute's range is named, as its span is.
COMPUTE = "dask.compute"
#: How to install the binding, said by the error when it is missing.
INSTALL = "pip install 'otel-graph[gpu]'"

_LOCK = threading.Lock()
_DECIDED: list[Ranges | None] = []  # this process's answer, once asked


def process_ranges() -> Ranges | None:
    """This process's ranges; None when no NVTX tool is attached to it.

    Raises :class:`ConfigurationError` when the binding is not installed or is not one this
    module can use.
    """
    if _DECIDED:
        return _DECIDED[0]
    with _LOCK:
        if not _DECIDED:
            _DECIDED.append(_attached())
    return _DECIDED[0]


def _attached() -> Ranges | None:
    try:
        import nvtx
    except ImportError as exc:
        raise ConfigurationError(
            f"{OTEL_GRAPH_NVTX}=true (or instrument_scheduler(nvtx=True)) needs the nvtx package, "
            f"which the gpu extra installs: {INSTALL} ({exc})") from None
    try:
        domain = nvtx.get_domain(DOMAIN)
        # The binding hands out a stand-in domain whose calls do nothing when no tool listens.
        if not isinstance(domain, nvtx.Domain):
            logger.debug("otel_graph: no NVTX tool is attached to this process; no ranges are made")
            return None
        return Ranges(domain)
    except Exception as exc:  # a binding older than the one these calls were written for
        version = getattr(nvtx, "__version__", "unknown")
        raise ConfigurationError(
            f"{OTEL_GRAPH_NVTX}=true needs the nvtx package 0.2.14 or later (installed: {version}; {exc!r}): "
            f"{INSTALL}") from None


def colour(prefix: str) -> int:
    """The prefix's colour as NVTX's ARGB integer, the same in every process.

    >>> hex(colour("inc")) == hex(colour("inc")), hex(colour("inc"))[:4]
    (True, '0xff')
    """
    rgb = PREFIX_COLOURS[zlib.crc32(prefix.encode("utf-8", "backslashreplace")) % len(PREFIX_COLOURS)]
    return 0xFF000000 | int(rgb[1:], 16)


class Ranges:
    """The ``dask`` domain's ranges in one process; every method is safe from any thread."""

    def __init__(self, domain: Any) -> None:
        # Not the binding's public API: a string registered without its cache, for marks.
        from nvtx._lib import RegisteredString

        self._domain = domain
        self._handle = domain.handle
        self._string = RegisteredString
        self._task_category = domain.get_category_id("task")
        self._compute_category = domain.get_category_id("compute")
        self._compute = domain.get_event_attributes(message=COMPUTE, color=colour(COMPUTE),
                                                    category=self._compute_category)
        self._by_prefix: dict[str, Any] = {}
        self._named: set[str] = set()
        self._lock = threading.Lock()
        #: NVTX calls that raised (none is known to): counted, said once, never passed on.
        self.errors = 0

    # -- tasks -----------------------------------------------------------------------------

    def task_started(self, key: Any) -> bool:
        """Push the task's range in this thread, and mark its key at its start; True if pushed
        (then :meth:`task_ended` pops it)."""
        try:
            attributes = self._attributes(task_prefix(key))
            self._domain.push_range(attributes)
        except Exception:
            self._failed()
            return False
        self._mark(key_to_str(key), attributes)
        return True

    def task_ended(self) -> None:
        """Pop this thread's innermost ``dask`` range (the task's)."""
        try:
            self._domain.pop_range()
        except Exception:
            self._failed()

    def task_range_started(self, key: Any) -> int | None:
        """A start/end range for a task whose thread runs other tasks meanwhile (``async def``)."""
        try:
            attributes = self._attributes(task_prefix(key))
            range_id = int(self._domain.start_range(attributes))
        except Exception:
            self._failed()
            return None
        self._mark(key_to_str(key), attributes)
        return range_id

    # -- computes --------------------------------------------------------------------------

    def compute_started(self, trace_id: int) -> int | None:
        """Start a compute's range, marked with its trace id; its id, for :meth:`range_ended`."""
        try:
            range_id = int(self._domain.start_range(self._compute))
        except Exception:
            self._failed()
            return None
        if trace_id:
            self._mark(f"trace_id={trace_id:032x}", self._compute)
        return range_id

    def range_ended(self, range_id: int | None) -> None:
        if range_id is None:
            return
        try:
            self._domain.end_range(range_id)
        except Exception:
            self._failed()

    # -- inside ----------------------------------------------------------------------------

    def _attributes(self, prefix: str) -> Any:
        attributes = self._by_prefix.get(prefix)
        if attributes is None:
            # Past the limit a prefix is folded under the lock at every task: kept, the
            # unnamed prefixes (a key without '-' is its own) would grow the dict without end.
            with self._lock:
                name = fold_prefix(prefix, self._named, limit=MAX_PREFIXES)
                attributes = self._by_prefix.get(name)
                if attributes is None:
                    attributes = self._domain.get_event_attributes(message=name, color=colour(name),
                                                                   category=self._task_category)
                    self._by_prefix[name] = attributes
                if name != OTHER_PREFIXES:
                    self._by_prefix[prefix] = attributes
        return attributes

    def _mark(self, text: str, like: Any) -> None:
        try:
            # A string registered for this mark alone: the binding's own cache would keep every key.
            attributes = self._domain.get_event_attributes(color=like.color, category=like.category)
            attributes.message = self._string(self._handle, text)
            self._domain.mark(attributes)
        except Exception:
            self._failed()

    def _failed(self) -> None:
        self.errors += 1
        if self.errors == 1:
            logger.warning("otel_graph: an NVTX call failed; the ranges may be incomplete", exc_info=True)
