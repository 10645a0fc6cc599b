"""Outputs get the permissions the umask asks for (as ``open`` gives them), or the exact mode a caller needs.

Before: every output was chmod 0644 whatever the umask, so a user's umask 077
(or the node agent's node-wide profiles) came out world-readable.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gpuflame.files import atomic_write
from tests.helpers import paths

SRC = str(paths.SRC)  # this checkout's gpuflame, in every child


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture()
def umask():
    """Set the process umask for one test, put it back after."""
    previous = os.umask(0o022)
    yield os.umask
    os.umask(previous)


@pytest.mark.parametrize(("mask", "expected"), [(0o077, 0o600), (0o022, 0o644), (0o002, 0o664)])
def test_an_atomic_write_gets_what_the_umask_leaves(tmp_path, umask, mask, expected):
    umask(mask)
    atomic_write(tmp_path / "out.txt", "x")
    atomic_write(tmp_path / "out.txt", "y")  # replacing a file: the same
    assert mode_of(tmp_path / "out.txt") == expected
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o000])
def test_an_explicit_mode_is_exact_whatever_the_umask(tmp_path, umask, mask):
    umask(mask)
    atomic_write(tmp_path / "agent.pb.gz", b"x", mode=0o600)
    assert mode_of(tmp_path / "agent.pb.gz") == 0o600


@pytest.mark.subprocess
@pytest.mark.parametrize(("mask", "expected"), [(0o077, 0o600), (0o022, 0o644)])
def test_a_run_writes_every_file_with_the_umask(tmp_path, mask, expected):
    script = tmp_path / "alloc.py"
    # a child process too: the per-process folder stays only where there are several, and its files count
    script.write_text(
        "import subprocess, sys, torch\nx = torch.ones(1000)\n"
        "subprocess.run([sys.executable, '-c', 'import torch; torch.ones(10)'], check=True)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLAME_")}
    env.update(PYTHONPATH=SRC, GPUFLAME_STORE=str(tmp_path / "store"))
    done = subprocess.run(
        [sys.executable, "-m", "gpuflame", "run", "--backend", "torch", str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        umask=mask,
    )
    assert done.returncode == 0, done.stderr
    written = [p for p in (tmp_path / "store").rglob("*") if p.is_file()]
    assert {p.name for p in written} >= {"profile.pb.gz", "meta.json"} and len(written) >= 4, written
    assert {p.name: mode_of(p) for p in written} == {p.name: expected for p in written}


@pytest.mark.parametrize("kind", ["device", "fifo"])
@pytest.mark.parametrize("force", [False, True])
def test_a_device_or_a_pipe_is_never_replaced_by_an_output(tmp_path: Path, kind: str, force: bool) -> None:
    """``-o /dev/null`` put a regular file in the place of /dev/null (an empty read passed for an empty file)."""
    from gpuflame.errors import GpuflameError
    from gpuflame.files import check_output

    target = tmp_path / kind
    if kind == "fifo":
        os.mkfifo(target)  # reading it to sniff its content would block
    else:
        try:
            os.mknod(target, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a /dev/null of its own
        except PermissionError:
            pytest.skip("making a device node needs root")
    with pytest.raises(GpuflameError, match="is a device, a pipe or a socket, not a file"):
        check_output(target, force=force)
    with pytest.raises(GpuflameError, match="is a device, a pipe or a socket, not a file"):
        atomic_write(target, b"profile")
    mode = target.stat().st_mode
    assert stat.S_ISFIFO(mode) if kind == "fifo" else stat.S_ISCHR(mode)
    assert [p.name for p in tmp_path.iterdir()] == [kind]  # no temporary left behind


@pytest.mark.subprocess
def test_convert_to_a_device_says_one_line_and_leaves_it(tmp_path: Path) -> None:
    target = tmp_path / "null"
    try:
        os.mknod(target, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("making a device node needs root")
    snapshot = Path(__file__).parents[2] / "data" / "torch-snapshot-silmont2000-mem_snapshot.pickle.gz"
    result = subprocess.run(
        [sys.executable, "-m", "gpuflame", "convert", str(snapshot), "-o", str(target)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "not a file; refusing" in result.stderr, result.stderr
    assert stat.S_ISCHR(target.stat().st_mode)
