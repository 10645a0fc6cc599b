"""The webhook's HTTPS server: stdlib ``http.server`` + ``ssl``, one thread per request.

The API server calls ``POST /mutate``; the kubelet probes ``GET /healthz``.
A bad body (not JSON, over ``MAX_BODY``, nested past the interpreter's
recursion limit, not a Pod) is answered 400 with one line at once and the
server keeps serving; the certificate is re-read when its file changes
(cert-manager rotates it).
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import sys
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from gpuflame.errors import GpuflameError
from gpuflame.files import open_regular
from gpuflame.webhook.admission import BadRequest, Config, review

MAX_BODY = 4 * 1024 * 1024  # an AdmissionReview of a large pod is well under this
HANDSHAKE_TIMEOUT = 10.0
TOO_DEEP = "body is JSON nested too deeply to be an AdmissionReview"


class Certificates:
    """The TLS context, rebuilt when the certificate or key file changes on disk."""

    def __init__(self, cert: str, key: str) -> None:
        self.cert, self.key = cert, key
        self._lock = threading.Lock()
        self._stamp: tuple[float, float] | None = None
        self._context = self._load()

    def _mtimes(self) -> tuple[float, float]:
        return os.stat(self.cert).st_mtime, os.stat(self.key).st_mtime

    def _load(self) -> ssl.SSLContext:
        try:
            stamp = self._mtimes()
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            # read through descriptors of files found regular: a FIFO would block ssl's read for ever, and every
            # request with it, also one swapped in between a check and ssl's own open of the name
            with open_regular(self.cert, "PEM file") as cert, open_regular(self.key, "PEM file") as key:
                context.load_cert_chain(f"/proc/self/fd/{cert.fileno()}", f"/proc/self/fd/{key.fileno()}")
        except (OSError, ssl.SSLError, GpuflameError) as exc:
            raise GpuflameError(f"cannot load the TLS certificate {self.cert} / key {self.key}: {exc}") from None
        self._stamp = stamp
        return context

    def context(self) -> ssl.SSLContext:
        """The current context; a half-written rotation keeps the old one until it is whole."""
        with self._lock:
            try:
                if self._mtimes() != self._stamp:
                    self._context = self._load()
            except (OSError, GpuflameError) as exc:
                sys.stderr.write(f"gpuflame webhook: keeping the previous certificate ({exc})\n")
            return self._context


class Handler(BaseHTTPRequestHandler):
    server: WebhookServer
    server_version = "gpuflame-webhook"
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        """Finish the TLS handshake here, in the request's thread, not in the accept loop."""
        self.request.settimeout(HANDSHAKE_TIMEOUT)
        self.request.do_handshake()
        super().setup()

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        if self.path.split("?")[0] == "/healthz":
            self._send(HTTPStatus.OK, b"ok\n", "text/plain")
        else:
            self._send(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain")

    def do_POST(self) -> None:  # noqa: N802
        if self.path.split("?")[0] != "/mutate":
            self._send(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain")
            return
        try:
            body = self._body()
            answer = review(body, self.server.config)
        except RecursionError:  # parsed, but too deep to copy or print (a thousand levels in a Pod's fields)
            self._send(HTTPStatus.BAD_REQUEST, f"bad request: {TOO_DEEP}\n".encode(), "text/plain")
            return
        except BadRequest as exc:
            self._send(HTTPStatus.BAD_REQUEST, f"bad request: {exc}\n".encode(), "text/plain")
            return
        for warning in answer["response"].get("warnings", []):  # what was skipped or ignored, for the operator
            self.log_message("%s: %s", _pod(body), warning)
        self._send(HTTPStatus.OK, json.dumps(answer).encode(), "application/json")

    def _body(self) -> Any:
        """The JSON body; anything unreadable is a BadRequest (400), never a crash."""
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            raise BadRequest("Content-Length missing or not a number") from None
        if not 0 <= length <= MAX_BODY:
            raise BadRequest(f"body of {length} bytes (at most {MAX_BODY})")
        raw = self.rfile.read(length)
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise BadRequest(f"body is not JSON ({exc})") from None
        except RecursionError:  # the parser's own guard: a Pod is a dozen levels deep, not a thousand
            raise BadRequest(TOO_DEEP) from None

    def _send(self, status: HTTPStatus, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        if not self.server.quiet:
            sys.stderr.write(f"gpuflame webhook: {self.address_string()} {format % args}\n")


def _pod(body: dict[str, Any]) -> str:
    """``namespace/name`` of the pod in a review (``name*`` for a generateName), ascii-escaped for a log line."""
    request = body["request"]
    meta = (request.get("object") or {}).get("metadata") or {}
    name = meta.get("name") or f"{meta.get('generateName', '')}*"
    return ascii(f"{request.get('namespace') or meta.get('namespace', '')}/{name}")[1:-1]


class WebhookServer(ThreadingHTTPServer):
    """Accepts plain TCP, wraps each connection in TLS with the current certificate."""

    daemon_threads = True
    request_queue_size = socket.SOMAXCONN  # every pod creation of the cluster may call at once (socketserver: 5)

    def __init__(self, address: tuple[str, int], certificates: Certificates, config: Config, quiet: bool = False):
        self.certificates, self.config, self.quiet = certificates, config, quiet
        super().__init__(address, Handler)

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, addr = self.socket.accept()
        wrapped = self.certificates.context().wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return wrapped, addr

    def handle_error(self, request: Any, client_address: Any) -> None:
        """One line per broken connection (a failed handshake, a client gone), not a traceback."""
        exc = sys.exc_info()[1]
        sys.stderr.write(f"gpuflame webhook: {client_address[0]}: {type(exc).__name__}: {exc}\n")

    @property
    def port(self) -> int:
        return int(self.server_address[1])


def make_server(
    host: str, port: int, cert: str, key: str, config: Config | None = None, quiet: bool = False
) -> WebhookServer:
    """Load the certificate (a clear error when it is missing) and bind."""
    certificates = Certificates(cert, key)
    try:
        return WebhookServer((host, port), certificates, config or Config(), quiet)
    except OSError as exc:
        raise GpuflameError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
