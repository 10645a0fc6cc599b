"""Entry-only probes (--probes entry): no uretprobes, the same exact profile.

For processes a uretprobe could break (it rewrites the return address; on
Linux 6.11-6.13 a seccomp filter can refuse its syscall and the process is
killed), the agent records an allocation at its entry and reads its result at
the call's return site (a plain uprobe placed there when the site is first
seen) or, for a variable in a live stack frame, at the thread's next call.
"""

from __future__ import annotations

import re

import pytest

from gpuflame.agent.procs import choose_probes
from tests.agent.agent_expected import replay, rows
from tests.agent.agent_helpers import NativeCaller, booked, check_exact, own_rows, wait_for


def entry_agent(agent_for, target):  # noqa: ANN001, ANN201
    """An entry-only agent on *target*, its ctypes call site already probed (one cuInit through it)."""
    agent = agent_for(target.pid, probes="entry")
    assert agent.probes == "entry"
    target.run("init")
    assert wait_for(lambda: bool(agent.return_sites))
    assert any("libffi" in path for path in agent.return_sites.values())  # ctypes' one call instruction
    return agent


@pytest.mark.parametrize("version", ["3.10", "3.11", "3.13"])
def test_same_exact_profile_as_return_probes(version, start_target, agent_for):
    """basic (every allocation API, frees, failed calls), threads and a deep stack: in use, allocated and peak
    per Python stack equal the target's own log, as with return probes (test_agent_stacks)."""
    target = start_target(version)
    target.ready()
    agent = entry_agent(agent_for, target)
    for command in ("basic", "threads", "deep 40"):
        target.run(command)
    got = check_exact(agent, target)
    assert {"Model > layer", "Model > activations"} <= {key[2][1][0] for key in got if key[2][0][0] == "device_alloc"}
    stats = agent.stats()
    assert stats["results_unknown"] == stats["results_unread"] == stats["lost_events"] == 0
    assert stats["unknown_frees_at_entry"] == 1  # basic's free of an address never given out (the driver refuses it)
    assert any("1 frees of addresses not known here were ignored" in c for c in agent.snapshot().comments)
    assert "probes: entry-only" in agent.watching()
    assert "probes: entry-only" in agent.snapshot().comments[0]


def test_return_probes_give_the_same_rows(start_target, agent_for):
    """The same workload under each kind of probe, side by side: identical rows (pids aside)."""
    by_mode = {}
    for mode in ("return", "entry"):
        target = start_target("3.12")
        target.ready()
        agent = entry_agent(agent_for, target) if mode == "entry" else agent_for(target.pid, probes="return")
        target.run("basic")
        target.run("threads")
        check_exact(agent, target)
        by_mode[mode] = {k[1:]: v for k, v in own_rows(agent, {str(target.pid)}).items()}
        agent.stop()
    assert by_mode["entry"] == by_mode["return"]


def test_fork_child_and_pid_namespace(start_target, agent_for):
    """A fork child (no task storage of its own yet) and a process in its own PID namespace: exact too."""
    target = start_target("3.11")
    target.ready()
    agent = entry_agent(agent_for, target)
    target.run("fork")
    settled = wait_for(lambda: booked(agent, target.records) and agent.snapshot().totals()["inuse_space"] == 0)
    assert settled, (agent.stats(), rows(agent.snapshot()), replay(target.records))
    assert rows(agent.snapshot()) == {k: (v[0], v[1], 0, 0, v[4], v[5]) for k, v in replay(target.records).items()}
    agent.stop()
    inner = start_target("3.12", prefix=("unshare", "--pid", "--fork", "--kill-child"))
    inner.ready()
    host_pid = int(open(f"/proc/{inner.pid}/task/{inner.pid}/children").read().split()[0])
    inner.pid = host_pid  # the agent watches it by its host pid
    agent = entry_agent(agent_for, inner)
    inner.run("basic")
    check_exact(agent, inner, pid_of={1: str(host_pid)})


