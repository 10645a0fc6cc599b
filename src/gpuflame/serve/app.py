"""The HTTP server of ``gpuflame serve``: stdlib only, read-only, one folder.

Routes (GET and HEAD only):

    /                   the index of runs and profile files (newest first)
    /view/<id>          the viewer page of one profile
    /diff?base=&new=    the viewer's diff mode (?pick=a&pick=b redirects here)
    /file/<id>          the profile's bytes, as a download
    /api/runs           the index as JSON (exact byte counts, meta.json as written)

Every id goes through :func:`gpuflame.serve.catalog.resolve_id`. Whatever
address it listens on, the server answers only requests whose Host header
names this machine (:class:`HostNames`): a web page whose own name was made
to resolve to this machine (DNS rebinding) gets a 403, even when the server
listens on 0.0.0.0. And only its owner: a random token made at start rides
in the URL it prints, and every request must carry it (:class:`Token`:
``?token=``, then the cookie the first good request sets), so another
account on the machine, which can reach 127.0.0.1 as well, gets a 401.
A profile file is sent in chunks, never read whole.
"""

from __future__ import annotations

import hmac
import html
import inspect
import ipaddress
import json
import os
import re
import secrets
import socket
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import parse_qs, quote, unquote, urlsplit

from gpuflame import limits
from gpuflame.analysis.selection import Selection
from gpuflame.errors import GpuflameError
from gpuflame.files import open_regular, read_bytes
from gpuflame.formats import loads
from gpuflame.model import Profile
from gpuflame.pipeline import select
from gpuflame.printable import encodable, printable
from gpuflame.render.html import render_html
from gpuflame.serve import catalog, pages
from gpuflame.serve.catalog import BadId, NotServed

DATA_CSP = "default-src 'none'; sandbox; frame-ancestors 'none'"
_META_CSP = re.compile(r'<meta http-equiv="Content-Security-Policy" content="([^"]*)"', re.IGNORECASE)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")  # not in a header value (the terminal's escaping: printable)
CACHED_PAGES = 4  # viewer pages can be megabytes each
# pages made at once: each reads a whole profile (up to GPUFLAME_MAX_INFLATED_BYTES, 1 GiB, and its parse),
# so six requests for a 4 MB gzip bomb held 6.25 GB at once; more requests wait their turn
RENDERS_AT_ONCE = 2
CHUNK_BYTES = 1 << 20  # a download is sent in pieces this size: memory does not follow the file's size
TOKEN_PARAM = "token"  # the query parameter that carries the token (the URL printed at start)


@dataclass
class Response:
    status: int
    body: bytes
    content_type: str
    headers: dict[str, str] = field(default_factory=dict)
    stream: BinaryIO | None = None  # a file sent in chunks after the headers (its length: Content-Length)


class ProfileUnreadable(Exception):
    """A listed profile that fails to load: a 422 with the reason, not a crash."""


def diff_supported() -> bool:
    """Whether the viewer has a diff mode (``render_html(..., base=)``): the one place that asks."""
    return "base" in inspect.signature(render_html).parameters


def is_loopback(host: str) -> bool:
    """``127.0.0.1``, ``::1``, ``localhost``: reachable from this machine only."""
    name = host.strip("[]").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class PageCache:
    """The last few rendered pages, keyed by the files' identity, so reopening a big run is instant."""

    def __init__(self, size: int = CACHED_PAGES) -> None:
        self._pages: OrderedDict[tuple[object, ...], bytes] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()
        self._rendering = threading.BoundedSemaphore(RENDERS_AT_ONCE)

    def get(self, key: tuple[object, ...], make: Callable[[], bytes]) -> bytes:
        with self._lock:
            if key in self._pages:
                self._pages.move_to_end(key)
                return self._pages[key]
        with self._rendering:  # outside the lock: cached pages are answered meanwhile
            page = make()
        with self._lock:
            self._pages[key] = page
            while len(self._pages) > self._size:
                self._pages.popitem(last=False)
        return page


def host_name(header: str) -> str:
    """The name in a Host header, without its port, brackets or final dot, in lower case."""
    name = header[1:].split("]", 1)[0] if header.startswith("[") else header.rsplit(":", 1)[0]
    return name.rstrip(".").lower()


class HostNames:
    """The Host names a request may carry: this machine's, and the ones the user allowed.

    Loopback names, the address the server is bound to, the machine's host
    name (and its first label), the address the request's connection arrived
    on (any interface of this machine a client dialled by number), and each
    ``--allow-host`` (a reverse proxy's name). No DNS lookup: a name is
    trusted for what it is, never for where it resolves.
    """

    def __init__(self, bound: str, allowed: tuple[str, ...] = ()) -> None:
        machine = socket.gethostname().lower()
        self.names = {
            bound.strip("[]").rstrip(".").lower(),
            machine,
            machine.split(".", 1)[0],
            *(host_name(a) for a in allowed),
        } - {""}

    def allows(self, header: str | None, local_address: str) -> bool:
        if header is None:  # HTTP/1.0 without a Host: not what a browser sends
            return True
        name = host_name(header)
        return is_loopback(name) or name in self.names or name in _spellings(local_address)


