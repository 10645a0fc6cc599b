"""``gpuflame recover``: a SIGKILL'd ``gpuflame run`` left per-process files and no merged profile.

The launcher is killed for real while its program waits on stdin; the
program then ends by itself (its files are final), one child of it was
SIGKILL'd after its first --interval snapshot (partial) and another before
any (lost). Recovering gives each process's bytes and that accounting.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gpuflame.boundary.contract import STARTED_FILE
from gpuflame.cli.main import build_parser
from gpuflame.formats import load
from tests.helpers.children import SRC

PROGRAM = """\
import os, subprocess, sys
import torch
held = torch.ones(1 << 20)  # 4 MiB, live at exit
for wait, interval in (("1", "0.1"), ("0", "0")):  # killed after its first snapshot (partial), or with none (lost)
    subprocess.run([sys.executable, "-c", CHILD, wait], env={**os.environ, "GPUFLAME_INTERVAL": interval})
print(os.getpid(), flush=True)
sys.stdin.read()  # until the test has killed the launcher
"""

CHILD = """\
import os, signal, sys, time
import torch
held = torch.ones(1 << 19)  # 2 MiB
mine = os.path.join(os.environ["GPUFLAME_SESSION_DIR"], f"proc-{os.getpid()}.pb.gz")
for _ in range(12000):  # the snapshot is renamed into place whole (a bound, not a timing: never a hang)
    if sys.argv[1] != "1" or os.path.exists(mine):
        break
    time.sleep(0.01)
os.kill(os.getpid(), signal.SIGKILL)
"""

MIB = 1 << 20


def wait_for_exit(pid: int) -> None:
    """Block until *pid* (not our child: the killed launcher's) has ended."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        assert select.select([fd], [], [], 120)[0], f"pid {pid} did not end"
    finally:
        os.close(fd)


def killed_run(tmp_path: Path, *where: str) -> tuple[Path, int]:
    """``gpuflame run -o run.pb.gz`` (or *where*) SIGKILL'd mid-run; (the -o path, the program's pid) once the
    program ended."""
    script = tmp_path / "job.py"
    script.write_text(f"CHILD = {CHILD!r}\n" + PROGRAM)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLAME_")} | {"PYTHONPATH": SRC}
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpuflame",
            "run",
            "--backend",
            "torch",
            "--interval",
            "100ms",
            *(where or ("-o", "run.pb.gz")),
            script.name,
        ],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    program = int(launcher.stdout.readline())
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    launcher.stdin.close()  # the program reads EOF and ends normally, writing its final profile
    wait_for_exit(program)
    return tmp_path / "run.pb.gz", program


