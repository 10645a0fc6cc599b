"""Memory is bounded by what a file builds, not by its size: each command in a child under an address-space cap.

The file of the issue: 50,000 short stacks and one 16,380 frames deep, a
megabyte of folded text, took 6.5 GB in ``report`` and 7.3 GB in ``view``
(every row is padded to the deepest stack) and ended as "internal error"
(exit 3) under a 2 GB cap. Now a view's table is bounded
(``GPUFLAME_MAX_TABLE_CELLS``) and refused in one line before it is made,
and what still runs out of memory (a limit raised, a small cap) is one
line and exit 2, never exit 3 or a traceback. Nothing is timed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuflame import limits

pytestmark = pytest.mark.subprocess

CAP = 2560 << 20  # 2.5 GiB of address space: the interpreter, numpy and rich take ~0.6 of it
SHORT_STACKS = 50_000
DEEP = 16_380

CHILD = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, ({cap}, {cap}))
from gpuflame.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def wide_and_deep(path: Path, short: int = SHORT_STACKS) -> Path:
    lines = [f"main;f{i % 500};g{i} {i + 1}" for i in range(short)]
    lines.append(";".join(f"d{i % 7}" for i in range(DEEP)) + " 1000")
    path.write_text("\n".join(lines) + "\n")
    return path


def gpuflame(*argv: str, cap: int = CAP, **env: str) -> subprocess.CompletedProcess[str]:
    """``gpuflame ARGV`` in a child whose address space is capped at *cap* bytes."""
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLAME_")} | env
    return subprocess.run(
        [sys.executable, "-c", CHILD.format(cap=cap), *argv],
        capture_output=True,
        text=True,
        env=child_env,
        timeout=600,
    )


def assert_one_line(proc: subprocess.CompletedProcess[str], command: str) -> str:
    """Exit 2 with one line on stderr, no traceback, no "internal error"."""
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr[-2000:]
    assert len(proc.stderr.splitlines()) == 1, proc.stderr[-2000:]
    assert proc.stderr.startswith(f"gpuflame {command}: error: ")
    return proc.stderr


@pytest.fixture(scope="module")
def issue_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return wide_and_deep(tmp_path_factory.mktemp("wide") / "wide-deep.folded")


@pytest.mark.parametrize("command", ["report", "view", "flame", "top", "export"])
def test_the_wide_and_deep_file_is_refused_in_one_line(issue_file: Path, tmp_path: Path, command: str) -> None:
    out = {"view": ["-o", str(tmp_path / "p.html")], "export": ["--format", "json", "-o", str(tmp_path / "p.json")]}
    proc = gpuflame(command, str(issue_file), *out.get(command, []))
    err = assert_one_line(proc, command)
    assert "GPUFLAME_MAX_TABLE_CELLS" in err and f"{SHORT_STACKS + 1:,} stacks" in err and f"{DEEP:,}" in err
    assert not list(tmp_path.iterdir())  # nothing written


@pytest.mark.slow
def test_just_under_the_limit_report_and_view_run_within_the_cap(tmp_path: Path) -> None:
    """The same shape with as many short stacks as the default limit allows: it runs, under 2.5 GB of address space."""
    short = limits.TABLE_CELLS.default // DEEP - 1
    path = wide_and_deep(tmp_path / "under.folded", short)
    report = gpuflame("report", str(path))
    assert report.returncode == 0, report.stderr[-2000:]
    assert "d0" in report.stdout
    view = gpuflame("view", str(path), "-o", str(tmp_path / "under.html"))
    assert view.returncode == 0, view.stderr[-2000:]
    assert (tmp_path / "under.html").stat().st_size > 0


def test_out_of_memory_past_a_raised_limit_is_one_line_exit_2(issue_file: Path) -> None:
    """A limit raised past what the cap allows: numpy's MemoryError is one line, exit 2 (it was exit 3)."""
    proc = gpuflame("report", str(issue_file), cap=1280 << 20, GPUFLAME_MAX_TABLE_CELLS=str(10**10))
    assert "out of memory" in assert_one_line(proc, "report")


def test_a_1000_mib_input_under_a_smaller_cap_is_one_line_exit_2(tmp_path: Path) -> None:
    """A 1000 MiB file (sparse: it takes no disk), under the 1 GiB input limit, read under a 900 MiB cap:
    one line, not exit 3. (A larger file is refused by the limit before it is read: test_hostile_files.)"""
    big = tmp_path / "big.pb.gz"
    with open(big, "wb") as f:
        f.truncate(1000 << 20)
    proc = gpuflame("report", str(big), cap=900 << 20)
    err = assert_one_line(proc, "report")
    assert "memory" in err


@pytest.mark.parametrize("special", ["fifo", "/dev/zero", "folder"])
def test_a_file_that_is_not_a_regular_file_is_refused_in_one_line(tmp_path: Path, special: str) -> None:
    """A FIFO with no writer would block the reader forever; /dev/zero never ends."""
    if special == "fifo":
        path = tmp_path / "p.folded"
        os.mkfifo(path)
    elif special == "folder":
        path = tmp_path / "p.pb.gz"
        path.mkdir()
    else:
        path = Path(special)
    for command in ("report", "top"):
        err = assert_one_line(gpuflame(command, str(path)), command)
        assert str(path) in err and ("not a file" in err or "directory" in err)