def _spellings(address: str) -> set[str]:
    """An address as a Host header may write it (a dual-stack socket sees IPv4 clients as ::ffff:a.b.c.d)."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return {address.lower()}
    mapped = getattr(ip, "ipv4_mapped", None)
    return {address.lower(), str(ip), *([str(mapped)] if mapped else [])}


class Token:
    """The secret that makes a request its owner's: ``secrets.token_urlsafe``, made at start.

    A request carries it as ``?token=`` (the printed URL), in the cookie the
    first good request sets (``HttpOnly``, ``SameSite=Strict``, named after
    the port: cookies are shared by every port of a host), or as
    ``Authorization: Bearer`` (a script). Compared in constant time.
    """

    def __init__(self, value: str, port: int) -> None:
        self.value = value
        self.cookie_name = f"gpuflame-serve-{port}"

    def check(self, given: list[str] | None, cookies: list[str], authorization: str | None) -> bool | None:
        """True: a good token; False: a wrong one; None: none at all."""
        offered = [*(given or []), *_cookie_values(cookies, self.cookie_name)]
        if authorization and authorization[:7].lower() == "bearer ":
            offered.append(authorization[7:].strip())
        if not offered:
            return None
        return all(_same(o, self.value) for o in offered)

    def cookie(self) -> str:
        return f"{self.cookie_name}={self.value}; Path=/; HttpOnly; SameSite=Strict"


def _same(given: str, value: str) -> bool:
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), value.encode("ascii"))


def _cookie_values(headers: list[str], name: str) -> list[str]:
    """The values of cookie *name* in the request's Cookie headers (parsed by hand: one bad cookie spoils nothing)."""
    found = []
    for header in headers:
        for pair in header.split(";"):
            key, eq, value = pair.strip().partition("=")
            if eq and key == name:
                found.append(value.strip().strip('"'))
    return found


class Server(ThreadingHTTPServer):
    """One served folder (resolved), its page cache, the Host names it answers to, and its token."""

    daemon_threads = True
    # socketserver's 5 left 101 of 14,231 requests waiting 30 s for a SYN retry with 200 clients
    request_queue_size = socket.SOMAXCONN

    def __init__(
        self, root: Path, host: str, port: int, allow_hosts: tuple[str, ...] = (), token: str | None = None
    ) -> None:
        self.root = root
        self.hosts = HostNames(host, allow_hosts)
        self.cache = PageCache()
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        super().__init__((host.strip("[]"), port), Handler)
        self.token = Token(token, self.port) if token is not None else None

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A browser that closes the connection early is not worth a traceback."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    @property
    def base_url(self) -> str:
        """The address without the token (a wildcard bind is opened through loopback)."""
        host = str(self.server_address[0])
        if host in ("0.0.0.0", "::"):
            host = "127.0.0.1" if host == "0.0.0.0" else "::1"
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{self.port}/"

    @property
    def url(self) -> str:
        """The address to open in a browser: with the token, the one that lets a browser in."""
        return self.base_url + (f"?{TOKEN_PARAM}={self.token.value}" if self.token else "")


def make_server(
    root: str | Path,
    host: str = "127.0.0.1",
    port: int = 0,
    allow_hosts: tuple[str, ...] = (),
    need_token: bool = True,
) -> Server:
    """A bound server over *root* (checked and resolved); ``serve_forever`` starts it.

    With *need_token* (the default) it makes a new random token, which
    :attr:`Server.url` carries; without, anyone who reaches it is answered
    (``--no-token``: behind a proxy that authenticates).
    """
    folder = catalog.check_root(root)
    try:
        return Server(folder, host, port, allow_hosts, secrets.token_urlsafe(32) if need_token else None)
    except OSError as exc:
        raise GpuflameError(f"cannot listen on {host}:{port} ({exc.strerror or exc})") from None


