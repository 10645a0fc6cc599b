"""gpuflame simulate against the GPU: each prediction beside the same workload really run under that setting.

For each workload (a GPT-2 training step, a Llama generate), from its
default run's real snapshot (the snapshots part's runs are used where they
match, else the run is made here):
``gpuflame simulate --json`` under the recorded settings (the replay),
``expandable_segments:True``, ``max_split_size_mb:32``,
``roundup_power2_divisions:4`` and a memory cap at 80% of the default
reserved peak (the run's ``set_per_process_memory_fraction``; simulate's
``--memory-fraction`` of ``--gpu-memory``, the device's size), each beside
workloads.py run on the GPU under the same setting: reserved peak, segment
events, out of memory or not. The out-of-memory recording is replayed with
its own fraction. Then the same workload run on the CPU under ``gpuflame
run --backend torch``, replayed by simulate as a prediction for the GPU,
beside the real default run. Everything through gpuflame's command line.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from . import part_snapshots
from .common import (
    WORKLOADS,
    Context,
    cuda_available,
    gpuflame_argv,
    mib,
    python,
    run,
    run_workloads,
    table,
    write_status,
)

NAME = "simulate"
FILE = "simulate.md"
TITLE = "simulate against the GPU"
LIMIT_S = 130.0
WORKLOAD_NAMES = ("gpt2-train", "llama-generate")
SETTINGS = ("expandable_segments:True", "max_split_size_mb:32", "roundup_power2_divisions:4")
CAP_SHARE = 0.8  # the memory cap, as a share of the default run's reserved peak
CONTEXT_BYTES = 512 << 20  # simulate's --gpu-memory leaves this for the CUDA context
NOMINAL_DEVICE = 80 << 30  # the device's size in a dry run without CUDA
HEADER = ["workload", "setting", "predicted from", "simulated reserved peak", "real reserved peak", "difference",
          "simulated segments made / freed", "real segment events", "simulated OOM", "real OOM"]  # fmt: skip


@functools.cache
def simulate_help() -> str:
    return run(gpuflame_argv("simulate", "--help"), 30).stdout


def device_total(cuda: bool) -> int:
    """cuda:0's memory in bytes (what set_per_process_memory_fraction takes its share of), else a nominal 80 GiB."""
    if not cuda:
        return NOMINAL_DEVICE
    import torch

    return int(torch.cuda.get_device_properties(0).total_memory)


def cap_flags(cap: int, total: int) -> tuple[list[str], str]:
    """simulate's flags for a run capped at *cap* bytes by set_per_process_memory_fraction, and them in words.

    ``--memory-fraction`` (the share of ``--gpu-memory``) where this gpuflame takes it, else the device made
    as small as the cap (``--gpu-memory`` less the CUDA context's share simulate sets aside).
    """
    if "--memory-fraction" in simulate_help():
        fraction = cap / total
        return ["--gpu-memory", str(total), "--memory-fraction", repr(fraction)], f"--memory-fraction {fraction:.4g}"
    return ["--gpu-memory", str(cap + CONTEXT_BYTES)], f"--gpu-memory {mib(cap + CONTEXT_BYTES)}"


def simulate(path: Path, ctx: Context, *options: str) -> dict[str, Any]:
    """``gpuflame simulate PATH --json``'s first device, or ``{"error": why}``."""
    done = run(gpuflame_argv("simulate", str(path), "--json", *options), min(60, ctx.left()))
    if done.rc not in (0, 1) or not done.stdout.startswith("{"):  # 1: it runs out of memory on that device
        return {"error": done.why()}
    return json.loads(done.stdout)["devices"][0]


def cpu_profile(ctx: Context, workload: str) -> tuple[Path | None, str]:
    """The workload on the CPU under ``gpuflame run --backend torch``: its profile, or None and why."""
    out = ctx.scratch / "simulate" / f"{workload}-cpu.pb.gz"
    command = [python(), str(WORKLOADS), workload, "--device", "cpu", "--size", ctx.size, "--impl", ctx.impl]
    done = run(gpuflame_argv("run", "--backend", "torch", "-o", str(out), "--", *command), min(90, ctx.left()))
    return (out, "") if done.ok and out.exists() else (None, done.why())


def real_run(ctx: Context, workload: str, conf: str, cap: int) -> dict[str, Any]:
    """The workload on the GPU under *conf* or a memory cap, its history recorded: what workloads.py reports."""
    label = (conf or f"cap{cap}").replace(":", "-")
    extra = ["--snapshot", str(ctx.scratch / "simulate" / f"{workload}-{label}.pickle.gz")]
    extra += ["--memory-limit", str(cap)] if cap else []
    results, done = run_workloads(
        ctx, [workload], "cuda", 60, {"PYTORCH_CUDA_ALLOC_CONF": conf} if conf else None, *extra
    )
    return results[0] if results else {"error": done.why()}


def sim_cells(sim: dict[str, Any] | None) -> list[str]:
    if sim is None:
        return ["-", "-"]
    if "error" in sim:
        return [sim["error"], "-"]
    s = sim["simulated"]
    return [mib(s["reserved_peak"]), f"{s['segments_allocated']} / {s['segments_freed']}"]


