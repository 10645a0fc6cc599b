"""The launcher <-> profiled-process contract (boundary/contract.py): file names, pids, the child's environment."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuflame.boundary import contract
from gpuflame.boundary.settings import Settings


def test_every_per_process_file_gives_its_pid_back() -> None:
    for pattern in contract.PER_PROCESS:
        assert contract.pid_of(pattern.format(pid=4242)) == 4242
    assert contract.pid_of("/a/b/proc-7.pb.gz") == 7
    for other in ("peak-cpu.table", "proc-x.pb.gz", "profile.pb.gz", ".proc-7.pb.gz.tmp", "meta.json"):
        assert contract.pid_of(other) is None


def test_process_files_lists_one_kind_by_pid_and_nothing_else(tmp_path: Path) -> None:
    for name in ("proc-30.pb.gz", "proc-4.pb.gz", "lost-4.txt", ".proc-9.pb.gz.tmp", "proc-5.pb.gz.bak"):
        (tmp_path / name).write_text("")
    (tmp_path / "proc-6.pb.gz").symlink_to(tmp_path / "proc-4.pb.gz")  # a link is no process's file
    os.mkfifo(tmp_path / "proc-7.pb.gz")  # nor is a FIFO
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert contract.process_files(fd, contract.PROCESS_FILE) == {4: "proc-4.pb.gz", 30: "proc-30.pb.gz"}
        assert list(contract.process_files(fd, contract.LOST_FILE)) == [4]
    finally:
        os.close(fd)


def test_the_child_env_starts_the_bootstrap_first_and_carries_the_settings() -> None:
    settings = Settings(session_dir="/tmp/s", backend="jax", interval=2.0, follow=False)
    env = contract.child_env(settings, {"PYTHONPATH": "/app/src", "HOME": "/root"})
    assert env["PYTHONPATH"].split(os.pathsep) == [contract.BOOTSTRAP_DIR, "/app/src"]
    assert Path(contract.BOOTSTRAP_DIR, "sitecustomize.py").is_file()
    assert Path(env[contract.HOME_ENV], "gpuflame", "__init__.py").is_file()
    assert env["HOME"] == "/root"
    assert Settings.from_env(env) == settings


def test_stop_following_undoes_the_child_env(monkeypatch: pytest.MonkeyPatch) -> None:
    env = contract.child_env(Settings(session_dir="/tmp/s"), {"PYTHONPATH": "/app/src"})
    for name in ("PYTHONPATH", "GPUFLAME_SESSION_DIR"):
        monkeypatch.setenv(name, env[name])
    contract.stop_following()
    assert os.environ["PYTHONPATH"] == "/app/src"
    assert "GPUFLAME_SESSION_DIR" not in os.environ
    assert not Settings.from_env().enabled


def test_what_a_process_wrote_of_its_losses_reaches_the_terminal_escaped(tmp_path, capsys) -> None:
    """lost-PID.txt and the partial notes come from the profiled program's side: no control character passes."""
    from gpuflame.launch.outcome import say_where
    from gpuflame.launch.store import RunMeta

    meta = RunMeta(
        command=["x"],
        started=0.0,
        lost=["pid 7: disk full\x1b[2J\rfake: line"],
        partial_processes=[{"pid": 8, "why": "partial\x1b]0;title\x07"}],
    )
    say_where(tmp_path / "p.pb.gz", meta, {}, "")
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\r" not in err and "\x07" not in err
    assert "disk full\\x1b[2J\\rfake: line" in err and "partial\\x1b]0;title\\x07" in err


def test_the_webhook_queues_a_burst_of_pod_creations() -> None:
    """socketserver's backlog of 5 made a burst of admission calls wait (and the API server time out)."""
    import socket

    from gpuflame.webhook.server import WebhookServer

    assert WebhookServer.request_queue_size >= 128 and WebhookServer.request_queue_size == socket.SOMAXCONN
