"""The node agent's cost, side by side with the same uprobes running empty programs.

- cost per alloc+free pair seen by a Python caller (ctypes into a stand-in
  libcuda.so.1 built from cuda.h, tests/agent/standin_cuda.c, once with
  functions starting with push %rbp, which the kernel emulates, once without
  frame pointers, single-stepped) at 3 and 30 Python frames: no probes /
  empty programs on the same probes (this bench's, and bpftrace's where it is
  installed) / the agent (/ with --before OBJ, the agent loading another BPF
  object), interleaved in each round; medians over rounds of each round's
  ratio, and every round; each in two layouts: the caller's frames where its
  process put them, and (``guarded``, CPython 3.11+) in a thread whose frames
  sit right above a page that cannot be read (tests/agent/guarded.py), where a
  walk that reads below its frames faults; with --entry-only, also the
  entry-only probes (--probes entry);
- the agent's CPU per event and its drops at 100k and 300k allocations/s
  (several paced processes), beside a null control;
- time from starting the agent to its first correctly named sample.

Needs root, BPF and clang/bpftool/libbpf (as tests/agent/); prints tables.

    sudo python bench/bench_agent.py [--pairs 5000] [--repeat 5] [--before OBJ] [--only pairs|rate]
        [--python PATH] [--entries push,step]
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))  # the test suite's helpers, as the package tests.*

from tests.agent.agent_helpers import cuda_include, why_not  # noqa: E402

from bench_agent_reader import null_control  # noqa: E402  (this folder: the script's own)
from gpuflame.agent import build  # noqa: E402
from gpuflame.agent.agent import UPROBE_PROGRAMS, Agent  # noqa: E402
from gpuflame.agent.elf import read_elf  # noqa: E402
from gpuflame.agent.events import ALLOCS, FREES  # noqa: E402
from gpuflame.agent.libbpf import BpfObject  # noqa: E402

HERE = Path(__file__).resolve().parent / "agent"
PYTHON = sys.executable  # the caller's (--python)
DEPTHS = (3, 30)
LAYOUTS = ("time", "guarded")  # pairs.py's commands: the process's own frames, frames above an unreadable page


def build_standins(tmp: Path) -> tuple[dict[str, str], str]:
    """The stand-in driver twice: its functions starting with ``push %rbp`` (the kernel emulates the probed
    instruction) and without frame pointers (``sub $8,%rsp``: single-stepped, as on most real drivers)."""
    libs = {}
    for entry, frame_flag in (("push", "-fno-omit-frame-pointer"), ("step", "-fomit-frame-pointer")):
        folder = tmp / entry
        folder.mkdir()
        lib = folder / "libcuda.so.1"
        subprocess.run(
            [
                "gcc",
                "-shared",
                "-fPIC",
                "-O2",
                frame_flag,
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
        libs[entry] = str(lib)
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
    return libs, str(empty)


class Pairs:
    """bench/agent/pairs.py in a child process."""

    def __init__(self, lib: str) -> None:
        self.proc = subprocess.Popen(
            [PYTHON, str(HERE / "pairs.py"), lib], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout.readline().strip() == "ready"
        self.pid = self.proc.pid

    def ask(self, line: str) -> float:
        """ns per pair; NaN where the guarded layout could not be made."""
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline().strip()
        return float("nan") if answer == "unguarded" else float(answer)

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


class Bpftrace:
    """The same four hot probes (entry and return of cuMemAlloc_v2 and cuMemFree_v2), empty, attached by bpftrace:
    an independent tool's idea of what bare probes cost."""

    def __init__(self, lib: str) -> None:
        probes = ",".join(f"{k}:{lib}:{f}" for k in ("uprobe", "uretprobe") for f in ("cuMemAlloc_v2", "cuMemFree_v2"))
        script = f'{probes} {{ }} BEGIN {{ printf("ready\\n"); }}'
        self.proc = subprocess.Popen(
            ["bpftrace", "-e", script], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        for line in self.proc.stdout:
            if line.strip() == "ready":
                break

    def close(self) -> None:
        self.proc.send_signal(signal.SIGTERM)  # bpftrace 0.17 may hang on SIGINT
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def agents_loaded() -> int:
    """Programs named alloc_exit loaded now, this bench's included: another agent or bench on the machine
    (watching every process, it probes this bench's stand-in too) makes a round worth nothing."""
    shown = subprocess.run(["bpftool", "prog", "show"], capture_output=True, text=True).stdout
    return shown.count(" name alloc_exit ")


def median(values: list[float]) -> float:
    return statistics.median(values)


Cell = tuple[int, str]  # (Python frames, layout)


def pair_costs(
    lib: str, empty: str, n: int, rounds: int, before: str | None, depths: tuple[int, ...] = DEPTHS
) -> tuple[dict[str, dict[Cell, list[float]]], int, list[bool]]:
    """ns per pair of each set-up, per round and layout (the set-ups interleaved in each round); events the
    agents lost; per round, whether another agent's programs were loaded meanwhile (agents_loaded).

    *before*: another BPF object for the agent (GPUFLAME_AGENT_BPF), run as set-up ``before`` in the same rounds."""
    setups = ["none", "empty", "agent"]
    if shutil.which("bpftrace"):
        setups.insert(2, "bpftrace")
    if before:
        setups.append("before")
    cells = [(d, layout) for layout in LAYOUTS for d in depths]
    runs: dict[str, dict[Cell, list[float]]] = {k: {c: [] for c in cells} for k in setups}
    lost = 0
    spoiled: list[bool] = []
    for _ in range(rounds):
        foreign = False
        for setup in setups:
            target = Pairs(lib)
            attached: object = None
            if setup == "empty":
                attached = attach_empty(empty, lib)
            elif setup == "bpftrace":
                attached = Bpftrace(lib)
            elif setup in ("agent", "before"):
                given = os.environ.get(build.ENV_OBJECT)  # the agent's object where one was given
                if setup == "before":
                    os.environ[build.ENV_OBJECT] = before
                attached = Agent(pids=[target.pid], probes="return")
                attached.start()
                os.environ.pop(build.ENV_OBJECT, None)
                if given is not None:
                    os.environ[build.ENV_OBJECT] = given
            own = 1 if setup in ("empty", "agent", "before") else 0
            foreign |= agents_loaded() > own
            for depth, layout in cells:
                runs[setup][(depth, layout)].append(target.ask(f"{layout} {depth} {n}"))
            foreign |= agents_loaded() > own
            target.close()
            if isinstance(attached, Agent):
                lost += attached.stats()["lost_events"]
                attached.stop()
            elif attached is not None:
                attached.close()
        spoiled.append(foreign)
    return runs, lost, spoiled


def entry_costs(lib: str, empty: str, n: int, repeat: int) -> dict[str, dict[int, float]]:
    """Entry-only probes (--probes entry): best of *repeat* rounds, ns per pair."""
    best: dict[str, dict[int, float]] = {"empty_entry": {}, "entry": {}}
    sites = return_sites(lib)
    for _ in range(repeat):
        for setup in best:
            target = Pairs(lib)
            attached: object
            if setup == "empty_entry":
                attached = attach_empty(empty, lib, sites)
            else:
                attached = Agent(pids=[target.pid], probes="entry")
                attached.start()
            for depth in DEPTHS:
                ns = target.ask(f"time {depth} {n}")
                best[setup][depth] = min(best[setup].get(depth, ns), ns)
            target.close()
            if isinstance(attached, Agent):
                attached.stop()
            else:
                attached.close()
    return best


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


def print_pairs(entry: str, runs: dict[str, dict[Cell, list[float]]], spoiled: list[bool]) -> None:
    """The table (medians over the rounds no other agent spoiled, or over all where each was), then every round."""
    cells = list(runs["none"])
    every = list(runs["none"].values())[0]
    kept = [i for i in range(len(every)) if not spoiled[i]] or list(range(len(every)))
    runs_all, runs = runs, {k: {c: [v[i] for i in kept] for c, v in cells_of.items()} for k, cells_of in runs.items()}
    print(f"\nprobed functions start with {entry}: ns of the caller's CPU per pair, median over rounds")
    print("  (ratios: median of each round's agent / empty, the set-ups interleaved in each round;")
    print("   guarded: the caller's frames right above an unreadable page)")
    if len(kept) < len(every):
        print(f"  rounds {[i + 1 for i in range(len(every)) if i not in kept]} left out: another agent was loaded")
    print(
        f"{'frames':>15} "
        + " ".join(f"{k:>9}" for k in runs)
        + "  agent/empty"
        + "  agent/bpftrace" * ("bpftrace" in runs)
    )
    for cell in cells:
        if any(math.isnan(v) for k in runs for v in runs[k][cell]):
            print(f"{cell[0]:>3} {cell[1]:>11}  (the guarded layout could not be made in every round: not measured)")
            continue
        line = f"{cell[0]:>3} {cell[1]:>11} " + " ".join(f"{median(runs[k][cell]):>9.0f}" for k in runs)
        for base in ("empty", "bpftrace"):
            if base in runs:
                ratios = sorted(a / e for a, e in zip(runs["agent"][cell], runs[base][cell], strict=True))
                line += f"  {median(ratios):.2f}x ({ratios[0]:.2f}-{ratios[-1]:.2f})"
        if "before" in runs:
            ratios = sorted(a / e for a, e in zip(runs["before"][cell], runs["empty"][cell], strict=True))
            line += f"  before/empty {median(ratios):.2f}x"
        print(line)
    print("  every round, in order (ns per pair of each set-up, then agent/empty):")
    for cell in cells:
        for i in range(len(every)):
            values = " ".join(f"{k} {runs_all[k][cell][i]:.0f}" for k in runs_all)
            ratio = runs_all["agent"][cell][i] / runs_all["empty"][cell][i]
            extra = ""
            if "before" in runs_all:
                extra = f" before/empty {runs_all['before'][cell][i] / runs_all['empty'][cell][i]:.2f}"
            said = "  (another agent loaded)" if spoiled[i] else ""
            print(f"  {cell[0]:>3} {cell[1]:>8} round {i + 1}: {values}  agent/empty {ratio:.2f}{extra}{said}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=5, help="rounds (medians are taken over them)")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--before", help="another agent BPF object, run as set-up 'before' in the same rounds")
    parser.add_argument("--only", choices=("pairs", "rate"), help="only the per-pair cost, or only the rate")
    parser.add_argument("--entry-only", action="store_true", help="also the entry-only probes (--probes entry)")
    parser.add_argument("--python", default=sys.executable, help="the caller's interpreter (default: this one)")
    parser.add_argument("--entries", default="push,step", help="which stand-ins: push (emulated), step, or both")
    args = parser.parse_args()
    global PYTHON
    PYTHON = args.python
    reason = why_not()
    if reason:
        print(f"bench_agent: skipped: {reason}")
        return 0
    build.ensure()
    with tempfile.TemporaryDirectory() as tmp:
        libs, empty = build_standins(Path(tmp))
        if args.only != "rate":
            lost = 0
            for entry, what in (("push", "push %rbp (emulated)"), ("step", "sub $8,%rsp (single-stepped)")):
                if entry not in args.entries.split(","):
                    continue
                runs, n_lost, spoiled = pair_costs(libs[entry], empty, args.pairs, args.repeat, args.before)
                lost += n_lost
                print_pairs(what, runs, spoiled)
            print(f"events the agents lost meanwhile: {lost}")
        if args.entry_only:
            costs = entry_costs(libs["push"], empty, args.pairs, args.repeat)
            print("\nentry-only probes (--probes entry): entry probes + a plain uprobe on the return site (best)")
            print(f"{'frames':>7} {'empty progs':>12} {'agent':>8} {'agent/empty':>12}")
            for d in DEPTHS:
                emp, ag = costs["empty_entry"][d], costs["entry"][d]
                print(f"{d:>7} {emp:>12.0f} {ag:>8.0f} {ag / emp:>11.2f}x")
        if args.only != "pairs":
            print("\nrate (allocations/s), several paced processes at 10 frames")
            for rate, procs in ((100_000, 2), (300_000, 4)):
                control = null_control()
                r = rate_run(libs["push"], rate, args.seconds, procs)
                print(
                    f"asked {rate:>7}: made {r['rate']:>9.0f}/s, booked {r['booked']}/{r['made']}, lost {r['lost']}, "
                    f"agent CPU {r['cpu_per_event_us']:.2f} us/event ({100 * r['cpu_share']:.0f}% of a core); "
                    f"null control {control:.0f} ns/step"
                )
            took = first_named_sample(libs["push"])
            print(f"\nfirst correctly named sample: {took:.3f} s after starting the agent")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