class Handler(BaseHTTPRequestHandler):
    """Routes a request to a :class:`Response`; any failure is a page, never a dead server."""

    server: Server
    timeout = 60  # an idle or half-sent request does not hold a thread forever

    def version_string(self) -> str:
        return "gpuflame"

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self._answer(head=False)

    def do_HEAD(self) -> None:  # noqa: N802
        self._answer(head=True)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        """Quiet: a request log on the user's terminal is noise; failures are logged by _answer."""

    def _answer(self, head: bool) -> None:
        self._cookie: str | None = None  # set by a good ?token= (one handler serves a connection's requests)
        try:
            response = self._route()
        except MemoryError:  # a profile past what this machine holds: that page fails, the server stays
            self._log(503, "out of memory")
            response = error(503, "out of memory: this profile needs more than the server's machine gives")
        except Exception as exc:  # a bug: say so, keep serving
            self._log(500, f"{type(exc).__name__}: {exc}")
            response = error(500, f"internal error: {type(exc).__name__}: {exc}")
        try:
            self._send(response, head)
        finally:
            if response.stream is not None:
                response.stream.close()

    def _send(self, response: Response, head: bool) -> None:
        length = os.fstat(response.stream.fileno()).st_size if response.stream else len(response.body)
        self.send_response(response.status)
        headers = {**security_headers(response.content_type), **response.headers}
        if self._cookie:
            headers["Set-Cookie"] = self._cookie
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(length))
        self.end_headers()
        if head:
            return
        if response.stream is None:
            self.wfile.write(response.body)
            return
        while length > 0:  # the size said in the header, read in bounded pieces
            chunk = response.stream.read(min(CHUNK_BYTES, length))
            if not chunk:  # the file shrank meanwhile: the client sees a short answer, not a hang
                self.close_connection = True
                return
            self.wfile.write(chunk)
            length -= len(chunk)

    def _log(self, status: int, reason: str) -> None:
        sys.stderr.write(printable(f"gpuflame serve: {status} {self.path}: {reason}") + "\n")

    def _route(self) -> Response:
        if not self.server.hosts.allows(self.headers.get("Host"), str(self.connection.getsockname()[0])):
            return error(
                403,
                "this server answers only to the names of this machine (the Host header was "
                "another; a reverse proxy's name: gpuflame serve --allow-host NAME)",
            )
        parts = urlsplit(self.path)
        path, query = parts.path, parse_qs(parts.query, keep_blank_values=True)
        refused = self._refuse_without_token(query.pop(TOKEN_PARAM, None))
        if refused is not None:
            return refused
        if path == "/":
            return html_response(pages.index_page(str(self.server.root), catalog.scan(self.server.root)))
        if path == "/api/runs":
            return json_response([e.to_json() for e in catalog.scan(self.server.root)])
        if path == "/diff":
            return self._guard(self._diff, query)
        if path.startswith("/view/"):
            return self._guard(self._view, (unquote(path[len("/view/") :]), query))
        if path.startswith("/file/"):
            return self._guard(self._file, unquote(path[len("/file/") :]))
        return error(404, "no such page")

    def _refuse_without_token(self, given: list[str] | None) -> Response | None:
        """None when the request is the owner's (or no token is needed), else the 401/403 that says nothing."""
        token = self.server.token
        if token is None:
            return None
        verdict = token.check(given, self.headers.get_all("Cookie") or [], self.headers.get("Authorization"))
        if verdict:
            if given:  # the printed URL: from now on the cookie lets the page's links in
                self._cookie = token.cookie()
            return None
        status = 401 if verdict is None else 403
        self._log(status, "no token" if verdict is None else "wrong token")
        return Response(
            status,
            b"this server answers only with its token: open the URL gpuflame serve printed at start\n",
            "text/plain; charset=utf-8",
            {"WWW-Authenticate": 'Bearer realm="gpuflame serve"'} if status == 401 else {},
        )

    def _guard(self, route: Callable[[Any], Response], arg: Any) -> Response:
        """Turn the catalog's refusals and unreadable profiles into their status pages."""
        try:
            return route(arg)
        except BadId as exc:
            return error(400, str(exc))
        except NotServed as exc:
            return error(404, str(exc))
        except ProfileUnreadable as exc:
            self._log(422, str(exc))
            return error(422, str(exc))

    def _view(self, ident_query: tuple[str, dict[str, list[str]]]) -> Response:
        """The viewer page of a profile, as the query selects it (``?focus=f&type=inuse``: the CLI's options)."""
        ident, query = ident_query
        path = catalog.resolve_id(self.server.root, ident)
        entry = catalog.entry_for(self.server.root, ident)
        try:
            selection = Selection.from_query(query)
        except ValueError as exc:
            return error(400, str(exc))
        key = ("view", *file_key(path), selection)
        try:
            return viewer_response(
                self.server.cache.get(key, lambda: view_page(load(path, ident), entry.label, selection))
            )
        except GpuflameError as exc:  # a focus or label that leaves nothing, a moment the profile cannot show
            return error(400, str(exc))

    def _file(self, ident: str) -> Response:
        path = catalog.resolve_id(self.server.root, ident)
        try:
            stream = open_regular(path)
        except GpuflameError as exc:
            raise ProfileUnreadable(f"{ident}: cannot read ({str(exc).replace(str(path), ident)})") from None
        name = re.sub(r"[^A-Za-z0-9._-]", "_", ident.replace("/", "-"))
        return Response(
            200, b"", "application/octet-stream", {"Content-Disposition": f'attachment; filename="{name}"'}, stream
        )

    def _diff(self, query: dict[str, list[str]]) -> Response:
        picks = query.get("pick")
        if picks is not None:
            return self._diff_redirect(picks)
        base_id, new_id = query.get("base", [""])[0], query.get("new", [""])[0]
        if not base_id or not new_id:
            return error(400, "a diff needs two profiles: /diff?base=<id>&new=<id>")
        base_path = catalog.resolve_id(self.server.root, base_id)
        new_path = catalog.resolve_id(self.server.root, new_id)
        if not diff_supported():
            return error(501, "this gpuflame's viewer has no diff mode yet; in a terminal: gpuflame diff BASE NEW")
        labels = [catalog.entry_for(self.server.root, i).label for i in (base_id, new_id)]
        title = f"{labels[0]} → {labels[1]}"
        key = ("diff", *file_key(base_path), *file_key(new_path))

        def make() -> bytes:
            base, new = load(base_path, base_id), load(new_path, new_id)
            return render_html(new, title, base=base).encode()

        return viewer_response(self.server.cache.get(key, make))

    def _diff_redirect(self, picks: list[str]) -> Response:
        """Two checkboxes of the index -> the canonical diff URL, the older profile as base."""
        if len(picks) != 2:
            return error(400, f"pick exactly two profiles to diff (you picked {len(picks)})")
        older, newer = sorted((catalog.entry_for(self.server.root, p) for p in picks), key=lambda e: e.time)
        target = f"/diff?base={quote(older.id, safe='/')}&new={quote(newer.id, safe='/')}"
        return Response(303, b"", "text/plain; charset=utf-8", {"Location": target})


