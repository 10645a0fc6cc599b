"""``gpuflame.start(**options)``: ``gpuflame run``'s options, its environment, a small handle, the store.

Real torch (CPU), a real Pyroscope stand-in over HTTP on loopback (it only
records what it is sent), the real store and the catalog ``gpuflame serve``
lists it with.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import gpuflame
from gpuflame.capture.session import Session
from gpuflame.serve.catalog import scan


class Buffers:
    def allocate(self, n: int) -> torch.Tensor:
        return torch.empty(n, dtype=torch.uint8)


@pytest.fixture(autouse=True)
def _no_profile_left_running() -> Iterator[None]:
    yield
    gpuflame.stop(write=False)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No GPUFLAME_* of the machine running the tests: each test sets its own."""
    import os

    for name in [n for n in os.environ if n.startswith("GPUFLAME_")]:
        monkeypatch.delenv(name)
    return monkeypatch


def test_start_takes_run_s_options_and_returns_a_handle(tmp_path: Path, clean_env) -> None:
    out = tmp_path / "opts.pb.gz"
    recording = gpuflame.start(
        out, backend="torch", torch_hook="dispatch", interval="2s", native=True, keep_framework=True
    )
    assert isinstance(recording, gpuflame.Recording) and not isinstance(recording, Session)
    settings = recording.settings
    assert (settings.backend, settings.torch_hook, settings.interval) == ("torch", "dispatch", 2.0)
    assert settings.native and settings.keep_framework and not settings.follow and settings.session_dir == ""
    kept = Buffers().allocate(4096)  # noqa: F841
    assert recording.running and recording.backends == ["torch"] and recording.path == out.resolve()
    assert type(recording._session.recorders[0]).__name__ == "TorchTensorRecorder"  # the dispatch hook, as asked
    assert recording.stop() == out.resolve()
    assert not recording.running and recording.stop() is None  # stopped once
    profile = gpuflame.load(out)
    index = profile.type_index("alloc")
    assert (
        sum(s.values[index] for s in profile.samples if profile.frames[s.stack[0]].name == "Buffers > allocate") == 4096
    )


@pytest.mark.slow
def test_options_not_given_come_from_the_environment(tmp_path: Path, clean_env) -> None:
    """What a process ``gpuflame run`` starts is told, the API reads too; an option given wins."""
    clean_env.setenv("GPUFLAME_BACKEND", "jax")
    clean_env.setenv("GPUFLAME_TORCH_HOOK", "dispatch")
    clean_env.setenv("GPUFLAME_INTERVAL", "0.5")
    clean_env.setenv("GPUFLAME_SESSION_DIR", str(tmp_path / "launcher"))  # gpuflame run's folder: not the API's
    recording = gpuflame.start(tmp_path / "env.pb.gz", interval=3)
    settings = recording.settings
    assert (settings.backend, settings.torch_hook, settings.interval) == ("jax", "dispatch", 3.0)
    assert settings.session_dir == "" and recording.path == (tmp_path / "env.pb.gz").resolve()
    gpuflame.stop()
    assert not (tmp_path / "launcher").exists()


def test_a_start_after_the_environment_changed_reads_it_again(tmp_path: Path, clean_env) -> None:
    """The settings kept from the last start (a host starts one per test) follow GPUFLAME_* when it changes."""
    clean_env.setenv("GPUFLAME_KEEP_FRAMEWORK", "1")
    first = gpuflame.start(tmp_path / "a.pb.gz", backend="torch")
    assert first.settings.keep_framework
    gpuflame.stop(write=False)
    again = gpuflame.start(tmp_path / "b.pb.gz", backend="torch")
    assert again.settings == first.settings  # unchanged: the same answer
    gpuflame.stop(write=False)
    clean_env.setenv("GPUFLAME_KEEP_FRAMEWORK", "0")
    later = gpuflame.start(tmp_path / "c.pb.gz", backend="torch")
    assert not later.settings.keep_framework
    gpuflame.stop(write=False)
    clean_env.delenv("GPUFLAME_KEEP_FRAMEWORK")
    other = gpuflame.start(tmp_path / "d.pb.gz", backend="torch", keep_framework=True)
    assert other.settings.keep_framework


