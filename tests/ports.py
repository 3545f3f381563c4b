"""Ports for servers that a test names before they start, safe when tests run in parallel.

The usual free port (bind to 0, read the number, close) comes from the ephemeral range,
where the OS may give it to the next socket of any process: with pytest-xdist running
tests side by side, another test's receiver, app or cluster could take it before ours
binds, and a scrape or an export would reach the wrong process. These come from below
the ephemeral range, from a band of their own for each xdist worker process (``gw0``,
``gw1``, ...), and are checked free when handed out.

>>> first = free_port(run=3)
>>> second = free_port()
>>> second >= first + 3 and second < EPHEMERAL_LOW
True
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

_BASE = 20_000
_BAND = 400  # ports each xdist worker process hands out, in turn


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default; also below the IANA dynamic range


EPHEMERAL_LOW = _ephemeral_low()
_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
_START = _BASE + _WORKER * _BAND
_next = [_START]  # where the next search starts; past every port handed out


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(*, run: int = 1) -> int:
    """The first of ``run`` consecutive ports that nothing listens on, in this process's band."""
    if _START + _BAND > EPHEMERAL_LOW:
        raise RuntimeError(f"xdist worker {_WORKER}'s ports would reach the ephemeral range ({EPHEMERAL_LOW}): "
                           "run fewer test processes")
    for _ in range(_BAND):
        first = _next[0]
        if first + run > _START + _BAND:
            first = _START  # round the band again: ports handed out long ago are free by now
        _next[0] = first + run
        if all(_free(port) for port in range(first, first + run)):
            return first
    raise RuntimeError(f"no {run} consecutive free ports in {_START}-{_START + _BAND - 1}")
