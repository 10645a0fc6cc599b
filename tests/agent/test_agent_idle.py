"""An idle GPU node: no driver loaded, no CUDA process. The agent keeps watching, never exits 2."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys

import pytest

from gpuflame.formats import load
from tests.agent.agent_expected import replay
from tests.agent.agent_helpers import agent_cli, check_exact, own_rows, wait_for, watching


def isolated() -> tuple[str, ...]:
    """A pid namespace of its own with its own /proc: the agent sees no other job's CUDA processes."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    return ("unshare", "--pid", "--fork", "--mount-proc", "--kill-child")


def inner_pid(pid: int) -> int:
    """The process unshare forked (the agent, pid 1 of its namespace)."""
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return int(f.read().split()[0])


def test_idle_node_watches_and_writes_a_profile_that_says_so(bpf_object, tmp_path):
    out, alive_file = tmp_path / "idle.pb.gz", tmp_path / "alive"
    proc = agent_cli("-o", str(out), "--alive-file", str(alive_file), prefix=isolated())
    line = watching(proc)
    assert "waiting for CUDA processes" in line, line
    assert alive_file.exists()  # touched at start, then by the reader thread
    alive = subprocess.run(
        [sys.executable, "-m", "gpuflame.agent.alive", str(alive_file)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert alive.returncode == 0, alive.stderr
    os.kill(inner_pid(proc.pid), signal.SIGTERM)  # as the kubelet stops a pod; unshare passes no signal on
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    assert "no CUDA process was seen; the profile is empty" in stderr
    profile = load(out)
    assert not profile.samples
    assert any("no CUDA process was seen" in c for c in profile.comments)
    assert stat.S_IMODE(out.stat().st_mode) == 0o600


def test_a_kernel_below_the_floor_is_said_at_start(bpf_object, monkeypatch):
    """Started on 5.10 (Debian 11's kernel), the agent stops at once with one line, before loading."""
    from gpuflame.agent.agent import Agent, AgentError

    real = os.uname()
    fake = os.uname_result((real.sysname, real.nodename, "5.10.0-33-amd64", real.version, real.machine))
    monkeypatch.setattr(os, "uname", lambda: fake)
    with pytest.raises(AgentError, match=r"^Linux 5.10.0-33-amd64 is older than the agent's floor, 5.15"):
        Agent().start()


def test_stale_alive_file_fails_the_probe(tmp_path):
    from gpuflame.agent import alive

    path = tmp_path / "alive"
    assert alive.main([str(path)]) == 1  # never touched
    alive.touch(str(path))
    assert alive.main([str(path)]) == 0
    os.utime(path, (0, 0))
    assert alive.main([str(path)]) == 1


def test_driver_loaded_after_an_idle_start_is_probed(libcuda, start_target, agent_for):
    """No libcuda anywhere at start: the agent starts, then probes the driver file a process loads."""
    agent = agent_for()  # every process; nothing to probe yet (another job's stand-in may be found: harmless)
    target = start_target("3.12", "late")
    target.ready()
    target.run("load")
    assert wait_for(lambda: target.pid in agent.processes and any(_same(p, libcuda) for p in agent.attached.values()))
    target.run("basic")
    check_exact(agent, target)
    assert agent.cuda_seen


def test_a_driver_file_loaded_later_is_probed_on_the_kernel_side_word(libcuda, start_target, bpf_object, tmp_path):
    """A new driver file (another inode) mapped after the start: the kernel side tells the reader at once,
    no rescan needed (none runs here: no reader thread); the window before its probes is said."""
    from gpuflame.agent.agent import Agent

    copy = tmp_path / "late" / "libcuda.so.1"
    copy.parent.mkdir()
    shutil.copy(libcuda, copy)
    copy.parent.chmod(0o755)
    key = (os.stat(copy).st_dev, os.stat(copy).st_ino)
    agent = Agent()
    agent.start(thread=False)  # no rescans: only the kernel side's word can get the file probed
    try:
        if not agent.watch_loads:
            pytest.skip("this kernel refuses fexit programs: new driver files are found by rescans only")
        target = start_target("3.12", "late", lib=str(copy))
        target.ready()
        target.run("load")
        assert wait_for(lambda: polled(agent) and key in agent.attached)
        assert target.pid in agent.processes
        target.run("basic")
        expected = replay(target.records)
        assert wait_for(lambda: polled(agent) and own_rows(agent, {str(target.pid)}) == expected)
        assert target.pid in agent.late_loads
        assert any(
            f"pid {target.pid} loaded a driver file the agent had not probed yet (probed " in c
            and " ms after the load): 0 allocations made before its probes were in are missing" in c
            for c in agent.snapshot().comments
        )
    finally:
        agent.stop()


def polled(agent) -> bool:  # noqa: ANN001
    agent.poll(0)
    return True


def test_allocations_before_a_late_driver_file_was_probed_are_counted(libcuda, start_target, bpf_object, tmp_path):
    """A process allocates from a driver file before its probes are in (no reader thread: the file is found by
    the rescan this test runs): its later frees of those blocks count them, said per process, and are not
    taken for frees of blocks from before the agent."""
    from gpuflame.agent.agent import Agent

    copy = tmp_path / "late" / "libcuda.so.1"
    copy.parent.mkdir()
    shutil.copy(libcuda, copy)
    copy.parent.chmod(0o755)
    target = start_target("3.12", "late", lib=str(copy))
    target.ready()
    agent = Agent(pids=(target.pid,))
    agent.start(thread=False)
    try:
        target.run("load")
        target.run("hold")  # 3 allocations before the file is probed: not seen
        agent._rescan()
        assert os.path.realpath(copy) in {os.path.realpath(p) for p in agent.attached.values()}
        seen_from = len(target.records)
        target.run("release")  # their frees: counted as allocations made before the probes
        target.run("basic")
        expected = replay(target.records[seen_from:])
        assert wait_for(lambda: polled(agent) and own_rows(agent, {str(target.pid)}) == expected)
        assert agent.late_frees == {target.pid: 3}
        late = {str(target.pid): {"probed_ms_after_load": None, "allocations_missing": 3}}
        assert agent.losses() == {"late_driver": late}  # --json's numbers
        assert agent.stats()["unknown_frees"] == 0  # basic's failed free of 0x1234 is no free
        (note,) = [c for c in agent.snapshot().comments if "loaded a driver file the agent had not probed" in c]
        assert note == (
            f"gpuflame agent: pid {target.pid} loaded a driver file the agent had not probed yet (probed at a "
            "rescan, up to 0.25 s after the load): 3 allocations made before its probes were in are missing, "
            "counted by their frees since (a block still held is not counted)"
        )
    finally:
        agent.stop()


def _late_copy(libcuda: str, tmp_path) -> tuple[str, tuple[int, int]]:  # noqa: ANN001
    """A copy of the driver (another inode: not probed yet), and its (device, inode)."""
    copy = tmp_path / "late" / "libcuda.so.1"
    copy.parent.mkdir()
    shutil.copy(libcuda, copy)
    copy.parent.chmod(0o755)
    return str(copy), (os.stat(copy).st_dev, os.stat(copy).st_ino)


def test_a_driver_file_opened_is_probed_before_it_is_mapped(libcuda, start_target, bpf_object, tmp_path):
    """The dynamic loader opens a library before it maps it: the kernel side's word of the open gets the file
    probed from the process's own descriptor (no rescan, no mapping yet), so every call is seen from the first
    and the process is not counted late."""
    from gpuflame.agent.agent import Agent

    copy, key = _late_copy(libcuda, tmp_path)
    agent = Agent()
    agent.start(thread=False)  # no rescans: only the kernel side's word can get the file probed
    try:
        if not agent.watch_opens:
            pytest.skip("no raw tracepoint on system call exits here: driver files are found when mapped")
        target = start_target("3.12", "late", lib=copy)
        target.ready()
        target.run("open")  # opened and held, not mapped
        assert wait_for(lambda: polled(agent) and key in agent.attached)
        assert agent.probed_on_open >= 1 and target.pid in agent.processes
        assert os.path.samefile(agent.attached[key], copy)  # named by the process's path, not the agent's fd
        target.run("load")
        target.run("basic")
        expected = replay(target.records)
        assert wait_for(lambda: polled(agent) and own_rows(agent, {str(target.pid)}) == expected)
        assert target.pid not in agent.late_loads and "late_driver" not in agent.losses()
        assert not any("had not probed yet" in c for c in agent.snapshot().comments)
    finally:
        agent.stop()


def test_a_driver_file_opened_and_mapped_before_the_agent_read_of_it_is_counted(
    libcuda, start_target, bpf_object, tmp_path
):
    """The open's word read after the loader has mapped the file and closed its descriptor: the file is found
    in the process's mappings instead, probed, and the process counted late from the open (a window in ms);
    the allocations it made before are counted by their frees."""
    from gpuflame.agent.agent import Agent

    copy, key = _late_copy(libcuda, tmp_path)
    agent = Agent()
    agent.start(thread=False)
    try:
        if not agent.watch_opens:
            pytest.skip("no raw tracepoint on system call exits here: driver files are found when mapped")
        target = start_target("3.12", "late", lib=copy)
        target.ready()
        target.run("load")  # opened, mapped, its descriptor closed: all before the agent reads a record
        target.run("hold")  # 3 allocations not seen
        assert wait_for(lambda: polled(agent) and key in agent.attached)
        assert isinstance(agent.late_loads.get(target.pid), int)  # a window in ms (None would be a rescan)
        target.run("release")
        assert wait_for(lambda: polled(agent) and agent.late_frees.get(target.pid) == 3)
    finally:
        agent.stop()


NO_TERMINAL = ("setsid",)  # a session of its own: no controlling terminal (a pod's, a daemon's); else never held


def test_a_process_that_opens_a_new_driver_file_is_held_until_it_is_probed(libcuda, start_target, agent_for, tmp_path):
    """--hold-late-drivers: a process that loads a driver file the agent has not probed and allocates at once is
    stopped at the open until the probes are in: every allocation seen, from the first, none counted late."""
    copy, key = _late_copy(libcuda, tmp_path)
    target = start_target("3.12", "late", lib=copy, prefix=NO_TERMINAL)
    target.ready()
    agent = agent_for(target.pid, hold=True)  # --pid: no other job's process is held by this test
    if not agent.watch_opens:
        pytest.skip("no raw tracepoint on system call exits here: nothing tells of an open to hold at")
    assert "is held until it is (at most 1 s" in agent.watching()
    target.run("model 40")  # loads the file, then 40 allocations at once
    check_exact(agent, target)
    assert key in agent.attached
    assert agent.counts["held"] >= 1 and target.pid not in agent.late_loads


def test_json_counts_the_holds(libcuda, start_target, bpf_object, tmp_path):
    """`gpuflame agent --hold-late-drivers --json`: the summary's `holds` counts the process held at the open."""
    import json

    copy, _ = _late_copy(libcuda, tmp_path)
    target = start_target("3.12", "late", lib=copy, prefix=NO_TERMINAL)
    target.ready()
    out = tmp_path / "agent.pb.gz"
    proc = agent_cli("--pid", str(target.pid), "--hold-late-drivers", "-o", str(out), "--json")
    line = watching(proc)
    if "is held until it is" not in line:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
        pytest.skip("no raw tracepoint on system call exits here: nothing tells of an open to hold at")
    target.run("model 40")
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    holds = json.loads(stdout)["holds"]
    assert set(holds) == {"held", "let_go_at_bound", "longest_ms"}
    assert holds["held"] == 1 and 0 <= holds["let_go_at_bound"] <= 1 and holds["longest_ms"] >= 0


def _settled(thread, timeout: float = 120.0) -> bool:  # noqa: ANN001
    """A guard against a hang (a process left stopped), not a timing: the command's own end is waited for."""
    thread.join(timeout)
    return not thread.is_alive()


def test_a_held_process_is_let_go_at_the_bound_when_the_agent_does_not_read(
    libcuda, start_target, bpf_object, tmp_path
):
    """An agent that never reads its ring (no reader thread, no poll) but showed life: the process stopped at the
    open is let go by the resumer at the bound, loads and allocates; read later, the hold is counted as let go
    at the bound, and the process as late."""
    import threading
    import time

    from gpuflame.agent.agent import Agent
    from gpuflame.agent.holding import HOLD_STATE

    copy, key = _late_copy(libcuda, tmp_path)
    target = start_target("3.12", "late", lib=copy, prefix=NO_TERMINAL)
    target.ready()
    agent = Agent(pids=(target.pid,), hold=True)  # --pid: no other job's process is held by this test
    agent.start(thread=False)
    try:
        if not agent.watch_opens:
            pytest.skip("no raw tracepoint on system call exits here: nothing tells of an open to hold at")
        hour_ahead = time.monotonic_ns() + 3600 * 10**9  # alive for the kernel side however slow this machine is
        agent._hold_map.update(b"\0" * 4, HOLD_STATE.pack(hour_ahead, 1, os.getpid()))
        loading = threading.Thread(target=target.run, args=("load",))
        loading.start()
        assert _settled(loading)  # the resumer let it go: the agent read nothing
        target.run("hold")  # before the probes: not seen
        assert wait_for(lambda: polled(agent) and agent.counts["held"] == 1 and key in agent.attached)
        assert agent.counts["held_past_bound"] == 1
        assert target.pid in agent.late_loads
    finally:
        agent.stop()


def test_the_resumer_lets_every_held_process_go_when_the_agent_ends(bpf_object, tmp_path):
    """However the agent ends (SIGKILL included), its pipe to the resumer closes: every process still held is
    resumed, however recently it was stopped."""
    import time

    from gpuflame.agent.agent import Agent

    agent = Agent(hold=True)
    agent.start(thread=False)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        os.kill(sleeper.pid, signal.SIGSTOP)
        assert wait_for(lambda: _state(sleeper.pid) == "T")
        held_now = time.monotonic_ns() + 3600 * 10**9  # not past any bound: only the agent's end lets it go
        agent._held.update(sleeper.pid.to_bytes(4, "little"), held_now.to_bytes(8, "little"))
        resumer = agent._resumer
        assert resumer is not None
        os.close(agent._resumer_pipe)  # as the agent's death closes it
        agent._resumer_pipe = -1
        assert resumer.wait(60) == 0
        assert _state(sleeper.pid) in "SR"
        assert agent._held.lookup(sleeper.pid.to_bytes(4, "little")) is None
    finally:
        sleeper.kill()
        sleeper.wait()
        agent.stop()


OPENS_THE_FILE = """
import fcntl, os, sys, termios
if sys.argv[2] == "terminal":  # its session (start_new_session) gets a controlling terminal, as a login's has
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
print("ready", flush=True)
sys.stdin.readline()
fd = os.open(sys.argv[1], os.O_RDONLY)
print("opened", flush=True)
sys.stdin.readline()
"""


@pytest.mark.parametrize("case", ["terminal", "no sign of life"])
def test_no_hold_for_a_process_with_a_terminal_nor_while_the_agent_shows_no_life(case, libcuda, bpf_object, tmp_path):
    """A process with a controlling terminal is never held (its shell would take the stop for the user's), nor
    any while the reader has shown no life for 2 s: its open is still told and the file probed, unheld."""
    import time

    from gpuflame.agent.agent import Agent
    from gpuflame.agent.holding import HOLD_STATE

    copy, key = _late_copy(libcuda, tmp_path)
    child = subprocess.Popen(
        [sys.executable, "-c", OPENS_THE_FILE, copy, case.split()[0]],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    agent = Agent(pids=(child.pid,), hold=True)
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline() == "ready\n"
        agent.start(thread=False)
        if not agent.watch_opens:
            pytest.skip("no raw tracepoint on system call exits here: nothing tells of an open to hold at")
        alive = time.monotonic_ns() + 3600 * 10**9 if case == "terminal" else 1  # 1: long ago
        agent._hold_map.update(b"\0" * 4, HOLD_STATE.pack(alive, 1, os.getpid()))
        child.stdin.write("open\n")
        child.stdin.flush()
        assert child.stdout.readline() == "opened\n"  # not stopped (a stop would last until the bound)
        assert wait_for(lambda: polled(agent) and key in agent.attached)
        assert agent.counts["held"] == 0
    finally:
        child.kill()
        child.wait()
        agent.stop()


OPENS_AS_TOLD = """
import os, sys
for line in sys.stdin:
    path, flags = line.split()
    os.open(path, int(flags))
    print("opened", flush=True)
"""


def test_only_an_open_as_the_loader_makes_is_told(libcuda, bpf_object, tmp_path):
    """The dynamic loader opens a library read-only and blocking: a file named libcuda.so* opened otherwise (a
    linker or a copy writing it, an agent reading it non-blocking) is not told, so not probed; the loader's
    open of another, after them, is (the ring keeps their order: theirs would have come first)."""
    from gpuflame.agent.agent import Agent

    written, nonblocking, loaded = (tmp_path / n / "libcuda.so.1" for n in ("w", "nb", "ld"))
    for copy in (written, nonblocking, loaded):
        copy.parent.mkdir()
        shutil.copy(libcuda, copy)
    child = subprocess.Popen(
        [sys.executable, "-c", OPENS_AS_TOLD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    agent = Agent(pids=(child.pid,))
    try:
        agent.start(thread=False)
        if not agent.watch_opens:
            pytest.skip("no word of opens here: driver files are found when mapped")
        assert child.stdin is not None and child.stdout is not None
        for path, flags in ((written, os.O_WRONLY), (nonblocking, os.O_RDONLY | os.O_NONBLOCK), (loaded, os.O_RDONLY)):
            child.stdin.write(f"{path} {flags | os.O_CLOEXEC}\n")
            child.stdin.flush()
            assert child.stdout.readline() == "opened\n"
        key = {p: (os.stat(p).st_dev, os.stat(p).st_ino) for p in (written, nonblocking, loaded)}
        assert wait_for(lambda: polled(agent) and key[loaded] in agent.attached)
        assert key[written] not in agent.attached and key[nonblocking] not in agent.attached
    finally:
        child.kill()
        child.wait()
        agent.stop()


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def test_a_driver_file_found_by_a_rescan_says_what_may_be_missing(libcuda, start_target, agent_for, tmp_path):
    """Found by a rescan (a kernel without a word of opens or mappings, or --pid): the profile says the window its
    probes came after."""
    copy = tmp_path / "late" / "libcuda.so.1"
    copy.parent.mkdir()
    shutil.copy(libcuda, copy)
    copy.parent.chmod(0o755)
    target = start_target("3.11", "late", lib=str(copy))
    target.ready()
    agent = agent_for(target.pid)
    target.run("load")
    assert wait_for(lambda: bool(agent.attached))
    target.run("basic")
    check_exact(agent, target)
    late_said = [c for c in agent.snapshot().comments if "loaded a driver file the agent had not probed yet" in c]
    if not agent.late_loads:  # the open's word came first and its probes were in before the mapping (a race)
        assert agent.watch_opens and agent.probed_on_open >= 1 and not late_said  # nothing could be missed
        return
    assert set(agent.late_loads) == {target.pid}
    note = late_said[0]
    assert f"pid {target.pid} loaded" in note and "0 allocations made before its probes were in" in note
    if not agent.watch_loads and not agent.watch_opens:  # else the kernel side's word may come first: a window
        assert "probed at a rescan, up to 0.25 s after the load" in note  # in milliseconds


def _same(path: str, libcuda: str) -> bool:
    """Whether the agent's probed *path* is this test's driver (another job's may be gone by now)."""
    try:
        return os.path.samefile(path, libcuda)
    except OSError:
        return False


MAPS_A_FILE = """
import mmap, sys, time
with open(sys.argv[1], "rb") as f:
    held = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)  # in /proc/PID/maps, as a loaded library is
print("mapped", flush=True)
time.sleep(120)
"""


def test_a_file_named_libcuda_that_is_not_the_driver_leaves_the_agent_watching(agent_for, tmp_path):
    """Any process may map a file named libcuda.so.1 (a tool reading one, a hostile pod): the agent watching
    every process goes on waiting for a driver it can probe, and the profile names the file it skipped."""
    fake = tmp_path / "libcuda.so.1"
    shutil.copy("/bin/true", fake)  # an ELF file without the driver's functions
    holder = subprocess.Popen([sys.executable, "-c", MAPS_A_FILE, str(fake)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "mapped\n"
        agent = agent_for()  # every process: raised "no libcuda.so could be probed" before
        key = (fake.stat().st_dev, fake.stat().st_ino)
        assert key not in agent.attached
        notes = [c for c in agent.snapshot().comments if "libcuda.so.1" in c and str(tmp_path) in c]
        assert len(notes) == 1 and "none of the CUDA driver's allocation functions" in notes[0], notes
        assert notes[0].endswith("processes calling it are not seen")
    finally:
        holder.kill()
        holder.wait()
