"""The node agent's cost, side by side with the same uprobes running empty programs.

- cost per alloc+free pair seen by a Python caller (ctypes into a stand-in
  libcuda.so.1 built from cuda.h, tests/agent/standin_cuda.c) at 3, 30 and 64
  Python frames: no probes / empty programs on the same probes / the agent; and the same
  for entry-only probes (--probes entry: no uretprobes, a plain uprobe on the
  call's return site in libffi);
- the agent's CPU per event and its drops at 100k and 300k allocations/s
  (several paced processes);
- time from starting the agent to its first correctly named sample.

Needs root, BPF and clang/bpftool/libbpf (as tests/agent/); prints a table.

    sudo python bench/bench_agent.py [--pairs 20000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))  # the test suite's helpers, as the package tests.*

from tests.agent.agent_helpers import cuda_include, why_not  # noqa: E402

from gpuflame.agent import build  # noqa: E402
from gpuflame.agent.agent import UPROBE_PROGRAMS, Agent  # noqa: E402
from gpuflame.agent.elf import read_elf  # noqa: E402
from gpuflame.agent.events import ALLOCS, FREES  # noqa: E402
from gpuflame.agent.libbpf import BpfObject  # noqa: E402

HERE = Path(__file__).resolve().parent / "agent"
PYTHON = sys.executable
DEPTHS = (3, 30, 64)


def build_standins(tmp: Path) -> tuple[str, str]:
    lib = tmp / "libcuda.so.1"
    subprocess.run(
        [
            "gcc",
            "-shared",
            "-fPIC",
            "-O2",
            "-fno-omit-frame-pointer",
            "-fno-optimize-sibling-calls",
            "-fno-inline",
            "-fno-shrink-wrap",
            f"-I{cuda_include()}",
            "-Wl,-soname,libcuda.so.1",
            str(ROOT / "tests" / "agent" / "standin_cuda.c"),
            "-o",
            str(lib),
            "-lpthread",
        ],
        check=True,
    )
    empty = tmp / "empty.bpf.o"
    subprocess.run(
        [
            "clang",
            "-O2",
            "-g",
            "-target",
            "bpf",
            "-I/usr/include/x86_64-linux-gnu",
            "-c",
            str(HERE / "empty.bpf.c"),
            "-o",
            str(empty),
        ],
        check=True,
    )
    return str(lib), str(empty)


class Pairs:
    """bench/agent/pairs.py in a child process."""

    def __init__(self, lib: str) -> None:
        self.proc = subprocess.Popen(
            [PYTHON, str(HERE / "pairs.py"), lib], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout.readline().strip() == "ready"
        self.pid = self.proc.pid

    def ask(self, line: str) -> float:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return float(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.write("exit\n")
        self.proc.stdin.close()
        self.proc.wait()


def attach_empty(obj_path: str, lib: str, sites: dict | None = None) -> BpfObject:
    """The agent's probes (entry and return, same functions) with empty programs; with *sites* (entry-only),
    entry probes and plain uprobes on those return sites instead."""
    obj = BpfObject(obj_path, multi=UPROBE_PROGRAMS)
    elf = read_elf(lib, full=False)
    by_program: dict[tuple[str, bool], list[int]] = {}
    for name, (program, _kind) in ALLOCS.items():
        by_program.setdefault((program, False), []).append(elf.file_offset(elf.symbols[name].value))
        if sites is None:
            by_program.setdefault(("alloc_exit", True), []).append(elf.file_offset(elf.symbols[name].value))
    for name in FREES:
        by_program.setdefault(("free_enter", False), []).append(elf.file_offset(elf.symbols[name].value))
        if sites is None:
            by_program.setdefault(("free_exit", True), []).append(elf.file_offset(elf.symbols[name].value))
    for (program, ret), offsets in by_program.items():
        obj.attach_uprobe_multi(program, lib, offsets, [0] * len(offsets), ret=ret)
    for (_dev, _ino, offset), path in (sites or {}).items():
        obj.attach_uprobe_multi("ret_site", path, [offset], [0], ret=False)
    return obj


def return_sites(lib: str) -> dict:
    """Where a ctypes caller's driver calls return (libffi): what the entry-only agent probes."""
    target = Pairs(lib)
    agent = Agent(pids=[target.pid], probes="entry")
    agent.start()
    target.ask("time 3 100")
    sites = dict(agent.return_sites)
    agent.stop()
    target.close()
    return {key: path.replace(f"/proc/{target.pid}/root", "") for key, path in sites.items()}


