"""Never overwrite the program: where an output may go, for every command that writes one.

An output may replace an empty file or a file gpuflame wrote, never an input
(the profiled script, the profile read), a folder, or any other file unless
``--force``; an unwritable path is one line and exit 2 before any work.
``-o -`` writes to standard output and ``-`` reads standard input.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuflame.errors import GpuflameError
from gpuflame.files import check_output
from gpuflame.formats import load, save
from tests.helpers.cli import run
from tests.helpers.guide import guide_profile
from tests.helpers.run_cli import gpuflame_run

SCRIPT = "import torch\nx = torch.zeros(1000)\nprint('ran')\n"


@pytest.fixture()
def profile_file(tmp_path) -> Path:
    path = tmp_path / "guide.pb.gz"
    save(guide_profile(), path)
    return path


def one_error_line(rc: int, err: str, words: str) -> None:
    assert rc == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and "internal error" not in err
    assert words in err


# -- gpuflame run -o ----------------------------------------------------------------


def test_run_refuses_to_write_over_its_own_script(tmp_path):
    script = tmp_path / "exact.py"
    script.write_text(SCRIPT)
    done = gpuflame_run("-o", "exact.py", "exact.py", cwd=tmp_path)
    one_error_line(done.returncode, done.stderr, "exact.py: is an input of this command")
    assert script.read_text() == SCRIPT
    assert "ran" not in done.stdout  # refused before the program started


def test_run_refuses_it_even_with_force(tmp_path):
    script = tmp_path / "exact.py"
    script.write_text(SCRIPT)
    done = gpuflame_run("-o", str(script), "--force", "--", sys.executable, "exact.py", cwd=tmp_path)
    assert done.returncode == 2 and script.read_text() == SCRIPT


@pytest.mark.parametrize(
    "output, words",
    [
        ("/proc/x.pb.gz", "/proc/x.pb.gz: cannot write"),
        ("notes.txt", "notes.txt: exists and is not a file gpuflame wrote"),
        # lines shaped like folded stacks ("word NUMBER"), without the header gpuflame's folded files start with
        ("log.txt", "log.txt: exists and is not a file gpuflame wrote"),
        ("folder", "folder: cannot write: it is a folder"),
    ],
)
def test_run_output_that_cannot_or_must_not_be_written(tmp_path, output, words):
    (tmp_path / "exact.py").write_text(SCRIPT)
    (tmp_path / "notes.txt").write_text("my notes\n")
    (tmp_path / "log.txt").write_text("step 1\nloss 2\n")
    (tmp_path / "folder").mkdir()
    done = gpuflame_run("-o", output, "exact.py", cwd=tmp_path)
    one_error_line(done.returncode, done.stderr, words)
    assert (tmp_path / "notes.txt").read_text() == "my notes\n"
    assert (tmp_path / "log.txt").read_text() == "step 1\nloss 2\n"
    assert os.listdir(tmp_path / "folder") == []


def test_run_store_that_cannot_be_made_is_one_line(tmp_path):
    (tmp_path / "exact.py").write_text(SCRIPT)
    done = gpuflame_run("--store", "/proc/gpuflame-store", "exact.py", cwd=tmp_path)
    one_error_line(done.returncode, done.stderr, "/proc/gpuflame-store: cannot make the folder")


def test_run_replaces_its_own_earlier_profile_and_other_files_with_force(tmp_path):
    (tmp_path / "exact.py").write_text(SCRIPT)
    (tmp_path / "notes.txt").write_text("my notes\n")
    for _ in range(2):  # the second run replaces the first run's profile
        done = gpuflame_run("-o", "out/run.pb.gz", "exact.py", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    assert load(tmp_path / "out/run.pb.gz").totals()["alloc_space"] == 4000
    done = gpuflame_run("-o", "notes.txt", "--force", "exact.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert load(tmp_path / "notes.txt").totals()["alloc_space"] == 4000


# -- the analysis commands ------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["export", "{p}", "-o", "{out}", "--format", "folded"],
        ["convert", "{p}", "-o", "{out}", "--format", "folded"],
        ["view", "{p}", "-o", "{out}"],
        ["view", "{p}", "--svg", "{out}"],
        ["flame", "{p}", "--svg", "{out}"],
    ],
)
def test_commands_refuse_a_file_they_did_not_write_unless_forced(capsys, tmp_path, profile_file, argv):
    out = tmp_path / "script.py"
    out.write_text(SCRIPT)
    args = [a.format(p=profile_file, out=out) for a in argv]
    rc, _, err = run(capsys, *args)
    one_error_line(rc, err, "exists and is not a file gpuflame wrote")
    assert out.read_text() == SCRIPT
    rc, _, err = run(capsys, *args, "--force")
    assert rc == 0, err
    assert out.read_text() != SCRIPT
    rc, _, err = run(capsys, *args)  # now it is gpuflame's: replaced without --force
    assert rc == 0, err


def test_a_speedscope_file_of_another_tool_is_not_replaced_unless_forced(capsys, tmp_path, profile_file):
    """Every speedscope file names the schema: py-spy's was replaced as if gpuflame had written it."""
    theirs = tmp_path / "py-spy.speedscope.json"
    doc = '{"$schema": "https://www.speedscope.app/file-format-schema.json", "exporter": "py-spy@0.3.14"}\n'
    theirs.write_text(doc)
    args = ["export", profile_file, "-o", theirs, "--format", "speedscope"]
    rc, _, err = run(capsys, *args)
    one_error_line(rc, err, "exists and is not a file gpuflame wrote")
    assert theirs.read_text() == doc
    assert run(capsys, *args, "--force")[0] == 0
    rc, _, err = run(capsys, *args)  # gpuflame's own speedscope file: replaced without --force
    assert rc == 0, err


