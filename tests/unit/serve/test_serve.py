"""``gpuflame serve``: the real server on 127.0.0.1, over a store made by real ``gpuflame run``.

The server runs in a thread (port 0); requests go through ``http.client`` so
that path-traversal attempts reach the server byte for byte, unnormalised.
Nothing here connects anywhere but 127.0.0.1.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuflame.cli.main import main
from gpuflame.formats import load, save
from gpuflame.render.html import render_html
from gpuflame.serve import make_server
from gpuflame.serve.app import Server, diff_supported
from gpuflame.serve.catalog import BadId, NotServed, resolve_id, scan
from gpuflame.units import format_bytes
from tests.helpers.profiles import small_profile
from tests.helpers.run_cli import gpuflame_run
from tests.helpers.serving import serving

# Every test here uses a fixture that starts a child process (a server, a kernel, openssl).
pytestmark = pytest.mark.subprocess

SCRIPT = """
    import sys, torch

    class Holder:
        def make(self, kib):
            return torch.zeros(kib * 256, dtype=torch.float32)  # kib KiB

    kept = Holder().make(int(sys.argv[1]))
"""
XSS = "<script>alert(1)</script>"
SECRET = "SECRET_FRAME_OUTSIDE"


def run_into_store(store: Path, cwd: Path, *args: str) -> None:
    result = gpuflame_run("--backend", "torch", *args, cwd=cwd, env={"GPUFLAME_STORE": str(store)})
    assert result.returncode == 0, result.stderr


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store with two runs (the older one's command holds markup), a plain profile, a broken one,
    and a secret profile outside it, reachable only through symlinks planted inside."""
    base = tmp_path_factory.mktemp("serve")
    store = base / "store"
    (base / "job.py").write_text(textwrap.dedent(SCRIPT))
    run_into_store(store, base, "job.py", "64", XSS)
    run_into_store(store, base, "job.py", "16")
    save(small_profile("ServeProbe > allocate", 4096), store / "plain.pb.gz")
    (store / "broken.pb.gz").write_bytes(b"\x1f\x8b\x08\x00not really gzip at all")
    outside = base / "outside"
    outside.mkdir()
    save(small_profile(SECRET, 999), outside / "secret.pb.gz")
    (store / "link.pb.gz").symlink_to(outside / "secret.pb.gz")
    (store / "linkdir").symlink_to(outside, target_is_directory=True)
    return store


@pytest.fixture(scope="module")
def server(served: Path) -> Iterator[Server]:
    with serving(make_server(served, "127.0.0.1", 0)) as srv:
        yield srv


def owner(server: Server) -> dict[str, str]:
    """The cookie a browser holds after opening the URL the server printed."""
    assert server.token is not None
    return {"Cookie": f"{server.token.cookie_name}={server.token.value}"}