def test_every_process_a_new_process_finds_the_site_probed(libcuda, start_target, agent_for):
    """Every-process mode: a return-site probe sits on the file (libffi), so a process started later is read
    back exactly from its first allocation."""
    agent = agent_for(libcuda=[libcuda], probes="entry")
    first = start_target("3.11")
    first.ready()
    first.run("init")
    assert wait_for(lambda: bool(agent.return_sites))
    target = start_target("3.11", "now")
    target.read_until("done")
    target.proc.wait(10)
    expected = {k: (v[0], v[1], 0, 0, v[4], v[5]) for k, v in replay(target.records).items()}
    wait_for(lambda: own_rows(agent, {str(target.pid)}) == expected)
    assert own_rows(agent, {str(target.pid)}) == expected


def test_blocks_from_before_the_agent_do_not_go_negative(start_target, agent_for):
    target = start_target("3.11")
    target.ready()
    target.run("hold")  # three blocks the agent never sees allocated
    before = len(target.records)
    agent = entry_agent(agent_for, target)
    target.run("release")
    target.run("threads")
    expected = replay(target.records[before:])
    wait_for(lambda: rows(agent.snapshot()) == expected)
    assert rows(agent.snapshot()) == expected
    assert agent.stats()["unknown_frees_at_entry"] == 3


def test_a_failed_allocation_is_not_counted(start_target, agent_for):
    """Out of memory: the return code read at the return site says so; nothing booked for that stack."""
    target = start_target("3.11")
    target.ready()
    agent = entry_agent(agent_for, target)
    target.run("oom")
    assert any(r["op"] == "failed" for r in target.records)
    got = check_exact(agent, target)
    assert [v[4] for v in got.values()] == [4096]


def test_native_caller_read_back_at_the_next_call(libcuda, agent_for, tmp_path, monkeypatch):
    """A C caller's output variables live in its stack frame: before the return sites are probed, each result
    is read at the thread's next driver call (changed: allocated; unchanged: the call failed).

    The return sites are left unprobed here: a probe placed while a call is still running (a busy machine)
    would read that result at its return instead, and the test would depend on the scheduler."""
    from gpuflame.agent.agent import Agent

    monkeypatch.setattr(Agent, "_probe_return_site", lambda self, h: None)
    caller = NativeCaller(NATIVE_CALLER, libcuda, tmp_path)
    try:
        agent = agent_for(caller.pid, probes="entry")
        caller.go()
        assert wait_for(lambda: agent.snapshot().totals()["alloc_space"] == 4096 + 8192)
        profile = agent.snapshot()
        totals = profile.totals()
        assert (totals["alloc_objects"], totals["inuse_space"]) == (2, 8192)  # the failed one (size 0) not counted
        names = {profile.compact().stack_frames(s)[0].name for s in profile.compact().samples}
        assert names == {"allocate_weights"}  # the caller, found from the return address at entry
        assert agent.stats()["results_next_entry"] == 2  # 4096 at the failing call, 8192 at the free
    finally:
        caller.close()


NATIVE_CALLER = r"""
#include <stdio.h>
typedef unsigned long long CUdeviceptr;
int cuInit(unsigned int);
int cuMemAlloc_v2(CUdeviceptr *, size_t);
int cuMemFree_v2(CUdeviceptr);
__attribute__((noinline)) void allocate_weights(void) {
    CUdeviceptr a, b = 0, c;
    cuMemAlloc_v2(&a, 4096);
    cuMemAlloc_v2(&b, 0); /* fails */
    cuMemAlloc_v2(&c, 8192);
    cuMemFree_v2(a);
}
int main(void) {
    char line[8];
    cuInit(0);
    printf("ready\n"); fflush(stdout);
    if (!fgets(line, sizeof line, stdin)) return 1;
    allocate_weights();
    printf("done\n"); fflush(stdout);
    fgets(line, sizeof line, stdin);
    return 0;
}
"""


def fake_proc(tmp_path, seccomp: dict[int, int]) -> str:  # noqa: ANN001
    for pid, mode in seccomp.items():
        (tmp_path / str(pid)).mkdir()
        status = f"Name:\tpython3\nSeccomp:\t{mode}\nSeccomp_filters:\t{mode // 2}\n"
        (tmp_path / str(pid) / "status").write_text(status)
    return str(tmp_path)