@pytest.mark.parametrize("command", ["export", "convert", "view"])
def test_commands_refuse_to_write_over_their_input(capsys, profile_file, command):
    before = profile_file.read_bytes()
    rc, _, err = run(capsys, command, profile_file, "-o", profile_file, "--force")
    one_error_line(rc, err, "is an input of this command")
    assert profile_file.read_bytes() == before


@pytest.mark.parametrize(
    "argv",
    [
        ["view", "{p}", "-o", "{out}"],  # meant: view {p} {out}, the diff
        ["view", "{p}", "--svg", "{out}"],
        ["flame", "{p}", "--svg", "{out}"],
        ["export", "{p}", "-o", "{out}", "--format", "folded"],
        ["export", "{p}", "-o", "{out}", "--format", "svg"],
    ],
)
def test_a_profile_is_replaced_only_by_a_profile_unless_forced(capsys, tmp_path, profile_file, argv):
    other = tmp_path / "other-run.pb.gz"  # another run's profile: gpuflame wrote it, but it is no page
    save(guide_profile(), other)
    before = other.read_bytes()
    args = [a.format(p=profile_file, out=other) for a in argv]
    rc, _, err = run(capsys, *args)
    one_error_line(rc, err, "other-run.pb.gz: is a profile; refusing to replace it with")
    assert other.read_bytes() == before
    rc, _, err = run(capsys, *args, "--force")
    assert rc == 0, err
    assert other.read_bytes() != before


def test_a_profile_may_replace_an_earlier_profile(capsys, tmp_path, profile_file):
    other = tmp_path / "other-run.pb.gz"
    save(guide_profile(), other)
    rc, _, err = run(capsys, "export", profile_file, "-o", other, "--format", "pprof")
    assert rc == 0, err
    assert load(other).totals() == guide_profile().totals()


@pytest.mark.parametrize("fmt", ["pprof", "folded", "json", "svg"])
def test_an_earlier_output_of_each_format_may_be_replaced(capsys, tmp_path, profile_file, fmt):
    out = tmp_path / "out"
    for _ in range(2):
        rc, _, err = run(capsys, "export", profile_file, "-o", out, "--format", fmt)
        assert rc == 0, err


def test_check_output_tells_a_tar_gz_from_a_profile(tmp_path, profile_file):
    tarball = tmp_path / "data.tar.gz"
    tarball.write_bytes(gzip.compress(b"data.csv" + b"\0" * 500))
    with pytest.raises(GpuflameError, match="not a file gpuflame wrote"):
        check_output(tarball)
    check_output(profile_file)  # a gzip pprof is one of ours
    empty = tmp_path / "empty.pb.gz"
    empty.write_bytes(b"")
    check_output(empty)  # nothing to lose


# -- standard output and input ----------------------------------------------------------


def test_export_to_stdout_and_report_from_stdin(tmp_path, profile_file):
    gpuflame = [sys.executable, "-m", "gpuflame"]
    folded = subprocess.run(
        [*gpuflame, "export", str(profile_file), "-o", "-", "--format", "folded"],
        capture_output=True,
        check=True,
    ).stdout
    want = guide_profile()
    header, *lines = folded.splitlines()
    assert header == b"# gpuflame folded stacks: peak_space (bytes)"
    assert sum(int(line.rsplit(b" ", 1)[1]) for line in lines) == want.totals()["peak_space"]
    pprof = subprocess.run(
        [*gpuflame, "export", str(profile_file), "-o", "-", "--format", "pprof"], capture_output=True, check=True
    ).stdout
    top = subprocess.run([*gpuflame, "top", "-", "--json"], input=pprof, capture_output=True, check=True).stdout
    assert json.loads(top)["total"] == want.totals()["peak_space"]
    assert os.listdir(tmp_path) == ["guide.pb.gz"]  # no file named "-"


def test_export_to_stdout_without_a_format_is_pprof(profile_file):
    """As convert always did: a name that says nothing (``-`` included) means pprof."""
    gpuflame = [sys.executable, "-m", "gpuflame"]
    pprof = subprocess.run([*gpuflame, "export", str(profile_file), "-o", "-"], capture_output=True, check=True)
    assert pprof.stderr == b"" and pprof.stdout[:2] == b"\x1f\x8b"
    top = subprocess.run([*gpuflame, "top", "-", "--json"], input=pprof.stdout, capture_output=True, check=True)
    assert json.loads(top.stdout)["total"] == guide_profile().totals()["peak_space"]


def test_view_from_stdin_needs_a_page_name(tmp_path, profile_file):
    gpuflame = [sys.executable, "-m", "gpuflame"]
    data = profile_file.read_bytes()
    done = subprocess.run([*gpuflame, "view", "-"], input=data, capture_output=True, cwd=tmp_path)
    assert done.returncode == 2 and b"-o OUT.html" in done.stderr
    done = subprocess.run([*gpuflame, "view", "-", "-o", "page.html"], input=data, capture_output=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert b"gpuflame viewer" in (tmp_path / "page.html").read_bytes()


def test_odd_command_words_are_no_inputs(tmp_path):
    out = tmp_path / "run.pb.gz"
    check_output(out, ["x" * 5000, "a\0b", "-c", "print(1)"])  # too long, a NUL: not paths, not an error
    link = tmp_path / "link.py"
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    link.symlink_to(script)
    with pytest.raises(GpuflameError, match="is an input"):
        check_output(link, [str(script)])
