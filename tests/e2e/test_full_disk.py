"""A full or read-only disk never breaks the profiled program, and the run says what it lost and why.

Real filesystems: a small tmpfs mounted for the test (skipped where mounting
is not permitted), filled by the program itself or remounted read-only.
Before the fix the shared peak table was only sized (``ftruncate``) and the
program died of SIGBUS (exit 135) on a full disk, and the run said "torch
was never imported".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuflame.boundary import roll_call, session_folder
from gpuflame.boundary.contract import STARTED_FILE, child_env
from gpuflame.boundary.settings import Settings
from gpuflame.launch.collect import RunEnd, collect
from gpuflame.launch.folder import Held
from gpuflame.launch.roll_call import unfinished
from gpuflame.launch.store import RunMeta
from tests.helpers.children import SRC, said_lost
from tests.helpers.run_cli import gpuflame_run

FILL_THEN_ALLOCATE = """\
import sys
try:
    with open(sys.argv[1] + "/filler", "wb") as f:
        while True:
            f.write(bytes(65536))
except OSError:
    pass
import torch
x = torch.ones(1000, 1000)
print("program ok")
"""

ALLOCATE = "import torch\nx = torch.ones(1000, 1000)\nprint('program ok')\n"


@pytest.fixture()
def small_fs(tmp_path: Path):
    """A 1 MiB tmpfs of the test's own, private (a tmpfs is 1777 by default, and a run's folder is 700)."""
    yield from tmpfs(tmp_path / "fs", "size=1m,mode=700")


@pytest.fixture()
def one_inode_fs(tmp_path: Path):
    """A tmpfs with room for one more file or folder."""
    yield from tmpfs(tmp_path / "fs", "size=1m,nr_inodes=2")


def tmpfs(point: Path, options: str):
    point.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    yield point
    subprocess.run(["umount", "-l", str(point)], capture_output=True, check=False)


def read_only(point: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(point)], check=True, capture_output=True)


@pytest.mark.parametrize("hook", ["allocator", "dispatch"])
def test_a_full_disk_keeps_the_program_and_says_what_was_lost(tmp_path, small_fs, hook):
    script = tmp_path / "fill.py"
    script.write_text(FILL_THEN_ALLOCATE)
    done = gpuflame_run(
        "--json",
        "--backend",
        "torch",
        "--torch-hook",
        hook,
        "-o",
        str(small_fs / "run.pb.gz"),
        str(script),
        str(small_fs),
        cwd=tmp_path,
        env={"PYTHONPATH": SRC},
    )
    assert done.returncode == 0, done.stderr  # not 135 (SIGBUS)
    assert done.stdout.splitlines()[0] == "program ok"
    summary = json.loads(done.stdout.splitlines()[-1])
    table = [line for line in done.stderr.splitlines() if "no joint peak" in line]
    assert len(table) == 1 and "No space left on device" in table[0], done.stderr
    assert "imported" not in done.stderr
    assert summary["lost"] == said_lost(done.stderr)
    assert any("No space left on device" in message for message in summary["lost"]), summary


def test_a_read_only_session_folder_is_said_once_per_loss_with_its_cause(tmp_path, small_fs):
    session = small_fs / "session"
    session.mkdir(mode=0o700)
    read_only(small_fs)
    script = tmp_path / "alloc.py"
    script.write_text(ALLOCATE)
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLAME_")} | {"PYTHONPATH": SRC}
    env = child_env(Settings(enabled=True, session_dir=str(session), backend="torch", torch_hook="allocator"), base)
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0 and done.stdout == "program ok\n", done.stderr
    said = [line for line in done.stderr.splitlines() if line.startswith("gpuflame: ") and "compiling" not in line]
    assert len(said) == len(set(said)) == 3, done.stderr  # the peak table, the roll call, the profile
    assert all("Read-only file system" in line for line in said), done.stderr


def test_a_read_only_run_folder_is_the_reason_not_how_the_process_ended(tmp_path, small_fs):
    (small_fs / STARTED_FILE.format(pid=4321)).write_text("")  # registered, then the folder went read-only
    read_only(small_fs)
    meta = RunMeta(command=["x"], started=0.0)
    folder = Held(small_fs, session_folder.open_folder(small_fs))
    try:
        assert collect(folder, small_fs / "out.pb.gz", meta, RunEnd(4321, 0, {}, 0.0)) is None
    finally:
        folder.close()
    assert "Read-only file system" in meta.lost[0]
    assert meta.lost_processes == [{"pid": 4321, "why": "pid 4321: nothing could be written (Read-only file system)"}]
    assert not any("os._exit" in message for message in meta.lost)


def test_the_roll_call_registers_on_a_full_disk(small_fs):
    with open(small_fs / "filler", "wb") as f, pytest.raises(OSError):
        while True:
            f.write(bytes(65536))
            f.flush()
    assert roll_call.register(str(small_fs), 4321) == ""
    folder = session_folder.open_folder(small_fs)
    try:
        assert unfinished(folder) == [4321]
    finally:
        os.close(folder)


def test_a_store_that_fills_up_while_the_run_folder_is_made_is_one_line(tmp_path, one_inode_fs):
    script = tmp_path / "alloc.py"
    script.write_text(ALLOCATE)
    done = gpuflame_run("--store", str(one_inode_fs), str(script), cwd=tmp_path, env={"PYTHONPATH": SRC})
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr  # not "internal error", exit 3
    assert "No space left on device" in done.stderr and "program ok" not in done.stdout
    assert list(one_inode_fs.iterdir()) == []  # the run folder made before it is gone again