def real_cells(real: dict[str, Any] | None, why_none: str) -> list[str]:
    if real is None:
        return [why_none, "-"]
    if "error" in real:
        return [real["error"], "-"]
    events = ", ".join(f"{k.removeprefix('segment_')} {v}" for k, v in real.get("segment_events", {}).items() if v)
    return [mib(real["reserved_peak"]), events or "none"]


def row(
    workload: str, setting: str, source: str, sim: dict[str, Any] | None, real: dict[str, Any] | None, why: str
) -> list[str]:
    s, r = sim_cells(sim), real_cells(real, why)
    diff = "-"
    if sim and "error" not in sim and real and "error" not in real and real.get("reserved_peak"):
        diff = f"{sim['simulated']['reserved_peak'] / real['reserved_peak'] - 1:+.1%}"
    sim_oom = "-" if not sim or "error" in sim else ("yes" if sim["oom"] else "no")
    real_oom = "-" if not real or "error" in real else ("yes" if real["oom"] else "no")
    return [workload, setting, source, s[0], r[0], diff, s[1], r[1], sim_oom, real_oom]


def recorded_run(recorded: dict[str, dict[str, Any]], workload: str, conf: str) -> dict[str, Any] | None:
    """The snapshots part's run of *workload* under *conf* with no memory cap, where it made one."""
    return next(
        (r for r in recorded.values() if r.get("workload") == workload and r.get("alloc_conf") == conf
         and "fraction" not in r and "error" not in r and Path(r.get("snapshot", "")).exists()),
        None,
    )  # fmt: skip


def capped_recordings(ctx: Context, workload: str, recorded: dict[str, dict[str, Any]], cuda: bool) -> list[list[str]]:
    """The snapshots part's runs of *workload* under a memory fraction (the OOM run) replayed with that fraction."""
    rows = []
    for r in recorded.values():
        if r.get("workload") != workload or "fraction" not in r or "error" in r or not Path(r["snapshot"]).exists():
            continue
        total = device_total(cuda)
        flags, how = cap_flags(int(r["fraction"] * total), total)
        sim = simulate(Path(r["snapshot"]), ctx, *flags)
        rows.append(row(workload, f"{r['recording']} replayed ({how})", "its own GPU snapshot", sim, r, ""))
    return rows


def one_workload(ctx: Context, workload: str, cuda: bool, recorded: dict[str, dict[str, Any]]) -> list[list[str]]:
    """The rows of one workload: the replay, each setting, the cap, the CPU run's prediction."""
    why = "no CUDA" if not cuda else "not run"
    cpu, cpu_why = cpu_profile(ctx, workload)
    base = recorded_run(recorded, workload, "") if cuda else None
    if cuda and base is None:
        base = part_snapshots.record(ctx, workload, workload, "", 0)
    source = Path(base["snapshot"]) if base and "error" not in base else cpu
    label = "GPU snapshot" if source is not cpu else "CPU profile"
    if source is None:
        return [[workload, "all", "-", f"no input: {(base or {}).get('error') or cpu_why}"] + ["-"] * 6]
    rows = [row(workload, "recorded settings (replay)", label, simulate(source, ctx), base if cuda else None, why)]
    for conf in SETTINGS:
        real = (recorded_run(recorded, workload, conf) or real_run(ctx, workload, conf, 0)) if cuda else None
        rows.append(row(workload, conf, label, simulate(source, ctx, "--alloc-conf", conf), real, why))
    peak = (base or {}).get("reserved_peak") or (simulate(source, ctx).get("simulated") or {}).get("reserved_peak")
    if peak:
        cap = int(CAP_SHARE * peak)
        flags, how = cap_flags(cap, device_total(cuda))
        sim = simulate(source, ctx, *flags)
        real = real_run(ctx, workload, "", cap) if cuda else None
        rows.append(
            row(workload, f"memory cap {mib(cap)} ({CAP_SHARE:.0%} of the default peak; {how})", label, sim, real, why)
        )
    rows += capped_recordings(ctx, workload, recorded, cuda)
    cpu_sim = simulate(cpu, ctx) if cpu else {"error": cpu_why}
    rows.append(row(workload, "CPU run predicted for the GPU", "CPU profile", cpu_sim, base if cuda else None, why))
    return rows


def main(ctx: Context) -> None:
    cuda = cuda_available()
    (ctx.scratch / "simulate").mkdir(parents=True, exist_ok=True)
    recorded = part_snapshots.load_results(ctx)
    rows: list[list[str]] = []
    for workload in WORKLOAD_NAMES[:1] if ctx.dry_run and not cuda else WORKLOAD_NAMES:
        rows += one_workload(ctx, workload, cuda, recorded)
        write_status(ctx.out / FILE, TITLE, "running", table(HEADER, rows))
    errors = [r for r in rows if any("exit " in c or "timed out" in c for c in r)]
    if errors:  # a prediction that fails is the check's news, with CUDA or without
        status = f"failed: {len(errors)} of {len(rows)} rows could not be made (below)"
    elif not cuda:
        status = "skipped: no CUDA (dry run: the predictions below, from CPU profiles, beside no real run)"
    else:
        status = "ok"
    note = (
        "Real segment events count the trace's segment_alloc, segment_free, segment_map and segment_unmap "
        "entries of the run under that setting; 'difference' is simulated / real reserved peak - 1.\n\n"
    )
    write_status(ctx.out / FILE, TITLE, status, note + table(HEADER, rows))
