"""boundary/session_folder.py: the run's folder by descriptor; nothing followed, blocked on, or trusted unless ours.

Another user's file is made by chown (the tests run as root; the end-to-end
replays with a real second user are tests/e2e/test_run_folder_attacks.py).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuflame.boundary import session_folder
from gpuflame.boundary.session_folder import NotOurs

OTHER = 54_321  # a uid no account uses


@pytest.fixture
def folder(tmp_path: Path) -> Iterator[int]:
    path = tmp_path / "run"
    path.mkdir(mode=0o700)
    fd = session_folder.open_folder(path)
    try:
        yield fd
    finally:
        os.close(fd)


def test_a_folder_is_refused_unless_it_is_the_users_own_and_private(tmp_path: Path) -> None:
    (tmp_path / "open").mkdir(mode=0o755)
    (tmp_path / "other").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "other")
    if os.geteuid() == 0:
        os.chown(tmp_path / "other", OTHER, OTHER)
    for name, words in (("open", "not private (mode 755"), ("link", "a link"), ("other", "owned by another user")):
        if name == "other" and os.geteuid() != 0:
            continue
        with pytest.raises(NotOurs) as refused:
            session_folder.open_folder(tmp_path / name)
        assert words in str(refused.value)
    os.close(session_folder.open_folder(tmp_path / "open", private=False))  # ours: it may be removed


def test_only_regular_files_of_the_user_with_one_name_are_read(tmp_path: Path, folder: int) -> None:
    secret = tmp_path / "secret"
    secret.write_text("secret")
    os.symlink(secret, "link", dir_fd=folder)
    os.mkfifo("fifo", dir_fd=folder)
    os.link(secret, "hard", dst_dir_fd=folder)
    session_folder.create_file(folder, "mine", b"mine")
    refused = ["link", "fifo", "hard"]
    if os.geteuid() == 0:
        session_folder.create_file(folder, "theirs", b"theirs")
        os.chown("theirs", OTHER, OTHER, dir_fd=folder)
        refused.append("theirs")
    assert list(session_folder.own_files(folder)) == ["mine"]
    assert session_folder.read_file(folder, "mine") == b"mine"
    for name in refused:  # the FIFO is opened without blocking, then refused
        with pytest.raises(NotOurs):
            session_folder.read_file(folder, name)
    with pytest.raises(OSError) as big:
        session_folder.read_file(folder, "mine", limit=3)
    assert big.value.errno == errno.EFBIG


def test_writes_never_go_through_a_link_a_fifo_or_a_hard_link(tmp_path: Path, folder: int) -> None:
    victim = tmp_path / "victim"
    victim.write_text("victim")
    os.symlink(victim, "lost-1.txt", dir_fd=folder)
    os.link(victim, "lost-2.txt", dst_dir_fd=folder)
    os.mkfifo("lost-3.txt", dir_fd=folder)
    for name in ("lost-1.txt", "lost-2.txt", "lost-3.txt"):
        with pytest.raises(OSError):  # a FIFO without a reader: ENXIO at once, never a wait
            session_folder.append_text(folder, name, "appended\n")
        with pytest.raises(OSError):
            session_folder.create_file(folder, name, b"made")
    os.symlink(victim, "proc-1.pb.gz", dir_fd=folder)
    os.mkfifo("started-1", dir_fd=folder)
    session_folder.write_file(folder, "proc-1.pb.gz", b"profile")  # the names are replaced, never opened
    session_folder.write_file(folder, "started-1", b"{}")
    assert victim.read_text() == "victim"
    assert session_folder.read_file(folder, "proc-1.pb.gz") == b"profile"
    assert sorted(session_folder.own_files(folder)) == ["proc-1.pb.gz", "started-1"]


def test_a_note_is_appended_to_the_users_own_file(folder: int) -> None:
    for line in ("one\n", "two\n"):
        session_folder.append_text(folder, "lost-9.txt", line)
    assert session_folder.read_file(folder, "lost-9.txt") == b"one\ntwo\n"
    assert session_folder.write_problem(folder) == ""
    assert list(session_folder.own_files(folder)) == ["lost-9.txt"]  # the probe is gone
