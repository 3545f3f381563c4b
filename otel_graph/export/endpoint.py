"""Where the OTLP span exporter sends, and whether anything listens there: asked at exit.

Exit gives the collector a window to take what is left (``OTEL_GRAPH_EXIT_TIMEOUT``).
A failed export cannot tell a collector that is down from one restarted a moment ago:
the exporter's gRPC channel reconnects with a backoff (up to 1 s here), and fails fast
until then. A TCP connection to the collector's address can: refused, nothing listens,
and the window would be spent for nothing (on a cluster once per process, one after
another); accepted, the collector is there (or hung, which the processor's stuck export
shows), and the window is worth its wait.

:func:`collector_address` resolves the address as the stock exporters do, from
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT`` and the
protocol's default; :func:`listening` connects once, bounded in time (name lookup
included: it runs on a thread of its own).

>>> collector_address("grpc", {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://otel.example:4317"})
('otel.example', 4317)
>>> collector_address("grpc", {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "localhost:5317"})
('localhost', 5317)
>>> collector_address("http/protobuf", {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://otel.example"})
('otel.example', 443)
>>> collector_address("grpc", {"OTEL_EXPORTER_OTLP_ENDPOINT": "unix:///run/otel.sock"}) is None
True
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Mapping
from urllib.parse import urlsplit

_DEFAULTS = {"grpc": "http://localhost:4317", "http/protobuf": "http://localhost:4318"}


def collector_address(protocol: str, env: Mapping[str, str] | None = None) -> tuple[str, int] | None:
    """(host, port) the span exporter connects to; None where that is not a TCP address."""
    env = os.environ if env is None else env
    endpoint = (env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
                or _DEFAULTS.get(protocol, "")).strip()
    if protocol == "grpc" and "://" not in endpoint:
        endpoint = f"http://{endpoint}"  # the gRPC exporter also takes a bare host:port
    try:
        parts = urlsplit(endpoint)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    if port is None:
        port = 443 if parts.scheme == "https" else 80
    return parts.hostname, port


def listening(address: tuple[str, int], *, timeout_s: float) -> bool | None:
    """Does ``address`` accept a TCP connection? None when that is not known within ``timeout_s``."""
    verdict: list[bool] = []

    def connect() -> None:
        try:
            with socket.create_connection(address, timeout=timeout_s):
                verdict.append(True)
        except ConnectionRefusedError:
            verdict.append(False)
        except OSError:
            pass  # unresolvable, unroutable, timed out: not known

    thread = threading.Thread(target=connect, name="otel-graph-probe", daemon=True)
    thread.start()
    thread.join(timeout_s)
    return verdict[0] if verdict else None
