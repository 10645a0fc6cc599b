"""``gpuflame run`` at the edges of a process's life: signals during the exit write, os._exit, SIGKILL, Ctrl-C.

Every test runs real Python processes with real torch (CPU) under
``python -m gpuflame run`` and checks exact bytes, the exit status the
program would have had without gpuflame, and that every process is either
in the profile or named, with the reason, as lost or partial.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuflame.formats import load
from tests.helpers.run_cli import ALLOCATE, KIB, bytes_by_function, gpuflame_run, write

POOL = """
import multiprocessing as mp, os, sys, time, torch

def work(kib):
    keep = torch.zeros(kib * 256)  # kib KiB of float32, freed when the task returns
    time.sleep(0.3)  # long enough that each worker takes a task
    return os.getpid(), kib

if __name__ == "__main__":
    ctx = mp.get_context(sys.argv[1])
    with ctx.Pool(3) as pool:  # leaving the block terminate()s the workers: SIGTERM while they exit
        done = pool.map(work, [16, 32, 48], chunksize=1)
    for pid, kib in done:
        print(pid, kib, flush=True)
"""


def summary(result: subprocess.CompletedProcess) -> dict:
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_pool_workers_terminated_while_writing_keep_their_profile(tmp_path: Path, method: str) -> None:
    """``with Pool(): pool.map(...)``: terminate() SIGTERMs workers inside their exit write (5 of 6 runs lost one)."""
    script = write(tmp_path / "pool.py", POOL)
    result = gpuflame_run("--json", "-o", "pool.pb.gz", script.name, method, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    worked: dict[int, int] = {}
    for line in result.stdout.strip().splitlines()[:-1]:
        pid, kib = (int(w) for w in line.split())
        worked[pid] = worked.get(pid, 0) + kib * KIB
    run = summary(result)
    assert set(worked) <= set(run["processes"]), result.stderr
    assert run["lost"] == [] and run["lost_processes"] == [], result.stderr
    profile = load(tmp_path / "pool.pb.gz")
    for pid, expected in worked.items():
        assert bytes_by_function(profile, "alloc_space", pid=pid).get("work") == expected, pid
        assert bytes_by_function(profile, "peak_space", pid=pid).get("work") == max(
            kib * KIB for p, kib in _tasks(result) if p == pid
        )


def _tasks(result: subprocess.CompletedProcess) -> list[tuple[int, int]]:
    return [tuple(int(w) for w in line.split()) for line in result.stdout.strip().splitlines()[:-1]]  # type: ignore


SWEEP = """
import os, signal, sys, time, torch

# Forked children end normally (their exit hooks write) while the parent
# SIGTERMs each one a little later than the last: 0 to 78 ms after it said
# it was done, so some signals land before the exit write, some during it
# (or at its first line), some after the child is gone.
results = []
for step in range(40):
    read, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        keep = torch.zeros((step + 1) * 256)  # (step + 1) KiB
        os.write(write_end, b"x")
        sys.exit(0)
    os.read(read, 1)
    time.sleep(step * 0.002)
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    _, status = os.waitpid(pid, 0)
    results.append((pid, step + 1, os.waitstatus_to_exitcode(status)))
for pid, kib, code in results:
    print(pid, kib, code, flush=True)
