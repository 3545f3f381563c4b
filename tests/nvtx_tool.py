"""A real NVTX tool for the tests, and what it recorded.

NVTX loads the library ``NVTX_INJECTION64_PATH`` names at a process's first NVTX call, as
Nsight Systems does with its own: :func:`build_recorder` compiles ``nvtx_recorder.c`` with
the system's C compiler against NVIDIA's NVTX headers (the ``nvidia-nvtx`` package), and
:func:`read` parses the ``nvtx-<pid>.tsv`` files it wrote into :class:`Range` and
:class:`Mark` records, each push matched with its pop per thread and domain, each start with
its end.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

SOURCE = Path(__file__).parent / "nvtx_recorder.c"


def nvtx_headers() -> Path:
    """The include directory holding ``nvtx3/nvToolsExt.h``, from the nvidia-nvtx wheel."""
    import nvidia

    for root in nvidia.__path__:
        for found in sorted(Path(root).glob("*/include/nvtx3/nvToolsExt.h")):
            return found.parent.parent
    raise AssertionError("NVTX headers not found: the test extra's nvidia-nvtx package is missing")


def build_recorder(into: Path) -> Path:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    assert compiler, "no C compiler to build the NVTX test tool with"
    library = into / "libnvtx_recorder.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror", "-isystem", str(nvtx_headers()),
                    str(SOURCE), "-o", str(library), "-lpthread"], check=True, capture_output=True, timeout=120)
    return library


def attached(library: Path, out: Path) -> dict[str, str]:
    """The variables that attach the recorder to a process and its children."""
    out.mkdir(parents=True, exist_ok=True)
    return {"NVTX_INJECTION64_PATH": str(library), "NVTX_RECORDER_DIR": str(out)}


@dataclass
class Range:
    pid: int
    domain: str
    thread: int
    start_ns: int
    end_ns: int
    message: str
    category: str
    colour: int
    #: How it was made: pushed and popped on ``thread``, or started and ended (``end_thread``).
    kind: str = "push"
    end_thread: int = 0
    #: Ranges of the same domain pushed on the same thread while this one was open.
    depth: int = 0
    marks: list[Mark] = field(default_factory=list)

    def holds(self, start_ns: int, end_ns: int, *, slack_ns: int = 0) -> bool:
        return self.start_ns - slack_ns <= start_ns and end_ns <= self.end_ns + slack_ns


@dataclass
class Mark:
    pid: int
    domain: str
    thread: int
    at_ns: int
    message: str
    category: str
    colour: int


@dataclass
class Recorded:
    ranges: list[Range]
    marks: list[Mark]
    #: Pushes never popped and starts never ended, and pops with nothing pushed.
    unbalanced: list[str]
    pids: set[int]


def read(out: Path) -> Recorded:
    ranges: list[Range] = []
    marks: list[Mark] = []
    unbalanced: list[str] = []
    pids: set[int] = set()
    for path in sorted(out.glob("nvtx-*.tsv")):
        pid = int(path.stem.split("-")[1])
        pids.add(pid)
        categories: dict[tuple[str, str], str] = {}
        stacks: dict[tuple[str, int], list[Range]] = {}
        started: dict[str, Range] = {}
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            what, *fields = line.split("\t")
            if what == "category":
                domain, number, name = fields
                categories[(domain, number)] = name
            elif what in ("push", "start"):
                domain, thread, at = fields[0], int(fields[1]), int(fields[2])
                range_id = fields[3] if what == "start" else ""
                message, category, colour = fields[-3:]
                made = Range(pid, domain, thread, at, -1, message, categories.get((domain, category), category),
                             int(colour, 16), kind=what)
                if what == "push":
                    stack = stacks.setdefault((domain, thread), [])
                    made.depth = len(stack)
                    stack.append(made)
                else:
                    started[range_id] = made
                ranges.append(made)
            elif what == "pop":
                domain, thread, at = fields[0], int(fields[1]), int(fields[2])
                stack = stacks.get((domain, thread), [])
                if not stack:
                    unbalanced.append(f"pid {pid}: pop with nothing pushed on thread {thread}")
                    continue
                popped = stack.pop()
                popped.end_ns, popped.end_thread = at, thread
            elif what == "end":
                domain, thread, at, range_id = fields[0], int(fields[1]), int(fields[2]), fields[3]
                ended = started.pop(range_id, None)
                if ended is None:
                    unbalanced.append(f"pid {pid}: end of range {range_id} never started")
                    continue
                ended.end_ns, ended.end_thread = at, thread
            elif what == "mark":
                domain, thread, at, message, category, colour = fields
                marks.append(Mark(pid, domain, int(thread), int(at), message,
                                  categories.get((domain, category), category), int(colour, 16)))
        unbalanced += [f"pid {pid}: {r.message} pushed on thread {r.thread} never popped"
                       for stack in stacks.values() for r in stack]
        unbalanced += [f"pid {pid}: {r.message} started, never ended" for r in started.values()]
    for mark in marks:  # each mark to the innermost range of its domain open on its thread then
        holding = [r for r in ranges if r.pid == mark.pid and r.domain == mark.domain and r.thread == mark.thread
                   and r.start_ns <= mark.at_ns <= r.end_ns]
        if holding:
            max(holding, key=lambda r: r.start_ns).marks.append(mark)
    return Recorded(ranges, marks, unbalanced, pids)
