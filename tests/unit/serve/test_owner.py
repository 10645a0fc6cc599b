"""``gpuflame serve`` answers its owner only, streams files, and lists a broken run without failing the index.

Real servers on 127.0.0.1: in a thread for the token's rules, as a
``gpuflame serve`` process for what another account on this machine gets
(``setpriv`` to an unused uid, as root) and for the memory a download takes
(its peak resident size, ``VmHWM``, read from ``/proc``).
"""

from __future__ import annotations

import hashlib
import http.client
import json
import math
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuflame.cli.main import main
from gpuflame.formats import save
from gpuflame.serve import make_server
from gpuflame.serve.app import Server
from tests.helpers.profiles import small_profile
from tests.helpers.serving import serving

pytestmark = pytest.mark.subprocess

SECRET = "OwnerOnlyProbe > allocate"
OTHER_UID = 54_321  # no account: a second local user with nothing of its own
ROUTES = ("/", "/api/runs", "/view/plain.pb.gz", "/file/plain.pb.gz", "/diff?base=plain.pb.gz&new=plain.pb.gz")


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A private folder (0700) with a private profile (0600), as the run store keeps them."""
    root = tmp_path / "store"
    root.mkdir(mode=0o700)
    save(small_profile(SECRET, 4096), root / "plain.pb.gz")
    os.chmod(root / "plain.pb.gz", 0o600)
    return root


@pytest.fixture
def server(folder: Path) -> Iterator[Server]:
    with serving(make_server(folder, "127.0.0.1", 0)) as srv:
        yield srv


def get(srv: Server, target: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
    try:
        conn.request("GET", target, headers=headers or {})
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


# ---------------------------------------------------------------- the token


@pytest.mark.parametrize("route", ROUTES)
def test_without_the_token_every_route_is_401_and_says_nothing(server: Server, folder: Path, route: str) -> None:
    status, headers, body = get(server, route)
    assert status == 401 and "set-cookie" not in headers
    assert SECRET.encode() not in body and (folder / "plain.pb.gz").read_bytes() not in body
    assert str(folder).encode() not in body and b"plain.pb.gz" not in body


@pytest.mark.parametrize("how", ["query", "cookie", "bearer"])
def test_a_wrong_token_is_403(server: Server, how: str) -> None:
    assert server.token is not None
    wrong = server.token.value[:-1] + ("A" if server.token.value[-1] != "A" else "B")
    headers = {
        "query": {},
        "cookie": {"Cookie": f"{server.token.cookie_name}={wrong}"},
        "bearer": {"Authorization": f"Bearer {wrong}"},
    }[how]
    target = f"/file/plain.pb.gz?token={wrong}" if how == "query" else "/file/plain.pb.gz"
    status, _, body = get(server, target, headers)
    assert status == 403 and SECRET.encode() not in body


def test_a_good_token_beside_a_wrong_one_is_still_refused(server: Server) -> None:
    assert server.token is not None
    status, _, _ = get(server, f"/api/runs?token={server.token.value}", {"Authorization": "Bearer nope"})
    assert status == 403


def test_the_printed_url_lets_a_browser_in_and_its_cookie_the_links(server: Server, folder: Path) -> None:
    assert server.token is not None and server.url.endswith(f"/?token={server.token.value}")
    status, headers, body = get(server, server.url.split(str(server.port), 1)[1])
    assert status == 200 and b"plain.pb.gz" in body
    cookie = headers["set-cookie"]
    parts = [p.strip() for p in cookie.split(";")]
    assert parts[0] == f"gpuflame-serve-{server.port}={server.token.value}"
    assert {"Path=/", "HttpOnly", "SameSite=Strict"} <= set(parts[1:])
    for link in re.findall(r'href="(/(?:view|file)/[^"]+)"', body.decode()):  # the page's own links
        status, _, linked = get(server, link, {"Cookie": parts[0]})
        assert status == 200, link
    status, _, data = get(server, "/file/plain.pb.gz", {"Cookie": "other=1; " + parts[0]})
    assert status == 200 and data == (folder / "plain.pb.gz").read_bytes()


def test_the_token_is_not_taken_for_a_view_option(server: Server) -> None:
    """/view/ID?token=...&focus=...: the token is the server's, the rest is the viewer's selection."""
    assert server.token is not None
    status, _, body = get(server, f"/view/plain.pb.gz?token={server.token.value}&focus=allocate")
    assert status == 200 and b"unknown parameter" not in body  # a 400 if the token reached the selection


def test_each_server_makes_its_own_token(folder: Path) -> None:
    one, two = make_server(folder, "127.0.0.1", 0), make_server(folder, "127.0.0.1", 0)
    try:
        assert one.token and two.token and one.token.value != two.token.value
        assert len(one.token.value) >= 40  # 32 random bytes
        assert one.token.cookie_name != two.token.cookie_name  # one browser, two servers: two cookies
    finally:
        one.server_close()
        two.server_close()


def test_no_token_answers_anyone(folder: Path) -> None:
    with serving(make_server(folder, "127.0.0.1", 0, need_token=False)) as srv:
        assert srv.token is None and "token" not in srv.url
        assert get(srv, "/file/plain.pb.gz")[0] == 200


def test_help_says_what_no_token_is_for(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--no-token" in text and "reverse proxy that authenticates" in text and "token" in text


# ---------------------------------------------------------------- a gpuflame serve process


def start_serve(folder: Path, *extra: str) -> tuple[subprocess.Popen[str], str]:
    """``gpuflame serve FOLDER --port 0``, and the URL it printed."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuflame", "serve", str(folder), "--port", "0", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    first = proc.stdout.readline() if proc.stdout else ""
    found = re.search(r"http://127\.0\.0\.1:\d+/\S*", first)
    if not found:
        proc.kill()
        raise AssertionError(f"no URL in {first!r}: {proc.communicate()[1]}")
    return proc, found.group(0)


def stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    proc.communicate(timeout=30)


CLIENT = """
import hashlib, http.client, sys
port, target = int(sys.argv[1]), sys.argv[2]
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
conn.request("GET", target)
r = conn.getresponse()
body = r.read()
print(r.status, hashlib.sha256(body).hexdigest(), body[:200])
"""


def other_user_python() -> str:
    """An interpreter a second local user can run (this one may live in root's home)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv (util-linux) to act as a second local user")
    for candidate in (sys.executable, shutil.which("python3"), "/usr/bin/python3"):
        if candidate and subprocess.run([*as_other(), candidate, "-I", "-c", "pass"]).returncode == 0:
            return candidate
    pytest.skip("no Python interpreter that a second local user can run")


def as_other() -> list[str]:
    return ["setpriv", f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", "--clear-groups"]


def test_a_second_local_user_without_the_token_gets_nothing(folder: Path) -> None:
    """The attack: another account on the machine fetched a 0600 profile of a 0700 folder from 127.0.0.1."""
    python = other_user_python()
    proc, url = start_serve(folder)
    port, token = int(url.split(":")[2].split("/")[0]), url.split("token=", 1)[1]
    secret = (folder / "plain.pb.gz").read_bytes()
    try:

        def fetch_as_other(target: str) -> tuple[int, str]:
            done = subprocess.run(
                [*as_other(), python, "-I", "-c", CLIENT, str(port), target], capture_output=True, text=True
            )
            assert done.returncode == 0, done.stderr
            status, digest, _ = done.stdout.split(" ", 2)
            return int(status), digest

        for route in ROUTES:
            status, digest = fetch_as_other(route)
            assert status == 401 and digest != hashlib.sha256(secret).hexdigest(), route
        assert fetch_as_other("/file/plain.pb.gz?token=guess")[0] == 403
        # the same user with the token is answered: the refusals above are the token's doing
        assert fetch_as_other(f"/file/plain.pb.gz?token={token}") == (200, hashlib.sha256(secret).hexdigest())
    finally:
        stop(proc)


def peak_rss(pid: int) -> int:
    """The process's peak resident memory so far, in bytes (``VmHWM``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_a_download_is_streamed_not_read_whole(folder: Path) -> None:
    """A 5 GB file took 5.3 GB resident; here a 64 MB one must not raise the peak by a quarter of itself."""
    big = folder / "big.pb.gz"
    size = 64 << 20
    with open(big, "wb") as out:
        for _ in range(size >> 20):
            out.write(os.urandom(1 << 20))
    proc, url = start_serve(folder)
    port, token = int(url.split(":")[2].split("/")[0]), url.split("token=", 1)[1]
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.request("GET", f"/file/plain.pb.gz?token={token}")  # a first download: the code paths are warm
        assert conn.getresponse().read() == (folder / "plain.pb.gz").read_bytes()
        before = peak_rss(proc.pid)
        conn.request("GET", f"/file/big.pb.gz?token={token}")
        response = conn.getresponse()
        assert response.status == 200 and int(response.headers["Content-Length"]) == size
        digest = hashlib.sha256()
        while chunk := response.read(1 << 20):
            digest.update(chunk)
        conn.close()
        assert digest.hexdigest() == hashlib.sha256(big.read_bytes()).hexdigest()
        grown = peak_rss(proc.pid) - before
        assert grown < size // 4, f"serving {size:,} bytes raised the peak by {grown:,}"
    finally:
        stop(proc)


# ---------------------------------------------------------------- broken meta.json


