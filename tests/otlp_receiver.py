"""A real OTLP receiver for tests: gRPC and HTTP, on free local ports.

Tests of an exporter pipeline should end where production ends: at a collector
that decodes OTLP. :class:`OtlpReceiver` is that collector, in-process. It
serves the official ``opentelemetry-proto`` gRPC services (traces, metrics,
logs) and OTLP/HTTP ``POST /v1/{traces,metrics,logs}`` with protobuf bodies,
plain or gzip/deflate compressed (not chunked, not JSON), on ``127.0.0.1``
with OS-chosen ports.

Usage
-----
Point a stock exporter at it, export, then assert on flattened records::

    with OtlpReceiver() as receiver:
        exporter = OTLPSpanExporter(endpoint=receiver.grpc_endpoint, insecure=True)
        ...  # export some spans
        assert receiver.wait_for(lambda r: len(r.spans()) >= 2, timeout_s=5)
        (child,) = [s for s in receiver.spans() if s["name"] == "inc"]

``spans()``, ``metrics()`` and ``logs()`` return one plain ``dict`` per span,
metric data point or log record (see ``tests/otlp_decode.py`` for the keys).
``wait_for`` blocks on a condition that is notified whenever a request is
stored or starts or stops waiting, so it never sleep-polls.

Misbehaviour
------------
Three knobs make the collector misbehave. Each can be passed to the
constructor or set on a running receiver, so a test can break the collector
in the middle of a run:

``delay_s``
    Every request is answered after this many seconds (a slow collector).
``hang``
    Requests are accepted and never answered, until ``hang`` is set back to
    False or the receiver stops (a hung collector). A gRPC request is also
    released when its client gives up (deadline or cancel), so retries do not
    pile up on the server's thread pool.
``fail``
    Requests are refused with gRPC ``UNAVAILABLE`` / HTTP 503.

Only requests answered with OK / 200 are stored: a refused request, or one
still hung or delayed when the receiver stops, is not. ``requests_answered``
and ``requests_failed`` count answers (``refused`` by signal: ``{"traces": 3}``);
``requests_pending`` counts requests
held right now by ``hang`` or ``delay_s``. A gRPC request is stored just before
its response is sent, so a client whose deadline expires in that instant sees
a failure for a request the receiver kept. Tests that race deadlines against
``delay_s`` should leave a margin.

TLS
---
Pass ``tls_cert_file`` and ``tls_key_file`` to serve both transports over TLS;
the endpoints then start with ``https://``. ``make_self_signed_cert`` makes a
certificate for ``localhost`` and ``127.0.0.1`` with the ``openssl`` command;
skip on ``not HAVE_OPENSSL``.
"""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import grpc
from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from otlp_decode import decompress_body, flatten_logs, flatten_metrics, flatten_spans

__all__ = ["HAVE_OPENSSL", "OtlpReceiver", "Received", "make_self_signed_cert"]

HAVE_OPENSSL = shutil.which("openssl") is not None

_REQUEST_TYPES: dict[str, tuple[type[Message], type[Message]]] = {
    "traces": (trace_service_pb2.ExportTraceServiceRequest, trace_service_pb2.ExportTraceServiceResponse),
    "metrics": (metrics_service_pb2.ExportMetricsServiceRequest, metrics_service_pb2.ExportMetricsServiceResponse),
    "logs": (logs_service_pb2.ExportLogsServiceRequest, logs_service_pb2.ExportLogsServiceResponse),
}
_SIGNAL_OF = {request: signal for signal, (request, _) in _REQUEST_TYPES.items()}
_STOP_TIMEOUT_S = 1.5  # the budget for all of stop()


@dataclass(frozen=True)
class Received:
    """One stored request: the decoded protobuf plus where and how it came."""

    signal: str  # "traces" | "metrics" | "logs"
    transport: str  # "grpc" | "http"
    request: Message
    headers: dict[str, Any]  # gRPC metadata or HTTP headers, names lower-cased; "-bin" values are bytes


