"""The words after ``gpuflame run``'s script or ``-m MODULE`` are the program's own, as with ``python``."""

from __future__ import annotations

import os
import re
import sys

import pytest

from gpuflame.cli.main import build_parser, parse
from gpuflame.cli.run import command_line


@pytest.mark.parametrize(
    ("argv", "program"),
    [
        (["-m", "mod", "--help"], ["-m", "mod", "--help"]),
        (["-o", "r.pb.gz", "-m", "mod", "-h", "-o", "x"], ["-m", "mod", "-h", "-o", "x"]),
        (["--backend", "torch", "-m", "mod", "--", "--help"], ["-m", "mod", "--", "--help"]),
        (["-m", "mod", "serve", "--port", "1"], ["-m", "mod", "serve", "--port", "1"]),
        (["-m", "mod"], ["-m", "mod"]),
    ],
)
def test_the_words_after_a_module_are_the_modules(argv: list[str], program: list[str]) -> None:
    """``run -m mod --help`` printed gpuflame's help; ``python -m mod --help`` asks mod (new-user trial)."""
    args = parse(build_parser(["run"]), ["run", *argv])
    assert command_line(args) == [sys.executable, *program]


def test_a_script_named_m_after_the_script_stays_the_scripts(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    args = parse(build_parser(["run"]), ["run", "-o", "r.pb.gz", "train.py", "-m", "mod", "--help"])
    assert args.module is None
    assert command_line(args) == [sys.executable, "train.py", "-m", "mod", "--help"]


@pytest.mark.parametrize("dashes", [[], ["--"]])
def test_a_command_of_gpuflames_environment_not_on_path_is_named(tmp_path, monkeypatch, dashes) -> None:  # type: ignore[no-untyped-def]
    """`.venv/bin/gpuflame run torchrun ...` with the environment not activated: say where torchrun is."""
    from pathlib import Path

    from gpuflame.errors import GpuflameError

    beside = Path(sys.executable).parent / "torchrun"  # torch's console script, in the test environment
    assert beside.is_file()
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    args = parse(build_parser(["run"]), ["run", *dashes, "torchrun", "--nproc_per_node=2", "t.py"])
    said = re.escape(f"torchrun: not on PATH; gpuflame's environment has {beside}: write gpuflame run -- {beside}")
    with pytest.raises(GpuflameError, match=said):
        command_line(args)


def test_an_executable_that_is_not_python_source_runs_itself(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """`gpuflame run /usr/bin/python3 train.py` ran `python /usr/bin/python3 train.py`: Python read the
    interpreter's ELF binary as a script ("source code cannot contain null bytes"); a shell script too."""
    monkeypatch.chdir(tmp_path)
    shell = tmp_path / "train.sh"
    shell.write_text("#!/bin/sh\nexec python3 train.py\n")
    script = tmp_path / "train"
    script.write_text("#!/usr/bin/env python3\nprint(1)\n")
    plain = tmp_path / "plain.sh"
    plain.write_text("#!/bin/sh\n")
    for path in (shell, script):
        path.chmod(0o755)
    interpreter = os.path.realpath(sys.executable)  # the binary itself, not the environment's link to it
    with open(interpreter, "rb") as f:
        assert f.read(4) == b"\x7fELF"

    def command(*words: str) -> list[str]:
        return command_line(parse(build_parser(["run"]), ["run", *words]))

    assert command(interpreter, "train.py", "--epochs", "1") == [interpreter, "train.py", "--epochs", "1"]
    assert command(sys.executable, "train.py") == [sys.executable, "train.py"]
    assert command("./train.sh", "a") == ["./train.sh", "a"]
    assert command("./train", "a") == [sys.executable, "./train", "a"]  # Python source: this environment's Python
    assert command("plain.sh") == [sys.executable, "plain.sh"]  # not executable: read as a script, as before
