"""A reader that goes away (``gpuflame report x | head``) ends the command quietly, with 0.

rich's console exits with 1 on a broken pipe; render/terminal.py hands the
error to cli/main.py instead. The child's stdout is a pipe whose reading end
is closed before it writes, as ``head`` leaves it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuflame.formats import save
from gpuflame.model import Frame, Profile
from gpuflame.model.profile import SampleType
from tests.helpers import paths


@pytest.mark.subprocess
@pytest.mark.parametrize("command", [["report"], ["top"], ["flame"]])
def test_a_closed_pipe_is_no_error(tmp_path: Path, command: list[str]) -> None:
    profile = Profile(sample_types=[SampleType("inuse_space", "bytes")])
    for i in range(50):
        profile.add([Frame(f"leaf_{i}", "train.py", i + 1), Frame("main", "train.py", 1)], [4096 * (i + 1)])
    save(profile, tmp_path / "p.pb.gz")
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line
    try:
        done = subprocess.run(
            [sys.executable, "-m", "gpuflame", *command, str(tmp_path / "p.pb.gz")],
            stdout=write,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(paths.SRC)},
            timeout=120,
            check=False,
        )
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (0, b"")
