"""What the node agent misses of a driver file loaded after it started (issue 39 item 2).

A Python process (tests/agent/target.py) loads a fresh copy of the stand-in
libcuda.so.1 (tests/agent/standin_cuda.c: another inode, so the agent has not
probed it) by its path and at once allocates 208 blocks, 54.23 MiB (a model's
weights right after the driver's dlopen); then one more allocation marks the
end. The agent (every process, its reader thread and rescans running) is
asked what it booked for that process: the allocations and bytes missing are
printed per run, with the runs summed. ``--busy N`` starts N busy loops beside
it (killed after). ``--before SRC`` runs the same with the agent from another
source tree's ``src`` (a checkout of the code before); ``--hold``: an agent per run,
on that process (--pid: no other job's process on the machine is held), holds
it at the open until the file is probed (--hold-late-drivers).
The process runs in a session of its own (no terminal, as in a pod: a process
with one is never held).

The stand-in allocates within microseconds of its load; a real driver's cuInit
alone takes far longer, so a real process gives the agent more time than this.

``--syscalls``: what the word of opens costs every other process instead (a
raw tracepoint at every system call's exit, which also puts every system call
on the kernel's traced path): a C loop of 2,000,000 getppid calls, ns per
call, without and with an agent running, in alternating rounds.

Needs root, BPF and clang/bpftool/libbpf (as tests/agent/).

    sudo python bench/bench_agent_late.py [--runs 10] [--busy 4] [--before SRC] [--hold]
    sudo python bench/bench_agent_late.py --syscalls [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
N_WEIGHTS = 208


def run_all(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(ROOT))  # the test suite's helpers, as the package tests.*
    from tests.agent.agent_expected import rows
    from tests.agent.agent_helpers import Target, build_standin, wait_for
    from tests.helpers.pythons import python_for

    from gpuflame.agent.agent import Agent

    python = python_for("3.12") or sys.executable
    folder = Path(tempfile.mkdtemp(prefix="gpuflame-late-"))
    lib = build_standin(folder / "libcuda.so.1")
    agent = None if args.hold else Agent()  # --hold: one agent per run, on its process (below)
    if agent is not None:
        agent.start()
    totals = [0, 0, 0, 0]
    try:
        for i in range(args.runs):
            copy = folder / f"run{i}" / "libcuda.so.1"
            copy.parent.mkdir()
            shutil.copy(lib, copy)
            target = Target(python, str(copy), "late", prefix=("setsid",))  # no terminal: a daemon's, a pod's
            try:
                target.ready()
                if args.hold:  # --pid: other jobs' processes on this machine are not held
                    if agent is not None:
                        agent.stop()
                    agent = Agent(pids=(target.pid,), hold=True)
                    agent.start()
                target.run(f"model {N_WEIGHTS}")
                target.run("deep 1")  # the end mark: booked after every weight, in the ring's order
                pid = str(target.pid)

                def mine(pid: str = pid, agent: Agent = agent) -> dict:
                    return {k: v for k, v in rows(agent.snapshot()).items() if k[0] == pid}

                wait_for(lambda: any("deep" in str(k[2]) for k in mine()), timeout=20)
                made = [r for r in target.records if r["op"] == "alloc" and r["size"] != 333]
                got = [v for k, v in mine().items() if "deep" not in str(k[2])]
                n, nbytes = sum(v[5] for v in got), sum(v[4] for v in got)
                want, want_bytes = len(made), sum(r["size"] for r in made)
                late = agent.late_loads.get(target.pid, "not late")
                if args.hold:
                    late = (
                        f"{late}; held {agent.counts['held']} for {agent.counts['held_ms_max']} ms, "
                        f"past the bound {agent.counts['held_past_bound']}"
                    )
                print(
                    f"run {i + 1}: missing {want - n} of {want} allocations "
                    f"({(want_bytes - nbytes) / 2**20:.2f} of {want_bytes / 2**20:.2f} MiB); window ms: {late}",
                    flush=True,
                )
                for j, v in enumerate((want - n, want, want_bytes - nbytes, want_bytes)):
                    totals[j] += v
            finally:
                target.close()
    finally:
        if agent is not None:
            agent.stop()
        shutil.rmtree(folder, ignore_errors=True)
    print(
        f"all {args.runs} runs: missing {totals[0]} of {totals[1]} allocations "
        f"({totals[2] / 2**20:.2f} of {totals[3] / 2**20:.2f} MiB)"
    )
    return 0


SYSCALL_LOOP = r"""
#include <stdio.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
int main(void) {
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int i = 0; i < 2000000; i++) syscall(SYS_getppid);
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("%.1f\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / 2e6);
    return 0;
}
"""


def syscalls(args: argparse.Namespace) -> int:
    """ns per getppid call without and with an agent (every process), alternating."""
    from gpuflame.agent.agent import Agent

    folder = Path(tempfile.mkdtemp(prefix="gpuflame-syscalls-"))
    try:
        (folder / "loop.c").write_text(SYSCALL_LOOP)
        subprocess.run(["gcc", "-O2", str(folder / "loop.c"), "-o", str(folder / "loop")], check=True)
        for i in range(args.runs):
            without = subprocess.run([str(folder / "loop")], capture_output=True, text=True, check=True).stdout
            agent = Agent()
            agent.start()
            try:
                with_agent = subprocess.run([str(folder / "loop")], capture_output=True, text=True, check=True).stdout
            finally:
                agent.stop()
            print(f"round {i + 1}: {without.strip()} ns without, {with_agent.strip()} ns with the agent", flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--busy", type=int, default=0, help="busy loops beside it")
    parser.add_argument("--before", default="", help="the agent from this source tree's src")
    parser.add_argument("--hold", action="store_true", help="the agent holds a process loading a new driver file")
    parser.add_argument("--syscalls", action="store_true", help="the cost of the word of opens to system calls")
    args = parser.parse_args()
    src = Path(args.before).resolve() / "src" if args.before else ROOT / "src"
    sys.path.insert(0, str(src))
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        import gpuflame

        where = Path(gpuflame.__file__).parents[1]
        print(f"agent from {where}; {args.busy} busy loops; load {os.getloadavg()[0]:.1f}", flush=True)
        sys.path.insert(0, str(ROOT))  # the test suite's helpers, as the package tests.*
        from tests.agent.agent_helpers import why_not

        reason = why_not()
        if reason:
            print(f"skipped: {reason}")
            return 0
        return syscalls(args) if args.syscalls else run_all(args)
    finally:
        for p in busy:
            p.kill()
            p.wait()


if __name__ == "__main__":
    sys.exit(main())
