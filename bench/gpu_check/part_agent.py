"""The node agent on the real libcuda.so (BPF, as root), its per-stack bytes beside torch-cuda's and a snapshot's.

``gpuflame agent`` watches every process from its 'watching' line on; then
the GPT-2 training step runs twice: under ``gpuflame run --backend
torch-cuda`` and alone with its allocator history recorded (a snapshot).
Per stack (the innermost two Python frames) the agent's bytes for each
run's pid stand beside torch-cuda's and the snapshot's (``gpuflame.load``),
peak and allocated. The agent sees the driver's allocations (the segments),
the others the tensors inside them: per stack they differ by design, the
totals of peak should meet at the reserved peak.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from .common import (
    ROOT,
    WORKLOADS,
    Context,
    cuda_available,
    gpuflame_argv,
    mib,
    part_env,
    python,
    run,
    run_workloads,
    table,
    write_status,
)

NAME = "agent"
FILE = "agent.md"
TITLE = "The node agent on the real libcuda.so"
LIMIT_S = 70.0
TYPES = ("peak_space", "alloc_space")
TOP = 12


def by_stack(profile: Any, type_name: str, pid: int | None = None) -> dict[str, int]:
    """Bytes of *type_name* per stack key (the innermost two Python frames), of one pid's samples when given."""
    idx = profile.type_index(type_name)
    sums: dict[str, int] = {}
    for sample in profile.samples:
        if pid is not None and sample.label("pid") != str(pid):
            continue
        names = [f.name for f in profile.stack_frames(sample) if f.kind == "python"][:2]  # leaf first
        key = " < ".join(names) if names else "<no Python frame>"
        sums[key] = sums.get(key, 0) + sample.values[idx]
    return sums


def compare(columns: dict[str, tuple[Any, int | None]]) -> str:
    """A table of the top stacks, one peak and one allocated column per source, and a totals row."""
    sums = {(src, t): by_stack(p, t, pid) for src, (p, pid) in columns.items() for t in TYPES}
    keys = sorted({k for s in sums.values() for k in s}, key=lambda k: -max(s.get(k, 0) for s in sums.values()))
    header = ["stack (leaf < caller)"] + [f"{src} {t.removesuffix('_space')}" for src in columns for t in TYPES]
    rows = [[k] + [mib(sums[c].get(k)) for c in sums] for k in keys[:TOP]]
    rows.append(["**total**"] + [mib(sum(s.values())) for s in sums.values()])
    return table(header, rows)


class Agent:
    """``gpuflame agent`` in the background; its output lines in a queue until its 'watching' line."""

    def __init__(self, out: Path, libcuda: list[str]) -> None:
        argv = gpuflame_argv("agent", "-o", str(out), *[a for lib in libcuda for a in ("--libcuda", lib)])
        env = part_env(bpf_object())
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.said: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def wait_watching(self, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                if self.proc.poll() is not None:
                    return False
                continue
            self.said.append(line)
            if "gpuflame agent: watching" in line:
                return True
        return False

    def stop(self, timeout: float) -> int | None:
        self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return None
        finally:
            while not self.lines.empty():
                self.said.append(self.lines.get())


def bpf_object() -> dict[str, str]:
    """Where clang is missing, the BPF object this checkout carries is used as it is (GPUFLAME_AGENT_BPF):
    the agent would otherwise try to rebuild one whose file times the copy made look stale."""
    obj = ROOT / "src" / "gpuflame" / "agent" / "bpf" / "agent.bpf.o"
    return {"GPUFLAME_AGENT_BPF": str(obj)} if obj.exists() and shutil.which("clang") is None else {}


def libcuda_files() -> list[str]:
    """libcuda.so.1 as ldconfig knows it, so the probes are in before the first process loads it."""
    done = run(["ldconfig", "-p"], 10)
    return sorted({ln.split("=>")[-1].strip() for ln in done.stdout.splitlines() if "libcuda.so.1 " in ln})


def dry(ctx: Context) -> None:
    """No CUDA: the comparison built from the simulate part's CPU profile in every column, to keep its code alive."""
    import gpuflame

    cpu = ctx.scratch / "simulate" / "gpt2-train-cpu.pb.gz"
    body = "no CPU profile from the simulate part to build the table from"
    if cpu.exists():
        p = gpuflame.load(cpu)
        body = "dry run: the simulate part's CPU profile stands in for every column\n\n" + compare(
            {"agent": (p, None), "torch-cuda": (p, None), "snapshot": (p, None)}
        )
    write_status(ctx.out / FILE, TITLE, "skipped: no CUDA", body)


def main(ctx: Context) -> None:
    if not cuda_available():
        if ctx.dry_run:
            dry(ctx)
        else:
            write_status(ctx.out / FILE, TITLE, "skipped: no CUDA")
        return
    if os.geteuid() != 0:
        write_status(ctx.out / FILE, TITLE, "skipped: the agent needs root (BPF, uprobes)")
        return
    import gpuflame

    folder = ctx.scratch / "agent"
    folder.mkdir(parents=True, exist_ok=True)
    libcuda = libcuda_files()
    agent = Agent(folder / "agent.pb.gz", libcuda)
    try:
        if not agent.wait_watching(min(30, ctx.left())):
            said = "\n".join(agent.said[-30:])
            write_status(ctx.out / FILE, TITLE, "failed: the agent did not start", f"```\n{said}\n```")
            return
        workload = [python(), str(WORKLOADS), "gpt2-train", "--device", "cuda", "--size", ctx.size, "--impl", ctx.impl]
        tc = run(
            gpuflame_argv("run", "--backend", "torch-cuda", "-o", str(folder / "torch-cuda.pb.gz"), "--", *workload),
            min(60, ctx.left(15)),
        )
        results, snap = run_workloads(
            ctx, ["gpt2-train"], "cuda", 60, None, "--snapshot", str(folder / "snapshot.pickle.gz")
        )
    finally:
        rc = agent.stop(min(20, max(ctx.left(), 1)))
    said = "```\n" + "\n".join(agent.said[-8:]) + "\n```"
    problems = [d.why() for d in (tc, snap) if not d.ok] + ([] if rc == 0 else [f"the agent exited {rc}"])
    if not (folder / "agent.pb.gz").exists():
        write_status(ctx.out / FILE, TITLE, "failed: the agent wrote no profile; " + "; ".join(problems), said)
        return
    agent_profile = gpuflame.load(folder / "agent.pb.gz")
    sections = [f"libcuda: {', '.join(libcuda) or 'found by the agent'}; the agent said:\n\n{said}"]
    tc_pid = next((json.loads(ln)["pid"] for ln in tc.stdout.splitlines() if ln.startswith('{"workload"')), None)
    if tc.ok and tc_pid:
        columns = {"agent": (agent_profile, tc_pid), "torch-cuda": (gpuflame.load(folder / "torch-cuda.pb.gz"), None)}
        sections.append(f"## run 1: under gpuflame run --backend torch-cuda (pid {tc_pid})\n\n" + compare(columns))
    if snap.ok and results:
        r = results[0]
        columns = {"agent": (agent_profile, r["pid"]), "snapshot": (gpuflame.load(r["snapshot"]), None)}
        sections.append(
            f"## run 2: alone, its history recorded (pid {r['pid']}); real reserved peak {mib(r['reserved_peak'])}\n\n"
            + compare(columns)
        )
    status = "ok" if not problems else "failed: " + "; ".join(problems)
    write_status(ctx.out / FILE, TITLE, status, "\n\n".join(sections))