BROKEN_META = {
    "huge": b'{"started": 1e300, "command": ["python", "a.py"]}',
    "nan": b'{"started": NaN, "command": ["python", "a.py"]}',
    "infinity": b'{"started": Infinity}',
    "negative": b'{"started": -Infinity}',
    "bigint": b'{"started": ' + b"9" * 400 + b"}",
    "word": b'{"started": "yesterday", "exit_code": "x", "processes": 3, "totals": {"peak_space": 1e999}}',
    "bool": b'{"started": true, "command": "python a.py", "totals": {"peak_space": ' + b"9" * 30 + b"}}",
    "list": b"[1, 2, 3]",
    "garbage": b"\xff\xfe not json",
    "deep": b"[" * 100_000 + b"]" * 100_000,
}


def test_a_run_with_a_broken_meta_json_is_listed_with_a_note(server: Server, folder: Path) -> None:
    for name, text in BROKEN_META.items():
        run = folder / f"run-{name}"
        run.mkdir()
        (run / "meta.json").write_bytes(text)
        save(small_profile(SECRET, 1024), run / "profile.pb.gz")
    fifo = folder / "run-fifo"
    fifo.mkdir()
    os.mkfifo(fifo / "meta.json")  # never opened for reading: that would block the index
    assert server.token is not None
    cookie = {"Cookie": f"{server.token.cookie_name}={server.token.value}"}
    status, _, body = get(server, "/", cookie)
    page = body.decode()
    assert status == 200
    for name in [*BROKEN_META, "fifo"]:
        assert f"run-{name}" in page, name
    notes = re.findall(r'class="bad"[^>]*>([^<]*)<', page)
    assert len([n for n in notes if "meta.json" in n]) == len(BROKEN_META) + 1
    status, _, body = get(server, "/api/runs", cookie)
    entries = {e["id"].split("/")[0]: e for e in json.loads(body, parse_constant=lambda c: pytest.fail(c))}
    assert status == 200
    for name in [*BROKEN_META, "fifo"]:
        entry = entries[f"run-{name}"]
        assert entry["problem"], name
        assert isinstance(entry["time"], float) and math.isfinite(entry["time"])
    assert get(server, "/view/run-huge/profile.pb.gz", cookie)[0] == 200  # the profile itself still opens


# ---------------------------------------------------------------- memory


def test_a_page_past_the_table_limit_is_a_400_naming_it(
    server: Server, folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (folder / "deep.folded").write_text("a;b 1\nc 2\n" + ";".join(["d"] * 200) + " 3\n")
    assert server.token is not None
    cookie = {"Cookie": f"{server.token.cookie_name}={server.token.value}"}
    monkeypatch.setenv("GPUFLAME_MAX_TABLE_CELLS", "500")  # 3 stacks x 200 frames: 600 cells
    status, _, body = get(server, "/view/deep.folded", cookie)
    monkeypatch.delenv("GPUFLAME_MAX_TABLE_CELLS")
    assert status == 400 and b"GPUFLAME_MAX_TABLE_CELLS" in body
    assert get(server, "/view/deep.folded", cookie)[0] == 200


def test_out_of_memory_on_a_page_is_a_503_and_the_server_goes_on(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    def exhausted(*args: object) -> bytes:
        raise MemoryError

    assert server.token is not None
    cookie = {"Cookie": f"{server.token.cookie_name}={server.token.value}"}
    monkeypatch.setattr("gpuflame.serve.app.view_page", exhausted)
    status, _, body = get(server, "/view/plain.pb.gz", cookie)
    assert status == 503 and b"out of memory" in body
    monkeypatch.undo()
    assert get(server, "/view/plain.pb.gz", cookie)[0] == 200


def test_open_hands_the_browser_the_url_with_the_token(folder: Path, tmp_path: Path) -> None:
    """--open: the page a browser opens is the tokened one (it sets the cookie the links need)."""
    seen = tmp_path / "opened.txt"
    browser = tmp_path / "browser.sh"
    browser.write_text(f'#!/bin/sh\nprintf "%s" "$1" > {seen}.part && mv {seen}.part {seen}\n')
    browser.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"BROWSER": str(browser)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuflame", "serve", str(folder), "--port", "0", "--open"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        first = proc.stdout.readline() if proc.stdout else ""
        printed = re.search(r"http://127\.0\.0\.1:\d+/\?token=[A-Za-z0-9_-]+", first)
        assert printed, first
        # the server answers only once the browser command has returned (webbrowser waits for it)
        conn = http.client.HTTPConnection("127.0.0.1", int(printed.group(0).split(":")[2].split("/")[0]), timeout=60)
        conn.request("GET", "/api/runs")
        assert conn.getresponse().status == 401
        conn.close()
        assert seen.read_text() == printed.group(0)
    finally:
        stop(proc)