class OtlpReceiver:
    """An in-process OTLP collector; see the module docstring."""

    def __init__(
        self,
        *,
        delay_s: float = 0.0,
        hang: bool = False,
        fail: bool = False,
        tls_cert_file: str | Path | None = None,
        tls_key_file: str | Path | None = None,
        grpc_workers: int = 16,
        grpc_port: int = 0,
    ) -> None:
        if (tls_cert_file is None) != (tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file go together")
        self.delay_s = delay_s
        self.fail = fail
        self._hang = hang
        self._tls = (Path(tls_cert_file), Path(tls_key_file)) if tls_cert_file and tls_key_file else None
        self._grpc_workers = grpc_workers
        self._grpc_want_port = grpc_port  # 0: the OS chooses; a collector restarted on its port passes it
        # One condition guards the store, the counters and the knobs. Hung
        # handlers and wait_for() callers both wait on it. It is reentrant so
        # a wait_for predicate may call spans() while the lock is held.
        self._cond = threading.Condition(threading.RLock())
        self._received: list[Received] = []
        self.requests_answered = 0
        self.requests_failed = 0
        self.refused: dict[str, int] = {}
        self.requests_pending = 0
        self._started = False
        self._stopping = False
        self._grpc_pool: ThreadPoolExecutor | None = None
        self._grpc_server: grpc.Server | None = None
        self._grpc_port = 0
        self._http_server: _HttpServer | None = None
        self._http_thread: threading.Thread | None = None

    # -- knobs -------------------------------------------------------------

    @property
    def hang(self) -> bool:
        return self._hang

    @hang.setter
    def hang(self, value: bool) -> None:
        with self._cond:
            self._hang = value
            self._cond.notify_all()  # release requests hung until now

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> OtlpReceiver:
        """Bind both servers and start serving; a receiver starts once."""
        if self._started:
            raise RuntimeError("an OtlpReceiver can be started only once")
        self._started = True
        try:
            self._start_grpc()
            self._start_http()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_grpc(self) -> None:
        self._grpc_pool = ThreadPoolExecutor(self._grpc_workers, thread_name_prefix="otlp-receiver-grpc")
        # so_reuseport=0: never share a port with another server in the same test run.
        server = grpc.server(self._grpc_pool, options=[("grpc.so_reuseport", 0)])
        self._grpc_server = server
        servicer = _Servicer(self)
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(servicer, server)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(servicer, server)
        logs_service_pb2_grpc.add_LogsServiceServicer_to_server(servicer, server)
        if self._tls is None:
            self._grpc_port = server.add_insecure_port(f"127.0.0.1:{self._grpc_want_port}")
        else:
            cert, key = self._tls
            credentials = grpc.ssl_server_credentials([(key.read_bytes(), cert.read_bytes())])
            self._grpc_port = server.add_secure_port(f"127.0.0.1:{self._grpc_want_port}", credentials)
        if not self._grpc_port:
            raise OSError(f"the OTLP receiver cannot listen on 127.0.0.1:{self._grpc_want_port}")
        server.start()

    def _start_http(self) -> None:
        context = None
        if self._tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*self._tls)
        self._http_server = _HttpServer(self, context)
        # A short poll interval keeps shutdown() quick; the default is 0.5 s.
        self._http_thread = threading.Thread(
            target=self._http_server.serve_forever, kwargs={"poll_interval": 0.05}, name="otlp-receiver-http"
        )
        self._http_thread.daemon = True
        self._http_thread.start()

    def stop(self) -> None:
        """Release held requests unanswered, then close both servers. Idempotent.

        Every step shares one deadline, so stop() returns within
        ``_STOP_TIMEOUT_S`` even if some step misbehaves.
        """
        deadline = time.monotonic() + _STOP_TIMEOUT_S

        def remaining() -> float:
            return max(0.0, deadline - time.monotonic())

        with self._cond:
            if self._stopping:
                return
            self._stopping = True
            self._cond.notify_all()
            # Released handlers return at once; waiting for them here means that
            # after stop() no handler holds a request and nothing more is stored.
            self._cond.wait_for(lambda: self.requests_pending == 0, timeout=remaining())
        if self._grpc_server is not None:
            # grace=None cancels in-flight calls and waits for the core to shut down.
            self._grpc_server.stop(None).wait(remaining())
        if self._grpc_pool is not None:
            # grpc.server() never shuts down a pool it was handed. Its threads are
            # idle by now: every handler was released above.
            self._grpc_pool.shutdown(wait=True)
        if self._http_server is not None:
            if self._http_thread is not None:
                self._http_server.shutdown()  # returns within one poll_interval
                self._http_thread.join(remaining())
            self._http_server.close_connections(timeout_s=remaining())
            self._http_server.server_close()

    def __enter__(self) -> OtlpReceiver:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def grpc_endpoint(self) -> str:
        """``http(s)://127.0.0.1:PORT``, as the gRPC exporters' ``endpoint=`` takes it."""
        return f"{self._scheme()}://127.0.0.1:{self._port(self._grpc_port)}"

    @property
    def http_endpoint(self) -> str:
        """Base URL without the signal path; append ``/v1/traces`` for an exporter."""
        port = self._http_server.server_address[1] if self._http_server else 0
        return f"{self._scheme()}://127.0.0.1:{self._port(port)}"

    def _scheme(self) -> str:
        return "http" if self._tls is None else "https"

    def _port(self, port: int) -> int:
        if not port:
            raise RuntimeError("the receiver is not started")
        return port

    # -- the request path, shared by both transports -----------------------

    def _serve(self, received: Received, client_gone: Callable[[], bool]) -> bool | None:
        """Hold a request through ``hang`` and ``delay_s``, then store it or refuse it.

        Returns True when the request was stored (answer OK), False when
        ``fail`` refuses it, None when it was dropped: the receiver is stopping
        or the client went away while the request was held.
        """
        with self._cond:
            self.requests_pending += 1
            self._cond.notify_all()
            try:
                self._cond.wait_for(lambda: self._stopping or client_gone() or not self._hang)
                if self.delay_s > 0:
                    self._cond.wait_for(lambda: self._stopping or client_gone(), timeout=self.delay_s)
                if self._stopping or client_gone():
                    return None
                if self.fail:
                    self.requests_failed += 1
                    self.refused[received.signal] = self.refused.get(received.signal, 0) + 1
                    return False
                self._received.append(received)
                self.requests_answered += 1
                return True
            finally:
                self.requests_pending -= 1
                self._cond.notify_all()

    def _export_grpc(self, signal: str, request: Message, context: grpc.ServicerContext) -> Message:
        gone = threading.Event()

        def on_rpc_done() -> None:
            # Runs on grpc's polling thread once the RPC ends for any reason.
            gone.set()
            with self._cond:
                self._cond.notify_all()

        if not context.add_callback(on_rpc_done):
            gone.set()  # the RPC had already ended
        headers = {key.lower(): value for key, value in context.invocation_metadata()}
        outcome = self._serve(Received(signal, "grpc", request, headers), gone.is_set)
        if outcome is None:
            context.abort(grpc.StatusCode.UNAVAILABLE, "otlp receiver stopped")
        if outcome is False:
            context.abort(grpc.StatusCode.UNAVAILABLE, "otlp receiver: fail=True")
        return _REQUEST_TYPES[signal][1]()

    # -- what tests read ---------------------------------------------------

    def requests(self, signal: str | None = None) -> list[Received]:
        """Stored requests, oldest first, optionally of one signal only."""
        with self._cond:
            return [r for r in self._received if signal is None or r.signal == signal]

    @property
    def headers(self) -> list[dict[str, Any]]:
        """Headers (gRPC metadata) of every stored request, names lower-cased."""
        return [r.headers for r in self.requests()]

    def spans(self) -> list[dict[str, Any]]:
        return list(self._flatten("traces", flatten_spans))

    def metrics(self) -> list[dict[str, Any]]:
        return list(self._flatten("metrics", flatten_metrics))

    def logs(self) -> list[dict[str, Any]]:
        return list(self._flatten("logs", flatten_logs))

    def _flatten(self, signal: str, flatten: Callable[..., Iterator[dict[str, Any]]]) -> Iterator[dict[str, Any]]:
        for received in self.requests(signal):
            yield from flatten(received.request, transport=received.transport)

    def wait_for(self, predicate: Callable[[OtlpReceiver], bool], *, timeout_s: float) -> bool:
        """Block until ``predicate(self)`` holds (True) or ``timeout_s`` passes (False)."""
        with self._cond:
            return self._cond.wait_for(lambda: predicate(self), timeout=timeout_s)

    def clear(self) -> None:
        """Forget stored requests and reset the counters."""
        with self._cond:
            self._received.clear()
            self.requests_answered = self.requests_failed = 0
            self.refused = {}