"""


@pytest.mark.slow
def test_sigterm_swept_across_the_normal_end_never_loses_a_profile(tmp_path: Path) -> None:
    script = write(tmp_path / "sweep.py", SWEEP)
    result = gpuflame_run("--json", "-o", "sweep.pb.gz", script.name, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    run = summary(result)
    assert run["lost"] == [], result.stderr
    profile = load(tmp_path / "sweep.pb.gz")
    codes = set()
    for line in result.stdout.strip().splitlines()[:-1]:
        pid, kib, code = (int(w) for w in line.split())
        codes.add(code)
        assert code in (0, -signal.SIGTERM)  # ended normally, or died of the signal: never another status
        assert bytes_by_function(profile, "inuse_space", pid=pid).get("<module>") == kib * KIB, (pid, code)
    assert -signal.SIGTERM in codes  # the sweep did reach processes still writing


# waits until n --interval snapshots of this process were written (each a new file renamed into place):
# with n=2 the second began after the first ended, so it holds what was allocated before the wait,
# however slow the machine
WAIT_FOR_SNAPSHOTS = """
def wait_for_snapshots(n):
    snapshot = os.path.join(os.environ.get("GPUFLAME_SESSION_DIR", ""), f"proc-{os.getpid()}.pb.gz")
    def written():
        try:
            return os.stat(snapshot).st_ino
        except OSError:
            return None
    seen, changes, guard = written(), 0, time.monotonic() + 120  # a guard against a hang, not a measure
    while changes < n and time.monotonic() < guard:
        time.sleep(0.01)
        now = written()
        changes, seen = changes + (now is not None and now != seen), now
"""

OS_EXIT = """
import os, sys, time, torch
{wait}
def build(kib):
    return torch.zeros(kib * 256)

parent_keep = build(8)
pid = os.fork()
if pid == 0:
    child_keep = build(24)
    if {child_waits}:
        wait_for_snapshots(2)
    os._exit(0)  # no exit hooks: nothing is written here