def fetch(
    server: Server, target: str, method: str = "GET", headers: dict[str, str] | None = None, token: bool = True
) -> tuple[int, http.client.HTTPMessage, bytes]:
    """One raw request: *target* is sent exactly as written, with the owner's cookie unless *token* is False."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        conn.request(method, target, headers={**(owner(server) if token else {}), **(headers or {})})
        response = conn.getresponse()
        return response.status, response.headers, response.read()
    finally:
        conn.close()


def runs(served: Path) -> list[Path]:
    """The run folders, oldest first."""
    return sorted(
        (p for p in served.iterdir() if (p / "meta.json").is_file()),
        key=lambda p: json.loads((p / "meta.json").read_text())["started"],
    )


def run_id(folder: Path) -> str:
    return f"{folder.name}/profile.pb.gz"


# ---------------------------------------------------------------- the index


def test_index_lists_runs_with_peak_and_escaped_command(server: Server, served: Path) -> None:
    status, headers, body = fetch(server, "/")
    page = body.decode()
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    older, newer = runs(served)
    assert page.index(newer.name) < page.index(older.name)  # newest first
    assert "64.0 KiB" in page and "16.0 KiB" in page  # peaks from meta.json
    assert "python" in page and "job.py 64" in page
    assert XSS not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert f'href="/view/{run_id(older)}"' in page and f'href="/file/{run_id(older)}"' in page
    assert 'name="pick"' in page and 'action="/diff"' in page
    assert "plain.pb.gz" in page and format_bytes((served / "plain.pb.gz").stat().st_size) in page
    assert "link.pb.gz" not in page and "secret" not in page  # a symlink out of the folder is not listed


def test_index_has_a_strict_policy_and_no_outside_resource(server: Server) -> None:
    _, headers, body = fetch(server, "/")
    csp = headers["Content-Security-Policy"]
    assert "default-src 'none'" in csp and "script-src" not in csp and "frame-ancestors 'none'" in csp
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert b"http://" not in body and b"https://" not in body and b"<script" not in body


def test_api_runs_matches_meta_json(server: Server, served: Path) -> None:
    status, headers, body = fetch(server, "/api/runs")
    assert status == 200 and headers["Content-Type"] == "application/json"
    entries = {e["id"]: e for e in json.loads(body)}
    for folder in runs(served):
        meta = json.loads((folder / "meta.json").read_text())
        entry = entries[run_id(folder)]
        assert entry["kind"] == "run" and entry["meta"] == meta
        assert entry["peak_bytes"] == meta["totals"]["peak_space"]
        assert entry["size"] == (folder / "profile.pb.gz").stat().st_size
    plain = entries["plain.pb.gz"]
    assert plain["kind"] == "file" and plain["size"] == (served / "plain.pb.gz").stat().st_size
    assert [e["time"] for e in entries.values()] == sorted((e["time"] for e in entries.values()), reverse=True)


def test_head_answers_without_a_body(server: Server) -> None:
    status, headers, body = fetch(server, "/", method="HEAD")
    assert status == 200 and int(headers["Content-Length"]) > 0 and body == b""


# ---------------------------------------------------------------- view, file, diff


def test_view_is_the_viewer_page_of_the_run(server: Server, served: Path) -> None:
    folder = runs(served)[0]
    status, headers, body = fetch(server, f"/view/{run_id(folder)}")
    assert status == 200
    profile = load(folder / "profile.pb.gz")
    assert any(f.name == "Holder > make" for f in profile.frames)
    assert body.decode() == render_html(profile, folder.name)
    # the page's own policy (its script hash included) travels as a header that also forbids framing
    meta = re.search(r'http-equiv="Content-Security-Policy" content="([^"]*)"', body.decode())
    assert meta and headers["Content-Security-Policy"] == meta.group(1) + "; frame-ancestors 'none'"


def test_view_of_a_plain_file(server: Server, served: Path) -> None:
    status, _, body = fetch(server, "/view/plain.pb.gz")
    assert status == 200 and body.decode() == render_html(load(served / "plain.pb.gz"), "plain.pb.gz")


@pytest.mark.parametrize("name", ["plain.pb.gz", "run"])
def test_file_returns_the_exact_bytes(server: Server, served: Path, name: str) -> None:
    ident = run_id(runs(served)[1]) if name == "run" else name
    status, headers, body = fetch(server, f"/file/{ident}")
    assert status == 200 and body == (served / ident).read_bytes()
    assert headers["Content-Type"] == "application/octet-stream"
    assert headers["Content-Disposition"].startswith("attachment;")


def test_two_picks_redirect_to_the_diff_with_the_older_as_base(server: Server, served: Path) -> None:
    older, newer = runs(served)
    status, headers, _ = fetch(server, f"/diff?pick={run_id(newer)}&pick={run_id(older)}")
    assert status == 303
    assert headers["Location"] == f"/diff?base={run_id(older)}&new={run_id(newer)}"
    status, _, body = fetch(server, headers["Location"])
    if diff_supported():
        base, new = load(older / "profile.pb.gz"), load(newer / "profile.pb.gz")
        expected = render_html(new, f"{older.name} → {newer.name}", base=base)
        assert status == 200 and body.decode() == expected
    else:
        assert status == 501 and b"gpuflame diff BASE NEW" in body


def test_diff_without_a_viewer_diff_mode_is_501(server: Server, served: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("gpuflame.serve.app.diff_supported", lambda: False)
    older, newer = runs(served)
    status, _, body = fetch(server, f"/diff?base={run_id(older)}&new={run_id(newer)}")
    assert status == 501 and b"gpuflame diff BASE NEW" in body


def test_diff_needs_exactly_two(server: Server) -> None:
    assert fetch(server, "/diff?pick=plain.pb.gz")[0] == 400
    assert fetch(server, "/diff?base=plain.pb.gz")[0] == 400
    assert fetch(server, "/diff?base=plain.pb.gz&new=missing.pb.gz")[0] == 404


def test_corrupt_profile_is_a_422_and_the_server_keeps_answering(server: Server) -> None:
    status, _, body = fetch(server, "/view/broken.pb.gz")
    assert status == 422 and b"broken.pb.gz" in body and b"gzip" in body
    assert fetch(server, "/")[0] == 200
    assert fetch(server, "/view/plain.pb.gz")[0] == 200


def test_unknown_pages_are_404(server: Server, served: Path) -> None:
    assert fetch(server, "/nothing")[0] == 404
    assert fetch(server, "/view/missing.pb.gz")[0] == 404
    assert fetch(server, f"/file/{runs(served)[0].name}/meta.json")[0] == 404  # only profile files are served


def test_a_foreign_host_header_is_refused(server: Server) -> None:
    """DNS rebinding: a page from evil.example that resolves to 127.0.0.1 gets nothing."""
    assert fetch(server, "/api/runs", headers={"Host": "evil.example"})[0] == 403
    assert fetch(server, "/api/runs", headers={"Host": f"localhost:{server.port}"})[0] == 200


# ---------------------------------------------------------------- only files inside DIR


TRAVERSALS = [
    "/file/../../etc/passwd",
    "/file/../outside/secret.pb.gz",
    "/file/%2e%2e/%2e%2e/etc/passwd",
    "/file/%2e%2e%2foutside%2fsecret.pb.gz",
    "/file/%252e%252e/outside/secret.pb.gz",
    "/file//etc/passwd",
    "/file/%2Fetc%2Fpasswd",
    "/file/..\\outside\\secret.pb.gz",
    "/file/..%5coutside%5csecret.pb.gz",
    "/file/plain.pb.gz%00/../../outside/secret.pb.gz",
    "/file/link.pb.gz",
    "/file/linkdir/secret.pb.gz",
    "/view/link.pb.gz",
    "/view/linkdir/secret.pb.gz",
    "/view/../outside/secret.pb.gz",
    "/diff?base=link.pb.gz&new=plain.pb.gz",
    "/diff?pick=linkdir/secret.pb.gz&pick=plain.pb.gz",
    "/..%2f..%2fetc/passwd",
    "/../../etc/passwd",
]


@pytest.mark.parametrize("target", TRAVERSALS)
def test_nothing_outside_the_folder_is_served(server: Server, served: Path, target: str) -> None:
    status, _, body = fetch(server, target)
    assert status in (400, 404), body[:300]
    assert SECRET.encode() not in body and b"root:" not in body
    assert (served.parent / "outside" / "secret.pb.gz").read_bytes() not in body


def test_absolute_path_of_an_outside_file_is_refused(server: Server, served: Path) -> None:
    secret = served.parent / "outside" / "secret.pb.gz"
    for target in (f"/file/{secret}", f"/file/{secret.as_posix().replace('/', '%2F')}", "/file/%2Fetc%2Fpasswd"):
        status, _, body = fetch(server, target)
        assert status in (400, 404) and secret.read_bytes() not in body


def test_resolve_id_refuses_what_a_listing_cannot_hold(served: Path) -> None:
    root = served.resolve()
    for bad in ("", "../x.pb.gz", "a/../plain.pb.gz", "./plain.pb.gz", "/etc/passwd", "a\\b.pb.gz", "a\x00.pb.gz"):
        with pytest.raises(BadId):
            resolve_id(root, bad)
    for missing in ("link.pb.gz", "linkdir/secret.pb.gz", "nothing.pb.gz", "job.py"):
        with pytest.raises(NotServed):
            resolve_id(root, missing)
    assert resolve_id(root, "plain.pb.gz") == root / "plain.pb.gz"


# ---------------------------------------------------------------- the command


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        rc = main(list(argv))
    except SystemExit as exc:
        rc = int(exc.code or 0)
    out, err = capsys.readouterr()
    return rc, out, err


def test_missing_dir_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run_cli(capsys, "serve", str(tmp_path / "nope"), "--port", "0")
    assert rc == 2 and out == "" and err.count("\n") == 1 and "no such folder" in err


def test_missing_default_store_says_how_to_fill_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUFLAME_STORE", str(tmp_path / "none"))
    rc, _, err = run_cli(capsys, "serve", "--port", "0")
    assert rc == 2 and err.count("\n") == 1 and "gpuflame run" in err


def test_port_in_use_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        rc, out, err = run_cli(capsys, "serve", str(tmp_path), "--port", str(port))
    assert rc == 2 and out == "" and err.count("\n") == 1 and f"127.0.0.1:{port}" in err


def test_bad_port_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run_cli(capsys, "serve", str(tmp_path), "--port", "70000")
    assert rc == 2 and err.count("\n") == 1


def test_a_non_loopback_host_gets_a_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gpuflame.cli.serve import _announce

    srv = make_server(tmp_path, "127.0.0.1", 0)
    try:
        _announce(srv, "127.0.0.1")
        out, err = capsys.readouterr()
        assert "this machine only" in out and srv.url in out and err == ""
        _announce(srv, "10.1.2.3")  # words only: nothing listens beyond 127.0.0.1
        out, err = capsys.readouterr()
        assert err.count("\n") == 1 and "warning" in err and "source paths" in err
    finally:
        srv.server_close()


def test_ctrl_c_exits_cleanly(served: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuflame", "serve", str(served), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        first = proc.stdout.readline() if proc.stdout else ""
        assert "http://127.0.0.1:" in first and "this machine only" in first
        url = re.search(r"http://127\.0\.0\.1:(\d+)/\?token=([A-Za-z0-9_-]+)", first)
        assert url, first
        conn = http.client.HTTPConnection("127.0.0.1", int(url.group(1)), timeout=30)
        conn.request("GET", f"/api/runs?token={url.group(2)}")
        assert conn.getresponse().status == 200
        conn.close()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "stopped" in out


def test_a_jax_memory_profile_is_listed(tmp_path: Path) -> None:
    """JAX's own device-memory profile is memory.prof (jax.profiler.save_device_memory_profile); report read it,
    serve did not list it (a trial)."""
    jax = pytest.importorskip("jax")
    kept = jax.numpy.ones(1024).block_until_ready()  # noqa: F841
    jax.profiler.save_device_memory_profile(str(tmp_path / "memory.prof"))
    (tmp_path / "notes.txt").write_text("not a profile")
    assert [entry.id for entry in scan(tmp_path)] == ["memory.prof"]


def test_pages_are_made_two_at_a_time() -> None:
    """Each page reads a whole profile (up to 1 GiB inflated): six requests for a gzip bomb held 6.25 GB at once.

    Three requests for three pages: the third is made only once one of the first two is done.
    """
    import threading

    from gpuflame.serve.app import RENDERS_AT_ONCE, PageCache

    assert RENDERS_AT_ONCE == 2
    cache = PageCache()
    events: list[str] = []
    changed = threading.Condition()
    release = {n: threading.Event() for n in range(3)}
    calling = threading.Event()

    def make(n: int) -> bytes:
        with changed:
            events.append(f"enter {n}")
            changed.notify_all()
        assert release[n].wait(60)
        with changed:
            events.append(f"exit {n}")
            changed.notify_all()
        return b"page"

    def request(n: int) -> None:
        if n == 2:
            calling.set()
        cache.get(("page", n), lambda: make(n))

    def wait_for(done) -> None:  # type: ignore[no-untyped-def]
        with changed:
            assert changed.wait_for(done, 60), events

    first = [threading.Thread(target=request, args=(n,)) for n in (0, 1)]
    for t in first:
        t.start()
    wait_for(lambda: len(events) == 2)
    third = threading.Thread(target=request, args=(2,))
    third.start()
    assert calling.wait(60)
    release[0].set()
    wait_for(lambda: "enter 2" in events)
    for n in (1, 2):
        release[n].set()
    for t in [*first, third]:
        t.join(60)
    assert events.index("enter 2") > events.index("exit 0"), events


def test_names_that_are_not_utf8_do_not_break_the_index(tmp_path: Path) -> None:
    """A file, a folder or a run's command that is not UTF-8 (lone surrogates once read) made GET / a 500."""
    root = tmp_path / os.fsdecode(b"served\xff")
    odd = root / os.fsdecode(b"run\xff")
    odd.mkdir(parents=True)
    save(small_profile("Odd > allocate", 4096), root / os.fsdecode(b"odd\xff.pb.gz"))
    save(small_profile("Odd > allocate", 4096), odd / "inside.pb.gz")
    save(small_profile("Fine > allocate", 4096), root / "fine.pb.gz")
    run = root / "run1"
    run.mkdir()
    save(small_profile("Run > allocate", 4096), run / "profile.pb.gz")
    (run / "meta.json").write_text('{"command": ["python", "job\\udcff.py"], "started": 1700000000}')
    with serving(make_server(root, "127.0.0.1", 0)) as srv:
        status, _, body = fetch(srv, "/")
        assert status == 200, body[-300:]
        page = body.decode("utf-8")
        assert "fine.pb.gz" in page and "job\ufffd.py" in page and "odd" not in page and "inside" not in page
        assert fetch(srv, "/view/run1/profile.pb.gz")[0] == 200
