"""``gpuflame serve`` under attack and under load: the Host check on every address, and a deep listen queue.

Real servers on this machine: one bound to 0.0.0.0 (nothing here connects
from elsewhere; requests go to 127.0.0.1 or to this machine's own address),
one on 127.0.0.1 that 200 clients reach at once.
"""

from __future__ import annotations

import http.client
import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuflame.errors import GpuflameError
from gpuflame.formats import save
from gpuflame.serve import make_server
from gpuflame.serve.app import Server
from tests.helpers.profiles import small_profile
from tests.helpers.serving import serving

CLIENTS = 200


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    save(small_profile("HostProbe > allocate", 4096), tmp_path / "plain.pb.gz")
    return tmp_path


@pytest.fixture
def everywhere(folder: Path) -> Iterator[Server]:
    """Bound to every IPv4 address, with one reverse proxy's name allowed."""
    with serving(make_server(folder, "0.0.0.0", 0, ("profiles.example.com",))) as srv:
        yield srv


def status(srv: Server, host: str | None, address: str = "127.0.0.1") -> int:
    conn = http.client.HTTPConnection(address, srv.port, timeout=60)
    try:
        conn.putrequest("GET", "/api/runs", skip_host=True)
        if host is not None:
            conn.putheader("Host", host)
        if srv.token is not None:  # the owner's request: the Host check is what is tried here
            conn.putheader("Authorization", f"Bearer {srv.token.value}")
        conn.endheaders()
        return conn.getresponse().status
    finally:
        conn.close()


def own_address() -> str | None:
    """This machine's address on its default route, if it has one (a UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.255", 9))
            address = probe.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") else address


@pytest.mark.parametrize(
    "host",
    ["evil.example", "evil.example:80", "EVIL.example.", "localhost.evil.example", "10.9.9.9", "[2001:db8::1]:80", ""],
)
def test_bound_to_every_address_a_rebinding_host_is_refused(everywhere: Server, host: str) -> None:
    """DNS rebinding: a page of evil.example whose name now resolves here still names evil.example."""
    assert status(everywhere, host) == 403


def test_bound_to_every_address_this_machines_names_are_answered(everywhere: Server) -> None:
    port = everywhere.port
    machine = socket.gethostname()
    for host in (
        f"localhost:{port}",
        f"127.0.0.1:{port}",
        f"[::1]:{port}",
        f"0.0.0.0:{port}",
        machine,
        f"{machine.upper()}.:{port}",
        "profiles.example.com",
        f"Profiles.Example.COM:{port}",
        None,
    ):
        assert status(everywhere, host) == 200, host


@pytest.mark.parametrize("bind", ["0.0.0.0", "::"])
def test_a_client_that_dialled_this_machines_address_is_answered(folder: Path, bind: str) -> None:
    """On "::" an IPv4 client arrives as ::ffff:a.b.c.d, and its Host header says a.b.c.d."""
    address = own_address()
    if address is None:
        pytest.skip("this machine has no address besides loopback")
    try:
        bound = make_server(folder, bind, 0)
    except GpuflameError as exc:
        pytest.skip(f"cannot listen on {bind}: {exc}")
    with serving(bound) as srv:
        assert status(srv, f"{address}:{srv.port}", address=address) == 200
        assert status(srv, "evil.example", address=address) == 403


def test_on_loopback_the_machines_name_is_answered_and_others_refused(folder: Path) -> None:
    with serving(make_server(folder, "127.0.0.1", 0)) as srv:
        assert status(srv, socket.gethostname()) == 200
        assert status(srv, "profiles.example.com") == 403  # allowed only where --allow-host says so


def cookie_request(srv: Server) -> bytes:
    """An HTTP/1.0 GET of the index with the token's cookie, as a browser sends it after the first page."""
    assert srv.token is not None
    cookie = f"{srv.token.cookie_name}={srv.token.value}"
    return f"GET /api/runs HTTP/1.0\r\nHost: localhost\r\nCookie: {cookie}\r\n\r\n".encode()


def queued_connections(port: int, count: int) -> list[socket.socket]:
    """*count* connections to a server that is not accepting yet: all must complete their handshake."""
    clients = []
    for _ in range(count):
        client = socket.socket()
        client.setblocking(False)
        client.connect_ex(("127.0.0.1", port))
        clients.append(client)
    pending, guard = list(clients), time.monotonic() + 20  # a guard: loopback handshakes take microseconds
    while pending and time.monotonic() < guard:
        _, writable, _ = select.select([], pending, [], 1.0)
        pending = [c for c in pending if c not in writable]
    assert not pending, f"{len(pending)} of {count} connections were not queued (listen backlog too short)"
    return clients


def test_200_clients_at_once_are_all_answered(folder: Path) -> None:
    """socketserver's backlog of 5 queued 6 of them; the rest waited for SYN retries (30 s for some)."""
    srv = make_server(folder, "127.0.0.1", 0)
    clients = queued_connections(srv.port, CLIENTS)
    try:
        for client in clients:
            client.setblocking(True)
            client.settimeout(60)
            client.sendall(cookie_request(srv))
        answered = 0
        with serving(srv):
            for client in clients:
                answer = b""
                while chunk := client.recv(65536):
                    answer += chunk
                answered += answer.startswith(b"HTTP/1.0 200 ")
        assert answered == CLIENTS
    finally:
        for client in clients:
            client.close()