def view_page(profile: Profile, title: str, selection: Selection) -> bytes:
    """The page of *selection*'s view; its notes (a filter that matched nothing) are the page's comments."""
    opened = select(profile, selection, title)
    opened.profile.comments.extend(opened.notes)
    return render_html(opened.profile, title, opened.type_index if selection.sample_type else None).encode()


def file_key(path: Path) -> tuple[object, ...]:
    """What identifies a file's content for the cache: a rewritten profile renders anew."""
    info = path.stat()
    return str(path), info.st_mtime_ns, info.st_size


def read_or_unreadable(path: Path, ident: str) -> bytes:
    try:
        return read_bytes(path, limits.INFLATED_BYTES)
    except GpuflameError as exc:  # named by its id: the server's own path is not the client's business
        raise ProfileUnreadable(f"{ident}: cannot read ({str(exc).replace(str(path), ident)})") from None


def load(path: Path, ident: str) -> Profile:
    """The profile at *path*, named by its id in errors (never the server's absolute path)."""
    try:
        return loads(read_or_unreadable(path, ident), source=ident)
    except GpuflameError as exc:
        raise ProfileUnreadable(str(exc)) from None


def error(status: int, message: str) -> Response:
    reason = HTTPStatus(status).phrase
    page = encodable(pages.message_page(status, reason, message))
    return Response(status, page.encode(), "text/html; charset=utf-8")


def html_response(page: str | bytes) -> Response:
    # a name that is not UTF-8 (a folder, a file, a command in a run's meta.json) is a lone surrogate
    body = encodable(page).encode("utf-8") if isinstance(page, str) else page
    return Response(200, body, "text/html; charset=utf-8")


def viewer_response(page: bytes) -> Response:
    return Response(200, page, "text/html; charset=utf-8", {"Content-Security-Policy": viewer_csp(page)})


def json_response(data: object) -> Response:
    body = (json.dumps(data, indent=2) + "\n").encode("utf-8")
    return Response(200, body, "application/json")


def security_headers(content_type: str) -> dict[str, str]:
    """No sniffing, no framing, no referrer, no caching; a CSP for every kind of answer."""
    return {
        "Content-Type": content_type,
        "Content-Security-Policy": DATA_CSP if not content_type.startswith("text/html") else pages.PAGE_CSP,
        "X-Content-Type-Options": "nosniff",
        "X-Frame-Options": "DENY",
        "Referrer-Policy": "no-referrer",
        "Cross-Origin-Resource-Policy": "same-origin",
        "Cache-Control": "no-store",
    }


def viewer_csp(page: bytes) -> str:
    """The viewer page's own policy (its <meta>), as a header that also forbids framing."""
    found = _META_CSP.search(page[:16384].decode("utf-8", errors="replace"))
    if not found:
        return "frame-ancestors 'none'; base-uri 'none'; form-action 'none'; connect-src 'none'"
    policy = _CONTROL.sub(" ", html.unescape(found.group(1))).strip().rstrip(";")
    return f"{policy}; frame-ancestors 'none'"