os.waitpid(pid, 0)
print(pid, flush=True)
"""


def os_exit_script(child_waits: bool) -> str:
    """A parent that forks a child which allocates and leaves by os._exit (after two snapshots, if it waits)."""
    return OS_EXIT.format(wait=WAIT_FOR_SNAPSHOTS, child_waits=child_waits)


@pytest.mark.slow
def test_an_os_exit_child_is_named_as_lost_and_not_counted(tmp_path: Path) -> None:
    script = write(tmp_path / "forks.py", os_exit_script(child_waits=False))
    result = gpuflame_run("-o", "f.pb.gz", script.name, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    child = int(result.stdout.split()[0])
    assert (
        f"gpuflame: lost: pid {child}: nothing could be written: it ended by os._exit(), SIGKILL or a crash"
        in result.stderr
    )
    assert "--interval 10s keeps a snapshot" in result.stderr
    assert "profile of 1 of 2 processes (1 lost: see above)" in result.stderr
    profile = load(tmp_path / "f.pb.gz")
    assert profile.label_values("pid") == [str(_parent(profile, child))]
    assert any(f"pid {child}: nothing could be written" in c for c in profile.comments)
    json_run = gpuflame_run("--json", "-o", "g.pb.gz", script.name, cwd=tmp_path)
    (lost,) = summary(json_run)["lost_processes"]
    assert lost["pid"] == int(json_run.stdout.split()[0]) and "os._exit()" in lost["why"]


def _parent(profile, child: int) -> int:
    (pid,) = [int(p) for p in profile.label_values("pid") if int(p) != child]
    return pid


@pytest.mark.slow
def test_with_interval_the_last_snapshot_of_an_os_exit_child_is_kept_and_marked_partial(tmp_path: Path) -> None:
    script = write(tmp_path / "forks.py", os_exit_script(child_waits=True))
    result = gpuflame_run("--json", "--interval", "100ms", "-o", "i.pb.gz", script.name, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    child = int(result.stdout.split()[0])
    run = summary(result)
    assert run["lost_processes"] == [] and child in run["processes"]
    (partial,) = run["partial_processes"]
    assert partial["pid"] == child
    assert partial["missing_s"] >= 0  # how long after the last snapshot it ended: the machine's load decides
    assert f"pid {child}: partial: its profile stops at the last --interval snapshot, " in partial["why"]
    assert "s before the process ended; the final profile was never written" in partial["why"]
    assert partial["why"] in result.stderr
    profile = load(tmp_path / "i.pb.gz")
    assert bytes_by_function(profile, pid=child)["build"] == 24 * KIB
    assert partial["why"] in profile.comments


@pytest.mark.slow
def test_sigkill_keeps_the_last_interval_snapshot_and_says_so(tmp_path: Path) -> None:
    # no sleep: with "wait", the program waits until two --interval snapshots were written after its
    # allocation (the second began after the first ended, so it holds the 40 KiB), however slow the machine
    script = write(
        tmp_path / "killed.py",
        ALLOCATE,
        WAIT_FOR_SNAPSHOTS,
        """
    import signal, time
    kept = Holder().make(40)
    if sys.argv[1:] == ["wait"]:
        wait_for_snapshots(2)
    os.kill(os.getpid(), signal.SIGKILL)
    """,
    )
    result = gpuflame_run("--json", "--interval", "100ms", "-o", "k.pb.gz", script.name, "wait", cwd=tmp_path)
    assert result.returncode == -signal.SIGKILL
    (partial,) = summary(result)["partial_processes"]
    assert "the final profile was never written (it was killed by SIGKILL)" in partial["why"]
    assert bytes_by_function(load(tmp_path / "k.pb.gz"))["Holder > make"] == 40 * KIB
    without = gpuflame_run("-o", "n.pb.gz", script.name, cwd=tmp_path)
    assert without.returncode == -signal.SIGKILL
    assert "nothing could be written: it was killed by SIGKILL before its exit hooks ran" in without.stderr
    assert "no profile was written: see what was lost above" in without.stderr
    assert not (tmp_path / "n.pb.gz.processes").exists()  # no empty folder left behind


@pytest.mark.slow
def test_ctrl_c_ends_the_run_by_sigint_as_plain_python_does_and_keeps_the_profile(tmp_path: Path) -> None:
    script = write(
        tmp_path / "waiting.py",
        ALLOCATE,
        """
    import time
    kept = Holder().make(12)
    print("waiting", flush=True)
    time.sleep(60)
    """,
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLAME_") and k != "PYTHONPATH"}
    env["GPUFLAME_STORE"] = str(tmp_path / "store")
    codes = {}
    for how in ("python", "gpuflame"):
        launcher = [sys.executable] if how == "python" else [sys.executable, "-m", "gpuflame", "run", "-o", "c.pb.gz"]
        proc = subprocess.Popen(
            [*launcher, script.name], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        assert proc.stdout is not None and proc.stdout.readline().strip() == "waiting"
        time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=60)
        codes[how] = code
    assert codes == {"python": -signal.SIGINT, "gpuflame": -signal.SIGINT}  # died of SIGINT: a shell script stops
    assert bytes_by_function(load(tmp_path / "c.pb.gz"))["Holder > make"] == 12 * KIB


def test_a_negative_interval_is_named_not_taken_for_an_option(tmp_path: Path) -> None:
    result = gpuflame_run("--interval", "-5s", "x.py", cwd=tmp_path)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert "an interval cannot be negative: '-5s'" in line and "expected one argument" not in line


def test_a_run_without_a_profile_leaves_no_empty_folder_nor_a_meta_naming_a_missing_file(tmp_path: Path) -> None:
    script = write(tmp_path / "plain.py", "print('no framework here')\n")
    with_output = gpuflame_run("-o", "none.pb.gz", script.name, cwd=tmp_path)
    assert with_output.returncode == 0
    assert "no profile was written: no process imported torch or jax (--backend auto)" in with_output.stderr
    assert not (tmp_path / "none.pb.gz.processes").exists() and not (tmp_path / "none.pb.gz").exists()
    stored = gpuflame_run("--json", script.name, cwd=tmp_path)
    (run_dir,) = (tmp_path / "store").iterdir()
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["profile"] is None and summary(stored)["profile"] is None
    assert sorted(p.name for p in run_dir.iterdir()) == ["meta.json"]


def test_the_wrong_backend_says_what_was_imported_instead(tmp_path: Path) -> None:
    script = write(tmp_path / "torchonly.py", ALLOCATE, "\nkept = Holder().make(4)\nprint(os.getpid())\n")
    result = gpuflame_run("-o", "w.pb.gz", "--backend", "jax", script.name, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    pid = result.stdout.strip()
    assert (
        f"gpuflame: no profile was written: jax was never imported (--backend jax); "
        f"pid {pid} imported torch, which --backend jax does not record"
    ) in result.stderr


def test_fork_children_that_run_another_program_are_not_taken_for_lost(tmp_path: Path) -> None:
    """``subprocess`` with a preexec_fn and ``os.fork()`` + ``os.execvp()`` run our fork hook, then exec."""
    script = write(
        tmp_path / "execs.py",
        ALLOCATE,
        """
    import subprocess
    kept = Holder().make(4)
    subprocess.run(["true"], preexec_fn=lambda: None, check=True)
    pid = os.fork()
    if pid == 0:
        os.execvp("true", ["true"])
    os.waitpid(pid, 0)
    """,
    )
    result = gpuflame_run("--json", "-o", "e.pb.gz", script.name, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    run = summary(result)
    assert run["lost"] == [] and run["lost_processes"] == [] and len(run["processes"]) == 1, result.stderr
    assert bytes_by_function(load(tmp_path / "e.pb.gz"))["Holder > make"] == 4 * KIB


@pytest.mark.slow
def test_ctrl_c_at_a_terminal_interrupts_the_program_once(tmp_path: Path) -> None:
    """A real terminal (a pty): Ctrl-C reaches the launcher and the program; the program must see one SIGINT."""
    import pty

    script = write(
        tmp_path / "waiting.py",
        ALLOCATE,
        """
    import time
    kept = Holder().make(12)
    try:
        print("waiting", flush=True)  # inside the try: a Ctrl-C read right after it lands here, however slow
        time.sleep(60)
    except KeyboardInterrupt:
        print("interrupted once", flush=True)
        time.sleep(1)  # a second SIGINT (forwarded by the launcher) would land here
        raise
    """,
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLAME_") and k != "PYTHONPATH"}
    pid, master = pty.fork()
    if pid == 0:  # pragma: no cover - the child becomes the launcher
        os.chdir(tmp_path)
        os.execve(sys.executable, [sys.executable, "-m", "gpuflame", "run", "-o", "t.pb.gz", script.name], env)
    seen = b""
    while b"waiting" not in seen:
        seen += os.read(master, 1024)
    os.write(master, b"\x03")  # Ctrl-C
    while True:
        try:
            chunk = os.read(master, 1024)
        except OSError:  # the terminal closed: everyone has exited
            break
        if not chunk:
            break
        seen += chunk
    _, status = os.waitpid(pid, 0)
    text = seen.decode(errors="replace")
    assert os.waitstatus_to_exitcode(status) == -signal.SIGINT, text
    assert "interrupted once" in text and text.count("KeyboardInterrupt") == 1, text
    assert bytes_by_function(load(tmp_path / "t.pb.gz"))["Holder > make"] == 12 * KIB


def test_an_api_block_inside_a_run_leaves_both_profiles(tmp_path: Path) -> None:
    """The run's session and the API's share the process's exit hooks: the block ending must not drop the run's."""
    script = write(
        tmp_path / "both.py",
        ALLOCATE,
        """
    import gpuflame
    whole = Holder().make(16)
    with gpuflame.profile("block.pb.gz"):
        part = Holder().make(4)
    """,
    )
    result = gpuflame_run("-o", "whole.pb.gz", script.name, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert bytes_by_function(load(tmp_path / "whole.pb.gz"))["Holder > make"] == 20 * KIB
    assert bytes_by_function(load(tmp_path / "block.pb.gz"))["Holder > make"] == 4 * KIB


SIGTERM_ON_ANOTHER_THREAD = """
import signal, threading, time, torch
kept = torch.zeros(64 * 256)  # 64 KiB
held = threading.Lock()
held.acquire()