def recover(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLAME_")} | {"PYTHONPATH": SRC}
    return subprocess.run(
        [sys.executable, "-m", "gpuflame", "recover", *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def inuse_by_pid(path: Path) -> dict[int, int]:
    profile = load(path)
    index = profile.type_index("inuse_space")
    out: dict[int, int] = {}
    for sample in profile.samples:
        out[int(sample.label("pid"))] = out.get(int(sample.label("pid")), 0) + sample.values[index]
    return out


@pytest.mark.subprocess
def test_a_killed_run_is_recovered_with_its_bytes_and_its_losses(tmp_path):
    output, program = killed_run(tmp_path)
    assert not output.exists()  # the launcher never merged
    done = recover("run.pb.gz", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    (partial,), (lost,) = summary["partial_processes"], summary["lost_processes"]
    assert summary["processes"] == sorted([program, partial["pid"]])
    assert "SIGKILL" in partial["why"] and "SIGKILL" in lost["why"]
    assert lost["why"] in summary["lost"]
    said = [line.removeprefix("gpuflame: lost: ") for line in done.stderr.splitlines() if "lost: " in line]
    assert said == summary["lost"]
    by_pid = inuse_by_pid(output)
    assert by_pid[program] >= 4 * MIB and 2 * MIB <= by_pid[partial["pid"]] < 4 * MIB, by_pid
    assert not list(output.with_name("run.pb.gz.processes").glob(STARTED_FILE.format(pid="*")))  # tidied


@pytest.mark.subprocess
def test_a_killed_run_of_the_store_is_recovered_in_place(tmp_path):
    _, program = killed_run(tmp_path, "--store", "store")
    (run_dir,) = (tmp_path / "store").iterdir()
    assert not (run_dir / "meta.json").exists()
    done = recover(str(run_dir), cwd=tmp_path)
    assert done.returncode == 0 and str(run_dir / "profile.pb.gz") in done.stderr, done.stderr
    meta = json.loads((run_dir / "meta.json").read_text())  # gpuflame serve lists the run now
    assert meta["profile"] == "profile.pb.gz" and program in meta["processes"] and len(meta["lost_processes"]) == 1
    assert inuse_by_pid(run_dir / "profile.pb.gz")[program] >= 4 * MIB


@pytest.mark.subprocess
def test_recover_refuses_what_is_not_a_run_in_one_line(tmp_path):
    (tmp_path / "empty").mkdir(mode=0o700)
    os.mkfifo(tmp_path / "fifo")  # named, never opened: reading it would wait for a writer
    (tmp_path / "done.pb.gz").write_bytes(b"")  # a one-process run that ended: its folder is gone
    for given, words in (
        ("nowhere", "no such run folder"),
        ("done.pb.gz", "already merged"),
        ("empty", "no per-process files"),
        ("fifo", "a pipe"),
        ("/dev/zero", "a device"),
    ):
        done = recover(given, cwd=tmp_path)
        assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
        assert words in done.stderr and "Traceback" not in done.stderr


@pytest.mark.subprocess
def test_recover_leaves_the_files_of_processes_that_still_run(tmp_path):
    folder = tmp_path / "run.pb.gz.processes"
    folder.mkdir(mode=0o700)
    (folder / STARTED_FILE.format(pid=os.getpid())).write_text("")  # this test's own process: alive
    done = recover("run.pb.gz", "--json", cwd=tmp_path)
    assert done.returncode == 1 and "still run" in done.stderr
    assert (folder / STARTED_FILE.format(pid=os.getpid())).exists()


def test_recover_help_teaches_when_and_how():
    text = build_parser()._subparsers._group_actions[0].choices["recover"].format_help()
    assert "kill -9" in text and "gpuflame recover run.pb.gz" in text and "--json" in text


@pytest.mark.subprocess
@pytest.mark.parametrize("how", ["another user's", "not private", "a link"])
def test_recover_refuses_a_folder_that_is_not_the_users_own_private_one(tmp_path, how):
    """Its files could be anyone's: a planted lost-PID.txt -> /etc/shadow was said on stderr and merged."""
    folder = tmp_path / "run.pb.gz.processes"
    real = tmp_path / "real" if how == "a link" else folder
    real.mkdir(mode=0o755 if how == "not private" else 0o700)
    (real / "lost-1.txt").symlink_to(tmp_path / "secret.txt")
    (tmp_path / "secret.txt").write_text("TOPSECRET\n")
    if how == "another user's":
        os.chown(real, 54_321, 54_321)
    if how == "a link":
        folder.symlink_to(real)
    done = recover("run.pb.gz", cwd=tmp_path)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert "TOPSECRET" not in done.stderr and not (tmp_path / "run.pb.gz").exists()
    words = {"another user's": "owned by another user", "not private": "not private", "a link": "a link"}[how]
    assert words in done.stderr


@pytest.mark.subprocess
def test_recover_never_reads_a_fifo_a_device_or_a_link_in_the_folder(tmp_path):
    """A FIFO hung recover; /dev/zero ended in 'internal error' (exit 3). Neither is a process's file."""
    folder = tmp_path / "run.pb.gz.processes"
    folder.mkdir(mode=0o700)
    os.mkfifo(folder / "proc-1.pb.gz")
    (folder / "proc-2.pb.gz").symlink_to("/dev/zero")
    (folder / "lost-3.txt").symlink_to("/dev/zero")
    os.mkfifo(folder / "lost-4.txt")
    (folder / STARTED_FILE.format(pid=5)).write_text("")  # a process that left nothing: something to recover
    done = recover("run.pb.gz", "--json", cwd=tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert json.loads(done.stdout)["processes"] == [] and "pid 5" in done.stderr
    assert not any(f"pid {pid}" in done.stderr for pid in (1, 2, 3, 4))