@pytest.mark.parametrize(
    ("asked", "release", "pids", "users", "mode"),
    [
        ("auto", "6.12.44", [10], [], "return"),  # watched process not filtered, nothing else maps the driver
        ("auto", "6.12.44", [20], [], "entry"),  # watched process under a seccomp filter
        ("auto", "6.11.0-1-generic", [10], [10, 20], "entry"),  # another user of the same file is filtered
        ("auto", "6.13.2", [], [10], "entry"),  # every process: one may start under a filter at any time
        ("auto", "6.14.0", [20], [20], "return"),  # fixed kernels: the uretprobe syscall passes any filter
        ("auto", "6.10.14", [], [20], "return"),  # before the uretprobe syscall existed
        ("auto", "6.12.44", [30], [], "return"),  # strict mode (1) is not a filter; the probes use no syscall there
        ("entry", "6.18.0", [10], [10], "entry"),
        ("return", "6.12.44", [20], [20], "return"),  # the user's choice (the agent then refuses to risk pid 20)
    ],
)
def test_auto_chooses_from_the_kernel_and_seccomp(tmp_path, asked, release, pids, users, mode):
    proc = fake_proc(tmp_path, {10: 0, 20: 2, 30: 1})
    chosen, why = choose_probes(asked, pids, users, release=release, proc=proc)
    assert chosen == mode
    if mode == "entry" and asked == "auto" and pids:
        assert "pid 20" in why and release in why


def test_every_process_mode_says_why_entry_only(tmp_path):
    chosen, why = choose_probes("auto", [], [], release="6.12.1", proc=fake_proc(tmp_path, {}))
    assert chosen == "entry" and "any process may start under one" in why


def test_results_not_read_back_are_counted_not_guessed(start_target, agent_for):
    """Before ctypes' call site is probed, a result sits in a c_uint64 the caller frees and reuses at once: the
    agent does not guess it; it counts it, says so in the profile, and what it books is right."""
    target = start_target("3.11")
    target.ready()
    agent = agent_for(target.pid, probes="entry")  # no warm-up: the first calls race the site's probe
    target.run("basic")
    target.run("threads")
    expected = replay(target.records)
    assert wait_for(lambda: bool(agent.return_sites))
    target.run("init")  # settles the main thread's last call

    def missed() -> int:
        stats = agent.stats()
        return stats["results_unknown"] + stats["results_unread"] + len(agent.pending.calls)

    want = sum(v[5] for v in expected.values())  # each booked or counted (a failed call may be counted, too)
    assert wait_for(lambda: agent.snapshot().totals()["alloc_objects"] + missed() >= want)
    got = rows(agent.snapshot())
    for key, value in got.items():  # what is booked is right: never more than the target allocated there
        assert value[4] <= expected[key][4] and value[2] >= 0
    if agent.stats()["results_unknown"]:  # said with its bytes (every size here is above 0)
        said = [
            re.match(r"gpuflame agent: (\d+) allocations \((\d+) bytes\) were not counted: entry-only", c)
            for c in agent.snapshot().comments
        ]
        (n, size) = [(int(m[1]), int(m[2])) for m in said if m][0]
        assert 0 < n <= size


def test_auto_on_a_risky_kernel_watches_a_filtered_process_entry_only(start_target, agent_for, monkeypatch):
    """As on Linux 6.11-6.13 (the kernel check pretends): a process under a seccomp filter is refused to return
    probes, and auto watches it with entry-only probes, exactly."""
    from gpuflame.agent import procs
    from gpuflame.agent.agent import AgentError

    monkeypatch.setattr(procs, "uretprobe_seccomp_kernel", lambda release=None: True)
    target = start_target("3.11", "seccomp")
    target.ready()
    assert procs.seccomp_filtered(target.pid)
    with pytest.raises(AgentError, match="not probing it with --probes return"):
        agent_for(target.pid, probes="return")
    agent = agent_for(target.pid)  # auto
    assert agent.probes == "entry" and f"pid {target.pid}" in agent.probes_why
    target.run("init")
    assert wait_for(lambda: bool(agent.return_sites))
    target.run("basic")
    check_exact(agent, target)