def pair_costs(lib: str, empty: str, n: int, repeat: int) -> tuple[dict[str, dict[int, float]], int]:
    """ns per pair, best over *repeat* rounds, the set-ups interleaved; and events the agents lost."""
    best: dict[str, dict[int, float]] = {k: {} for k in ("none", "empty", "agent", "empty_entry", "entry")}
    sites = return_sites(lib)
    lost = 0
    for _ in range(repeat):
        for setup in best:
            target = Pairs(lib)
            attached: object = None
            if setup.startswith("empty"):
                attached = attach_empty(empty, lib, sites if setup == "empty_entry" else None)
            elif setup in ("agent", "entry"):
                attached = Agent(pids=[target.pid], probes="return" if setup == "agent" else "entry")
                attached.start()
            for depth in DEPTHS:
                ns = target.ask(f"time {depth} {n}")
                best[setup][depth] = min(best[setup].get(depth, ns), ns)
            target.close()
            if setup in ("agent", "entry"):
                lost += attached.stats()["lost_events"]
                attached.stop()
            elif attached is not None:
                attached.close()
    return best, lost


def thread_cpu(tid: int) -> float:
    fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rate_run(lib: str, rate: int, seconds: float, procs: int) -> dict[str, float]:
    """*procs* paced callers making *rate* pairs/s between them, the agent watching them."""
    targets = [Pairs(lib) for _ in range(procs)]
    agent = Agent(pids=[t.pid for t in targets])
    agent.start()
    tid = agent._thread.native_id
    cpu0 = thread_cpu(tid)
    for t in targets:
        t.proc.stdin.write(f"rate {rate / procs} {seconds} 10\n")
        t.proc.stdin.flush()
    made = sum(int(float(t.proc.stdout.readline())) for t in targets)
    time.sleep(0.5)
    cpu = thread_cpu(tid) - cpu0
    stats = agent.stats()
    booked = agent.snapshot().totals()["alloc_objects"]
    agent.stop()
    for t in targets:
        t.close()
    events = 2 * booked  # an alloc and a free per pair
    return {
        "rate": made / seconds,
        "made": made,
        "booked": booked,
        "lost": stats["lost_events"],
        "cpu_per_event_us": 1e6 * cpu / max(events, 1),
        "cpu_share": cpu / seconds,
    }


def first_named_sample(lib: str) -> float:
    """Seconds from Agent() to the first sample named pairs (a process allocating 1000 pairs/s)."""
    target = Pairs(lib)
    target.proc.stdin.write("rate 1000 30 5\n")
    target.proc.stdin.flush()
    time.sleep(0.3)
    start = time.monotonic()
    agent = Agent(libcuda=[lib])
    agent.start()
    took = -1.0
    while time.monotonic() - start < 20:
        profile = agent.snapshot()
        if any(profile.frames[s.stack[0]].name == "paced" for s in profile.samples):
            took = time.monotonic() - start
            break
        time.sleep(0.005)
    agent.stop()
    target.proc.kill()
    target.proc.wait()
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    reason = why_not()
    if reason:
        print(f"bench_agent: skipped: {reason}")
        return 0
    build.ensure()
    with tempfile.TemporaryDirectory() as tmp:
        lib, empty = build_standins(Path(tmp))
        costs, lost = pair_costs(lib, empty, args.pairs, args.repeat)
        print("cost per alloc+free pair, Python caller (ns of the caller's CPU, probes included; best of rounds)")
        print(f"{'frames':>7} {'no probes':>10} {'empty progs':>12} {'agent':>8} {'agent/empty':>12}")
        for d in DEPTHS:
            none, emp, ag = costs["none"][d], costs["empty"][d], costs["agent"][d]
            print(f"{d:>7} {none:>10.0f} {emp:>12.0f} {ag:>8.0f} {ag / emp:>11.2f}x")
        print("\nthe same, entry-only probes (--probes entry): entry probes + a plain uprobe on the return site")
        print(f"{'frames':>7} {'empty progs':>12} {'agent':>8} {'agent/empty':>12} {'vs return agent':>16}")
        for d in DEPTHS:
            emp, ag = costs["empty_entry"][d], costs["entry"][d]
            print(f"{d:>7} {emp:>12.0f} {ag:>8.0f} {ag / emp:>11.2f}x {ag / costs['agent'][d]:>15.2f}x")
        print(f"events the agents lost meanwhile: {lost}")
        print("\nrate (allocations/s), several paced processes at 10 frames")
        for rate, procs in ((100_000, 2), (300_000, 4)):
            r = rate_run(lib, rate, args.seconds, procs)
            print(
                f"asked {rate:>7}: made {r['rate']:>9.0f}/s, booked {r['booked']}/{r['made']}, lost {r['lost']}, "
                f"agent CPU {r['cpu_per_event_us']:.2f} us/event ({100 * r['cpu_share']:.0f}% of a core)"
            )
        took = first_named_sample(lib)
        print(f"\nfirst correctly named sample: {took:.3f} s after starting the agent")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