def take_the_sigterm():
    time.sleep(0.3)
    # what the kernel may do with `kill PID`: hand the SIGTERM to a thread other than the main one
    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

threading.Thread(target=take_the_sigterm, daemon=True).start()
held.acquire()  # never released: only the SIGTERM ends this process, as it does without gpuflame
"""


def test_a_sigterm_taken_by_another_thread_still_ends_the_program_with_its_profile(tmp_path: Path) -> None:
    """A pool worker waiting on its queue hung when torch's thread took the SIGTERM (about 1 run in 10)."""
    script = write(tmp_path / "other_thread.py", SIGTERM_ON_ANOTHER_THREAD)
    bare = subprocess.run([sys.executable, str(script)], capture_output=True, timeout=60)
    assert bare.returncode == -signal.SIGTERM  # what the program does alone
    result = gpuflame_run("--json", "-o", "t.pb.gz", script.name, cwd=tmp_path, timeout=60)
    assert result.returncode == -signal.SIGTERM, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1])["lost_processes"] == []
    inuse = bytes_by_function(load(tmp_path / "t.pb.gz"))
    assert inuse["<module>"] == 64 * KIB


SIGTERM_ON_ANOTHER_THREAD_IN_A_CHILD = """
import multiprocessing as mp, signal, sys, threading, time, torch

def task():
    kept = torch.zeros(32 * 256)  # 32 KiB
    held = threading.Lock()
    held.acquire()

    def take_the_sigterm():
        time.sleep(0.3)
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)  # the kernel's choice of thread

    threading.Thread(target=take_the_sigterm, daemon=True).start()
    held.acquire()  # never released: only the SIGTERM ends this child

if __name__ == "__main__":
    child = mp.get_context(sys.argv[1]).Process(target=task)
    child.start()
    child.join(30)
    print(child.exitcode, flush=True)  # None: the child hung
    if child.exitcode is None:
        child.kill()
"""


