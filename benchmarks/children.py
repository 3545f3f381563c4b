"""The child processes a benchmark's controller talks to, a line at a time.

:class:`LineProcess` is a child that answers one line for each line it is sent;
:class:`Receiver` is one of those holding an OTLP receiver (``tests/otlp_receiver.py``,
decoding for real) that counts the spans that reached it by service and name, and the
metric points. Each receiver leads a process group of its own, which its arm then joins
(:mod:`rig`), so that the two are paused and resumed together.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parent.parent


def in_group(group: int) -> Callable[[], None]:
    """For ``Popen(preexec_fn=...)``: the child joins process group ``group`` (0: its own).
    (Popen's ``process_group`` does the same from Python 3.11 on.) The controller starts
    its children from one thread, so the hook runs safely."""
    return functools.partial(os.setpgid, 0, group)


RECEIVER = """
import collections, json, sys
sys.path.insert(0, {tests!r})
from otlp_receiver import OtlpReceiver
with OtlpReceiver() as receiver:
    print(json.dumps({{"grpc": receiver.grpc_endpoint, "http/protobuf": receiver.http_endpoint}}), flush=True)
    for line in sys.stdin:
        if line.strip() != "take":
            break
        counts = collections.Counter()
        for received in receiver.requests("traces"):
            for resource_spans in received.request.resource_spans:
                service = next((a.value.string_value for a in resource_spans.resource.attributes
                                if a.key == "service.name"), "")
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        counts[service, span.name] += 1
        points = len(receiver.metrics())
        receiver.clear()
        print(json.dumps({{"spans": [[service, name, n] for (service, name), n in counts.items()],
                          "points": points}}), flush=True)
"""


class LineProcess:
    """A child process that answers one line for each line it is sent; its first line,
    written as it starts, is kept as ``first``."""

    def __init__(self, argv: list[str], **popen: Any) -> None:
        self._proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, **popen)
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._stdin, self._stdout = self._proc.stdin, self._proc.stdout
        self.pid = self._proc.pid
        self.first = self._stdout.readline().strip()

    def ask(self, command: str) -> str:
        self._stdin.write(command + "\n")
        self._stdin.flush()
        return self._stdout.readline().strip()

    def close(self) -> None:
        """Close its input, which ends it, and reap it; again, or once it was killed, harmless."""
        if self._stdout.closed:
            return
        with contextlib.suppress(OSError):
            self._stdin.close()
        try:
            self._proc.wait(30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._stdout.close()


class Receiver(LineProcess):
    """An OTLP receiver in a child process, leading a process group of its own (see
    :class:`Arm`); :meth:`take` counts and forgets what arrived."""

    def __init__(self) -> None:
        super().__init__([sys.executable, "-c", RECEIVER.format(tests=str(ROOT / "tests"))],
                         preexec_fn=in_group(0))
        if not self.first:
            raise SystemExit("the benchmark's OTLP receiver did not start")
        #: By protocol (``grpc``, ``http/protobuf``); :attr:`endpoint` is the gRPC one.
        self.endpoints: dict[str, str] = json.loads(self.first)
        self.endpoint = self.endpoints["grpc"]

    def take(self) -> Taken:
        """What arrived since the last take."""
        answer = json.loads(self.ask("take"))
        spans: dict[str, dict[str, int]] = {}
        for service, name, n in answer["spans"]:
            spans.setdefault(service, {})[name] = n
        return Taken(spans, answer["points"])


class Taken(NamedTuple):
    """What a :class:`Receiver` got: ``spans``, ``{service: {span name: count}}``; ``points``, metric points."""

    spans: dict[str, dict[str, int]]
    points: int