class _Servicer(
    trace_service_pb2_grpc.TraceServiceServicer,
    metrics_service_pb2_grpc.MetricsServiceServicer,
    logs_service_pb2_grpc.LogsServiceServicer,
):
    """All three OTLP services: each has one ``Export``, told apart by request type."""

    def __init__(self, receiver: OtlpReceiver) -> None:
        self._receiver = receiver

    def Export(self, request: Message, context: grpc.ServicerContext) -> Message:  # noqa: N802 (proto name)
        return self._receiver._export_grpc(_SIGNAL_OF[type(request)], request, context)


class _HttpHandler(BaseHTTPRequestHandler):
    # HTTP/1.1 keeps connections alive like a real collector; stop() closes them.
    protocol_version = "HTTP/1.1"
    server: _HttpServer

    def setup(self) -> None:
        if isinstance(self.request, ssl.SSLSocket):
            self.request.do_handshake()  # here, not in accept(), see _HttpServer.get_request
        super().setup()

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        signal = urlsplit(self.path).path.removeprefix("/v1/")
        if signal not in _REQUEST_TYPES:
            return self._reply(404, b"unknown OTLP path")
        if self.headers.get_content_type() != "application/x-protobuf":
            return self._reply(415, b"only application/x-protobuf is supported")
        try:
            data = decompress_body(body, self.headers.get("Content-Encoding", ""))
            request = _REQUEST_TYPES[signal][0].FromString(data)
        except (DecodeError, OSError, EOFError, ValueError, zlib.error) as error:
            return self._reply(400, f"undecodable body: {error}".encode())
        headers = {name.lower(): value for name, value in self.headers.items()}
        outcome = self.server.receiver._serve(Received(signal, "http", request, headers), lambda: False)
        if outcome:
            return self._reply(200, _REQUEST_TYPES[signal][1]().SerializeToString(), "application/x-protobuf")
        return self._reply(503, b"otlp receiver unavailable")

    def _reply(self, status: int, body: bytes, content_type: str = "text/plain") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (base signature)
        pass  # one stderr line per request would drown the test output


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True  # a handler still blocked at interpreter exit must not hold it open

    def __init__(self, receiver: OtlpReceiver, ssl_context: ssl.SSLContext | None) -> None:
        self.receiver = receiver
        self._ssl_context = ssl_context
        self._connections: dict[socket.socket, threading.Thread] = {}
        self._connections_lock = threading.Lock()
        self._closing = False
        super().__init__(("127.0.0.1", 0), _HttpHandler)

    def get_request(self) -> tuple[socket.socket, Any]:
        conn, address = super().get_request()
        if self._ssl_context is not None:
            # Defer the handshake to the handler thread: a stalled client must not block accept().
            conn = self._ssl_context.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
        return conn, address

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        # Track each connection and its thread so stop() can end idle keep-alive
        # connections, whose threads would otherwise block in recv() forever.
        thread = threading.current_thread()
        thread.name = "otlp-receiver-http-connection"
        with self._connections_lock:
            if self._closing:
                self.shutdown_request(request)
                return
            self._connections[request] = thread
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._connections_lock:
                self._connections.pop(request, None)

    def close_connections(self, *, timeout_s: float) -> None:
        """Hang up on every open connection and join their threads."""
        with self._connections_lock:
            self._closing = True
            connections = list(self._connections.items())
        for conn, _ in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by the peer
        deadline = time.monotonic() + timeout_s
        for _, thread in connections:
            thread.join(max(0.0, deadline - time.monotonic()))

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Peers that hang up (a client timeout, stop() closing sockets) are normal here.
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


def make_self_signed_cert(directory: str | Path) -> tuple[Path, Path]:
    """Write ``cert.pem`` and ``key.pem`` for ``localhost``/``127.0.0.1`` into ``directory``.

    Uses the ``openssl`` command; raises FileNotFoundError without it (check
    ``HAVE_OPENSSL`` to skip instead). Valid for one day.
    """
    openssl = shutil.which("openssl")
    if openssl is None:
        raise FileNotFoundError("the openssl command is not on PATH")
    cert, key = Path(directory) / "cert.pem", Path(directory) / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key