@pytest.mark.slow
@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_a_sigterm_taken_by_another_thread_ends_a_multiprocessing_child(tmp_path: Path, method: str) -> None:
    """A forkserver child clears the inherited wakeup fd before its task: the watch must be heard again there."""
    script = write(tmp_path / "child.py", SIGTERM_ON_ANOTHER_THREAD_IN_A_CHILD)
    result = gpuflame_run("--json", "-o", "c.pb.gz", script.name, method, cwd=tmp_path, timeout=90)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == str(-signal.SIGTERM), result.stdout  # not None: it did not hang


TERM_DURING_WRITER_IMPORT = """
import os, signal, sys

class TermOnImport:
    # SIGTERM to this process while gpuflame imports its profile writer (a pool's terminate() can land there)
    def find_spec(self, name, path=None, target=None):
        if name == "gpuflame.formats.protobuf_encode":
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGTERM)
        return None

sys.meta_path.insert(0, TermOnImport())
import torch  # the backend starts here, and imports the writer
print("not reached", flush=True)
"""


def test_a_sigterm_while_the_writer_is_imported_waits_for_it(tmp_path: Path) -> None:
    """The handler used to run inside that import and find the writer half imported: the profile was lost."""
    script = write(tmp_path / "term.py", TERM_DURING_WRITER_IMPORT)
    result = gpuflame_run("--json", "-o", "term.pb.gz", script.name, cwd=tmp_path)
    assert result.returncode == -signal.SIGTERM, result.stderr  # the program's own death
    run = summary(result)
    assert run["lost"] == [] and "could not write" not in result.stderr, result.stderr
    assert len(run["processes"]) == 1 and (tmp_path / "term.pb.gz").exists()
    assert "not reached" not in result.stdout


