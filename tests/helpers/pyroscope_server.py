"""A loopback Pyroscope that decodes every push with classes compiled from tests/proto (not gpuflame's reader)."""

from __future__ import annotations

import gzip
import http.server
import socket
import threading
from types import ModuleType


class Handler(http.server.BaseHTTPRequestHandler):
    server: Server

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        mode = self.server.mode
        if mode == "close":  # drop the connection before reading the body
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            return
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if mode == "hang":
            self.server.release.wait(60)
            return
        if mode == "garbage":  # not HTTP, with terminal escapes and more than a message should quote
            self.wfile.write(b"\x1b[2J\x1b]0;pwned\x07NOT HTTP " + b"x" * 5000 + b"\r\n\r\n")
            self.close_connection = True
            return
        if mode == "trickle":  # a status line one byte at a time, never ending: each read gets a byte in time
            self._trickle()
            return
        with self.server.lock:
            self.server.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
        if mode == "429-once":
            self.server.mode = "ok"
            self._answer(429, b'{"code":"resource_exhausted","message":"slow down"}', {"Retry-After": "0.3"})
        elif mode == "429":
            self._answer(429, b'{"code":"resource_exhausted","message":"slow down"}', {"Retry-After": "1"})
        elif mode == "500":
            self._answer(500, b"internal error\n", {})
        elif mode == "401":  # echoes the credentials: the client must not repeat them
            echo = f'{{"code":"unauthenticated","message":"bad {self.headers.get("Authorization")}"}}'
            self._answer(401, echo.encode(), {})
        else:
            self._answer(200, b"", {"Content-Type": "application/proto"})

    def _trickle(self) -> None:
        self.close_connection = True
        try:
            self.wfile.write(b"HTTP/1.1 200 ")
            while not self.server.release.wait(0.05):  # the pace of a hostile server, not a synchronisation
                self.wfile.write(b"x")
                self.wfile.flush()
        except OSError:  # the client gave up: what it should do
            pass

    def _answer(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        headers.setdefault("Content-Type", "application/json")
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.mode = "ok"
        self.retry_after = "0.2"
        self.requests: list[dict] = []
        self.release = threading.Event()
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


def decode_push(body: bytes, push_pb2: ModuleType, profile_pb2: ModuleType) -> list[tuple[dict[str, str], object]]:
    """[(series labels, pprof message)] of one PushRequest."""
    request = push_pb2.PushRequest()
    request.ParseFromString(body)
    out = []
    for series in request.series:
        labels = {p.name: p.value for p in series.labels}
        assert len(series.samples) == 1
        assert series.samples[0].ID
        pprof = profile_pb2.Profile()
        pprof.ParseFromString(gzip.decompress(series.samples[0].raw_profile))
        out.append((labels, pprof))
    return out
