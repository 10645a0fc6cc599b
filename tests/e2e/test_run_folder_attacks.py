"""``gpuflame run -o`` into a shared folder, with another local user planting what they can (issue 38).

The tests run as root; the attacker is a second user, an unused uid reached
with ``setpriv``. The shared folder is a sticky, world-writable one like
``/tmp``. Every attack of the issue is replayed: a run folder the attacker
made beforehand (links to a victim's file and to a secret, a FIFO, 400
roll-call names), names planted while the run runs, the same names planted
by the program itself inside its own folder (nothing there is followed,
blocked on or counted unless it is a regular file of the run's user), and a
second run with the same ``-o``. Each checks that the victim's file is
unchanged, the secret reaches neither stderr nor the profile, and nothing
hangs (generous timeouts, never a timing).
"""

from __future__ import annotations

import gzip
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.run_cli import gpuflame_run, write

ATTACKER = 54_321  # a uid no account uses (checked below)
SECRET = "TOPSECRET-9f3c1e"
VICTIM_TEXT = "the victim's own file\n"
PROGRAM = """
import os, sys, torch
held = torch.ones(1000)
print("ran", flush=True)
"""

pytestmark = pytest.mark.subprocess


def _attacker_ready() -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv (util-linux) to act as a second user")
    try:
        import pwd

        pwd.getpwuid(ATTACKER)
        pytest.skip(f"uid {ATTACKER} belongs to an account here")
    except KeyError:
        pass


@pytest.fixture
def shared() -> Iterator[Path]:
    """A sticky folder every user may write in, like /tmp (pytest's own tmp_path is root's alone)."""
    _attacker_ready()
    folder = Path(tempfile.mkdtemp(prefix="gpuflame-shared-", dir="/tmp"))
    folder.chmod(0o1777)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def victim(tmp_path: Path) -> tuple[Path, Path]:
    """(a 0600 file of root's the attacker wants changed, a 0600 file of root's the attacker wants read)."""
    mine, secret = tmp_path / "victim.txt", tmp_path / "secret.txt"
    mine.write_text(VICTIM_TEXT)
    secret.write_text("".join(f"{SECRET} line {i}\n" for i in range(25)))
    for path in (mine, secret):
        path.chmod(0o600)
    return mine, secret


