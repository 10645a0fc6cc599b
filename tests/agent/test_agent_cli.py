"""``gpuflame agent`` as a user runs it: the watching line, the file it writes, its one-line errors."""

from __future__ import annotations

import json
import shutil
import signal
import stat
import time

import pytest

from gpuflame.formats import load
from tests.agent.agent_expected import replay, rows
from tests.agent.agent_helpers import agent_cli, watching


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_pid_until_a_signal_writes_the_exact_profile(sig, start_target, bpf_object, tmp_path):
    target = start_target("3.12")
    target.ready()
    out = tmp_path / "agent.pb.gz"
    proc = agent_cli("--pid", str(target.pid), "-o", str(out), "--json")
    assert f"pid {target.pid}" in watching(proc)
    target.run("basic")  # its calls have returned: their events are in the ring, booked at the latest on stop
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    summary = json.loads(stdout)
    assert summary["processes"] == [target.pid]
    assert summary["losses"] == {}  # every call booked: no loss to count
    assert "holds" not in summary  # no --hold-late-drivers
    assert stat.S_IMODE(out.stat().st_mode) == 0o600  # every process's stacks: not for other users
    profile = load(out)
    assert rows(profile) == replay(target.records)
    assert profile.default_type == "peak_space"
    assert any("blocks allocated before the agent started" in c for c in profile.comments)


def test_entry_only_probes_said_and_exact(start_target, bpf_object, tmp_path):
    """--probes entry: the watching line and the profile say so; the profile is exact all the same."""
    target = start_target("3.11")
    target.ready()
    out = tmp_path / "agent.pb.gz"
    proc = agent_cli("--pid", str(target.pid), "--probes", "entry", "-o", str(out))
    assert "probes: entry-only, no uretprobes (asked for)" in watching(proc)
    target.run("init")  # ctypes' call site: probed from here on (the agent places it within milliseconds)
    time.sleep(0.5)
    target.run("threads")
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    profile = load(out)
    assert rows(profile) == replay(target.records)
    assert "probes: entry-only" in profile.comments[0]


def test_duration_and_the_store(start_target, bpf_object, tmp_path):
    target = start_target("3.11")
    target.ready()
    proc = agent_cli("--pid", str(target.pid), "--duration", "1.5s", env={"GPUFLAME_STORE": str(tmp_path)})
    watching(proc)
    target.run("threads")
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    (run,) = tmp_path.iterdir()
    assert rows(load(run / "profile.pb.gz")) == replay(target.records)
    assert stat.S_IMODE((run / "profile.pb.gz").stat().st_mode) == 0o600
    assert stat.S_IMODE(run.stat().st_mode) == 0o700
    meta = json.loads((run / "meta.json").read_text())
    assert meta["backend"] == "agent" and meta["processes"] == [target.pid]
    assert "gpuflame report" in stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--pid", "0"], "not a process id"),
        (["--pid", "4194304"], "no process 4194304"),
        (["--duration", "soon"], "not a duration"),
        (["--libcuda", "/nonexistent/libcuda.so.1"], "--libcuda /nonexistent/libcuda.so.1"),
        (["-o", "/nonexistent-dir/x.pb.gz"], "no such folder"),
        (["-o", "/proc/x.pb.gz"], "-o /proc/x.pb.gz: cannot write in /proc: no file can be made there"),
        (["--max-blocks", "0"], "not a positive number"),
        (["--probes", "exit"], "invalid choice: 'exit'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(bpf_object, args, message):
    proc = agent_cli(*args, "--duration", "1s")
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert message in stderr and len(stderr.strip().splitlines()) == 1, stderr


def test_without_privileges_one_clear_line(bpf_object, tmp_path):
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed")
    # root with every capability dropped: the agent checks capabilities, and the same user can still
    # read the checkout wherever it lies (a private temporary folder in CI)
    proc = agent_cli(
        "--duration", "1s", prefix=("setpriv", "--inh-caps=-all", "--bounding-set=-all"), env={"HOME": str(tmp_path)}
    )
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 2, stderr
    assert "needs root, or the capabilities CAP_BPF, CAP_PERFMON and CAP_SYS_PTRACE" in stderr
    assert len(stderr.strip().splitlines()) == 1