ASKS_BY_SIGNAL = """
import os, signal, sys, torch
kept = torch.zeros(32 * 256)  # 32 KiB

def answer(signum, _frame):
    print(f"got {signal.Signals(signum).name}", flush=True)
    sys.exit(0)

for asked in (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):  # a server's reload, reopen logs, ...
    signal.signal(asked, answer)
print(f"waiting {os.getpid()}", flush=True)
while True:
    signal.pause()
"""


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2], ids=lambda s: s.name)
def test_a_signal_sent_to_the_launcher_reaches_the_program(tmp_path: Path, sig: signal.Signals) -> None:
    """``kill -HUP``/``-USR1`` to ``gpuflame run`` killed the launcher and left the program running, unmerged."""
    script = write(tmp_path / "asks.py", ASKS_BY_SIGNAL)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLAME_") and k != "PYTHONPATH"}
    launcher = [sys.executable, "-m", "gpuflame", "run", "--json", "-o", "s.pb.gz", script.name]
    proc = subprocess.Popen(launcher, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    program = int(proc.stdout.readline().split()[1])  # it has its handlers; the launcher forwards since it started it
    try:
        proc.send_signal(sig)
        code = proc.wait(timeout=60)
    finally:
        try:
            os.kill(program, signal.SIGKILL)  # an orphan left by a launcher that died of the signal
        except ProcessLookupError:
            pass
    out, err = proc.stdout.read(), proc.stderr.read()
    assert code == 0, err
    assert out.splitlines()[0] == f"got {sig.name}", out
    run = json.loads(out.strip().splitlines()[-1])
    assert run["processes"] == [program] and run["lost_processes"] == [], err
    assert bytes_by_function(load(tmp_path / "s.pb.gz"))["<module>"] == 32 * KIB


DIES_OF = """
import os, signal, sys
kept = Holder().make(24)
print("made", flush=True)
sig = getattr(signal, sys.argv[1])
if sig == signal.SIGABRT:
    os.abort()
os.kill(os.getpid(), sig)
"""


@pytest.mark.parametrize("name", ["SIGTERM", "SIGABRT", "SIGUSR1"])
def test_a_program_killed_by_a_signal_ends_the_run_by_the_same_signal(tmp_path: Path, name: str) -> None:
    """A parent's wait() (and bash, at a Ctrl-C) tells a death by signal from an exit with 128+N: the run dies alike."""
    script = write(tmp_path / "dies.py", ALLOCATE, DIES_OF)
    (tmp_path / "bare").mkdir()
    bare = subprocess.run([sys.executable, str(script), name], cwd=tmp_path / "bare", capture_output=True, timeout=60)
    result = gpuflame_run("-o", "d.pb.gz", script.name, name, cwd=tmp_path)
    assert bare.returncode == result.returncode == -getattr(signal, name), result.stderr
    assert result.stdout == "made\n"
    assert not list(tmp_path.glob("core*")), "the launcher's own death must not leave a core file"
    if name == "SIGTERM":  # gpuflame writes the profile, then the signal acts
        assert bytes_by_function(load(tmp_path / "d.pb.gz"), "alloc_space")["Holder > make"] == 24 * KIB
    else:  # no exit hook runs: the loss is said before the launcher dies
        assert f"it was killed by {name} before its exit hooks ran" in result.stderr, result.stderr


def test_as_pid_1_where_it_cannot_die_by_the_signal_the_run_exits_128_plus_n(tmp_path: Path) -> None:
    """PID 1 of a container ignores a signal it sends itself: the launcher then exits as a shell would say it."""
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "-pf", "true"], capture_output=True).returncode != 0:
        pytest.skip("no new PID namespace here (needs unshare and the right to make one)")
    script = write(tmp_path / "dies.py", ALLOCATE, DIES_OF)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLAME_") and k != "PYTHONPATH"}
    env["GPUFLAME_STORE"] = str(tmp_path / "store")
    result = subprocess.run(
        [unshare, "-pf", sys.executable, "-m", "gpuflame", "run", "-o", "d.pb.gz", script.name, "SIGTERM"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 128 + signal.SIGTERM, result.stderr
    assert bytes_by_function(load(tmp_path / "d.pb.gz"), "alloc_space")["Holder > make"] == 24 * KIB