def as_attacker(script: str, cwd: Path) -> subprocess.CompletedProcess:
    """A shell *script* run as the second user (no groups, no capabilities)."""
    return subprocess.run(
        ["setpriv", f"--reuid={ATTACKER}", f"--regid={ATTACKER}", "--clear-groups", "sh", "-c", script],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def profile_text(path: Path) -> str:
    return gzip.decompress(path.read_bytes()).decode("latin-1")


def test_a_run_folder_another_user_made_is_refused_before_the_program_starts(shared, victim, tmp_path):
    mine, secret = victim
    planted = as_attacker(
        f"""set -e
        mkdir out.pb.gz.processes && chmod 777 out.pb.gz.processes && cd out.pb.gz.processes
        ln -s {mine} peak-cpu.table && ln -s {secret} lost-1.txt && ln -s {mine} lost-2.txt
        ln -s {mine} idle-3.txt && mkfifo started-4
        i=100; while [ $i -lt 500 ]; do : > started-$i; i=$((i+1)); done
        """,
        shared,
    )
    assert planted.returncode == 0, planted.stderr
    script = write(tmp_path / "job.py", PROGRAM)
    done = gpuflame_run("-o", str(shared / "out.pb.gz"), str(script), cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == "", (done.stdout, done.stderr)
    (line,) = done.stderr.splitlines()
    assert "out.pb.gz.processes" in line and f"owned by another user (uid {ATTACKER})" in line, line
    assert mine.read_text() == VICTIM_TEXT and SECRET not in done.stderr
    assert not (shared / "out.pb.gz").exists()


def test_a_link_in_the_place_of_the_run_folder_is_refused(shared, victim, tmp_path):
    mine, _ = victim
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    assert as_attacker(f"ln -s {target} out.pb.gz.processes", shared).returncode == 0
    done = gpuflame_run("-o", str(shared / "out.pb.gz"), str(write(tmp_path / "job.py", PROGRAM)), cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == "" and len(done.stderr.splitlines()) == 1, done.stderr
    assert "a link or a file, not a folder" in done.stderr
    assert os.listdir(target) == []


def test_the_run_folder_is_private_and_the_other_user_plants_nothing_in_it(shared, victim, tmp_path):
    """The issue's race: names planted right after the launcher made the folder, while the program runs."""
    mine, secret = victim
    script = write(
        tmp_path / "waits.py",
        PROGRAM,
        """
    print(os.getpid(), os.environ["GPUFLAME_SESSION_DIR"], flush=True)
    sys.stdin.read()  # until the attacker has tried
    """,
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLAME_")}
    run = subprocess.Popen(
        [sys.executable, "-m", "gpuflame", "run", "-o", str(shared / "out.pb.gz"), str(script)],
        cwd=tmp_path,
        env=env | {"GPUFLAME_STORE": str(tmp_path / "store")},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert run.stdout.readline() == "ran\n"
        pid, folder = run.stdout.readline().split()
        st = os.stat(folder, follow_symlinks=False)
        assert stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o700
        attempts = [
            f"ln -s {mine} {folder}/peak-cpu.table",
            f"ln -s {secret} {folder}/lost-1.txt",
            f"ln -s {mine} {folder}/lost-{pid}.txt",
            f"ln -s {mine} {folder}/idle-{pid}.txt",
            f"mkfifo {folder}/started-{int(pid) + 1}",
            f"touch {folder}/started-1",
            f"ls {folder}",
        ]
        tried = as_attacker("; ".join(f"{a} 2>/dev/null && echo planted || echo denied" for a in attempts), shared)
        assert tried.stdout.split() == ["denied"] * len(attempts), tried.stdout
    finally:
        out, err = run.communicate("", timeout=180)
    assert run.returncode == 0, err
    assert "profile of 1 process" in err and "lost" not in err, err
    assert mine.read_text() == VICTIM_TEXT and SECRET not in err + out
    assert SECRET not in profile_text(shared / "out.pb.gz")


def test_names_planted_in_the_run_folder_are_never_followed_blocked_on_or_counted(shared, victim, tmp_path):
    """Inside its folder only the run's user can plant (the program itself here): links to the victim's files
    and the secret, a FIFO as the program's own roll-call name, 400 roll-call names, another user's file."""
    mine, secret = victim
    bashrc = tmp_path / "bashrc"
    bashrc.write_text(VICTIM_TEXT)
    script = write(
        tmp_path / "plants.py",
        f"""
    import os, sys
    folder, pid = os.environ["GPUFLAME_SESSION_DIR"], os.getpid()
    def at(name):
        return os.path.join(folder, name)
    os.symlink({str(mine)!r}, at("peak-cpu.table"))  # the shared peak table
    os.symlink({str(bashrc)!r}, at(f"lost-{{pid}}.txt"))  # the process appends what it lost here
    os.symlink({str(mine)!r}, at(f"idle-{{pid}}.txt"))
    os.mkfifo(at(f"started-{{pid}}"))  # its own roll-call name: registering must not block on it
    os.symlink({str(secret)!r}, at("lost-1.txt"))  # the launcher must not read these
    os.symlink({str(secret)!r}, at("proc-1.pb.gz"))
    os.mkfifo(at("proc-2.pb.gz"))
    for n in range(100, 500):
        os.symlink("/nonexistent", at(f"started-{{n}}"))
    with open(at("lost-3.txt"), "w") as other:
        other.write({SECRET!r} + "\\n")
    os.chown(at("lost-3.txt"), {ATTACKER}, {ATTACKER})  # a regular file, but not the run's user's
    import torch
    held = torch.ones(1000)
    print("ran", flush=True)
    """,
    )
    done = gpuflame_run("-o", str(shared / "out.pb.gz"), "--backend", "torch", str(script), cwd=tmp_path)
    assert done.returncode == 0 and done.stdout == "ran\n", done.stderr
    assert "profile of 1 process" in done.stderr and "nothing" not in done.stderr, done.stderr
    assert mine.read_text() == VICTIM_TEXT and bashrc.read_text() == VICTIM_TEXT
    assert SECRET not in done.stderr and SECRET not in profile_text(shared / "out.pb.gz")


def test_a_second_run_with_the_same_output_refuses_while_the_first_runs(tmp_path):
    script = write(tmp_path / "waits.py", PROGRAM, "\nsys.stdin.read()\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLAME_")}
    first = subprocess.Popen(
        [sys.executable, "-m", "gpuflame", "run", "-o", "out.pb.gz", str(script)],
        cwd=tmp_path,
        env=env | {"GPUFLAME_STORE": str(tmp_path / "store")},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert first.stdout.readline() == "ran\n"
        second = gpuflame_run("-o", "out.pb.gz", str(write(tmp_path / "job.py", PROGRAM)), cwd=tmp_path)
        assert second.returncode == 2 and second.stdout == "", second.stderr
        (line,) = second.stderr.splitlines()
        assert "out.pb.gz.processes" in line and "still running" in line, line
        recovered = subprocess.run(
            [sys.executable, "-m", "gpuflame", "recover", "out.pb.gz"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert recovered.returncode == 2 and "still running" in recovered.stderr, recovered.stderr
    finally:
        _, err = first.communicate("", timeout=180)
    assert first.returncode == 0 and "profile of 1 process" in err, err
    again = gpuflame_run("-o", "out.pb.gz", str(write(tmp_path / "job.py", PROGRAM)), cwd=tmp_path)
    assert again.returncode == 0 and "profile of 1 process" in again.stderr, again.stderr


def test_a_previous_run_folder_of_the_same_user_is_made_anew(tmp_path):
    """Its files are the last run's: they must not join this one (and anything gpuflame did not write stays)."""
    folder = tmp_path / "out.pb.gz.processes"
    folder.mkdir(mode=0o755)  # as an earlier gpuflame left it
    (folder / "proc-999999.pb.gz").write_bytes(b"last run")
    (folder / "started-999998").write_text("")
    done = gpuflame_run("-o", "out.pb.gz", str(write(tmp_path / "job.py", PROGRAM)), cwd=tmp_path)
    assert done.returncode == 0 and "profile of 1 process" in done.stderr and "999" not in done.stderr, done.stderr
    assert not folder.exists()  # the earlier run's files gone; this run's one process leaves one output
    folder.mkdir(mode=0o700)
    (folder / "notes.txt").write_text("mine")  # the user keeps something of their own there
    kept = gpuflame_run("-o", "out.pb.gz", str(write(tmp_path / "job.py", PROGRAM)), cwd=tmp_path)
    assert kept.returncode == 2 and "notes.txt" in kept.stderr and len(kept.stderr.splitlines()) == 1
    assert (folder / "notes.txt").read_text() == "mine"


def test_the_notes_the_program_writes_are_read_within_bounds(tmp_path):
    """A note is a few lines: a 40 MB one (the program's own) took 28.7 s, 3.04 GB and 160 MB of stderr."""
    from gpuflame.launch.collect import NOTE_BYTES, NOTE_LINES

    script = write(
        tmp_path / "notes.py",
        f"""
    import os, torch
    folder, pid = os.environ["GPUFLAME_SESSION_DIR"], os.getpid()
    with open(os.path.join(folder, "lost-1.txt"), "wb") as big:
        big.truncate({NOTE_BYTES + 1})  # sparse: no disk, all zeros
    with open(os.path.join(folder, f"lost-{{pid}}.txt"), "w") as many:
        many.write("".join(f"line {{n}}\\n" for n in range({NOTE_LINES + 400})))
    with open(os.path.join(folder, f"idle-{{pid}}.txt"), "wb") as idle:
        idle.truncate({NOTE_BYTES + 1})
    held = torch.ones(1000)
    """,
    )
    done = gpuflame_run("-o", "out.pb.gz", "--backend", "torch", str(script), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"lost-1.txt cannot be read (larger than {NOTE_BYTES:,} bytes)" in done.stderr, done.stderr
    assert f"line {NOTE_LINES - 1}\n" in done.stderr and f"line {NOTE_LINES}\n" not in done.stderr
    assert "... and 400 more lines of its note" in done.stderr
    assert len(done.stderr) < 3 * NOTE_BYTES and "\\x00" not in done.stderr


def test_the_notes_of_many_processes_are_read_up_to_a_bound(tmp_path):
    """Each note line is a line on stderr and a comment, compared with the others: 1,000 planted notes of 100
    lines kept the launcher busy past 150 s, and would make a profile past GPUFLAME_MAX_COMMENTS."""
    from gpuflame.formats import load
    from gpuflame.launch.collect import NOTE_LINES, NOTES_SHOWN

    read = NOTES_SHOWN // NOTE_LINES
    script = write(
        tmp_path / "notes.py",
        f"""
    import os, torch
    folder = os.environ["GPUFLAME_SESSION_DIR"]
    for pid in range(100_000, 100_000 + {read + 5}):
        with open(os.path.join(folder, f"lost-{{pid}}.txt"), "w") as note:
            note.write("".join(f"note {{pid}} line {{n}}\\n" for n in range({NOTE_LINES})))
    held = torch.ones(1000)
    """,
    )
    done = gpuflame_run("-o", "out.pb.gz", "--backend", "torch", str(script), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "... and the notes of 5 more processes, not read" in done.stderr
    assert f"note {100_000 + read - 1} line {NOTE_LINES - 1}\n" in done.stderr
    assert f"note {100_000 + read} " not in done.stderr
    assert len(load(tmp_path / "out.pb.gz").comments) < NOTES_SHOWN + 50  # it reads back