@pytest.mark.parametrize(
    ("options", "error", "words"),
    [
        ({"backend": "cobol"}, ValueError, "backend must be one of"),
        ({"torch_hook": "magic"}, ValueError, "torch_hook must be one of"),
        ({"interval": -1}, ValueError, "interval cannot be negative"),
        ({"interval": "soon"}, ValueError, "not a duration"),
        ({"pyroscope": "ftp://nowhere"}, ValueError, "not a Pyroscope URL"),
        ({"output": "a.pb.gz", "store": True}, ValueError, "output or store"),
        ({"colour": "red"}, TypeError, "unexpected keyword argument 'colour'"),
    ],
)
def test_what_start_raises_is_what_its_docstring_says(clean_env, options, error, words) -> None:
    assert error.__name__ in gpuflame.start.__doc__
    with pytest.raises(error, match=words):
        gpuflame.start(**options)
    assert gpuflame.stop() is None  # nothing was started


def test_profile_takes_start_s_options_and_no_others(tmp_path: Path, clean_env) -> None:
    with pytest.raises(TypeError, match="unknown options colour"):
        with gpuflame.profile(tmp_path / "x.pb.gz", colour="red"):
            pass
    with gpuflame.profile(tmp_path / "x.pb.gz", backend="torch", torch_hook="dispatch") as recording:
        assert recording.settings.torch_hook == "dispatch"
    assert (tmp_path / "x.pb.gz").exists()


def test_store_puts_the_profile_where_serve_lists_it(tmp_path: Path, clean_env) -> None:
    store = tmp_path / "store"
    with gpuflame.profile(backend="torch", store=store) as recording:
        kept = Buffers().allocate(8192)  # noqa: F841
        assert (
            recording.path.parent.parent == store
            and json.loads((recording.path.parent / "meta.json").read_text())["ended"] == 0.0
        )  # listed even if the process dies
    [entry] = scan(store)
    assert entry.kind == "run" and entry.id == f"{recording.path.parent.name}/profile.pb.gz"
    assert entry.meta["totals"] == gpuflame.load(recording.path).totals() and entry.meta["ended"] > 0
    assert (
        entry.peak() == ("peak_space", gpuflame.load(recording.path).totals()["peak_space"]) and entry.peak()[1] >= 8192
    )
    clean_env.setenv("GPUFLAME_STORE", str(tmp_path / "default"))
    gpuflame.start(backend="torch", store=True)
    gpuflame.stop()
    assert [e.kind for e in scan(tmp_path / "default")] == ["run"]


class Pyroscope(http.server.ThreadingHTTPServer):
    """Records what it is sent (the body's size and path); answers 200."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), PushHandler)
        self.pushes: list[str] = []


class PushHandler(http.server.BaseHTTPRequestHandler):
    server: Pyroscope

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.pushes.append(self.path)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()


@pytest.mark.slow
def test_pyroscope_option_pushes_as_gpuflame_run_does(tmp_path: Path, clean_env) -> None:
    server = Pyroscope()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        recording = gpuflame.start(tmp_path / "p.pb.gz", backend="torch", pyroscope=url, service_name="api-test")
        assert recording.settings.interval == 15.0  # run's default with --pyroscope
        kept = Buffers().allocate(1024)  # noqa: F841
        gpuflame.stop()
        assert server.pushes and all(p.endswith("/push.v1.PusherService/Push") for p in server.pushes)
    finally:
        server.shutdown()
        server.server_close()


def test_load_and_save_beside_profile(tmp_path: Path) -> None:
    """``gpuflame.load``/``save``: any format gpuflame reads in, export's formats out (the name picks it)."""
    profile = gpuflame.Profile(sample_types=[gpuflame.SampleType("inuse_space", "bytes")])
    profile.add([gpuflame.Frame("Model > forward", "model.py", 3)], [4096])
    for name in ("p.pb.gz", "p.folded", "p.svg", "p.data"):
        gpuflame.save(profile, tmp_path / name)
    assert (
        gpuflame.load(tmp_path / "p.pb.gz").totals()
        == gpuflame.load(tmp_path / "p.folded").totals()
        == gpuflame.load(tmp_path / "p.data").totals()
        == {"inuse_space": 4096}
    )  # no suffix: pprof
    assert (tmp_path / "p.svg").read_text().startswith("<svg") or "<svg" in (tmp_path / "p.svg").read_text()
    gpuflame.save(profile, tmp_path / "q.txt", "speedscope")
    assert json.loads((tmp_path / "q.txt").read_text())["shared"]["frames"][0]["name"] == "Model > forward"
