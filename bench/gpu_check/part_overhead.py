"""torch-cuda's cost on a real training step and a generate loop: paired, interleaved rounds with a null control.

One process, both workloads built once (models.py). Each round times the
same number of iterations three ways, in an order that turns each round:
bare, bare again (the null control: what two identical runs differ by on
this machine), and under ``gpuflame.start(backend="torch-cuda")``, whose
``stop(write=False)`` (building the profile) is timed apart. Per round the
ratio to that round's bare time; the median over rounds is the overhead,
beside the null control's median and spread. Goal: under 3%.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from .common import Context, table, write_status

NAME = "overhead"
FILE = "overhead.md"
TITLE = "torch-cuda's overhead: a training step and a generate loop"
LIMIT_S = 60.0
GOAL = 0.03
WAYS = ("bare", "null", "gpuflame")


def timed(work: Callable[[], Any], iters: int, sync: Callable[[], None]) -> float:
    sync()
    start = time.perf_counter()
    for _ in range(iters):
        work()
    sync()
    return time.perf_counter() - start


def recorded(work: Callable[[], Any], iters: int, sync: Callable[[], None], backend: str) -> tuple[float, float, int]:
    """The loop's seconds under a recording, stop()'s seconds, and the profile's peak bytes (proof it recorded)."""
    import gpuflame

    gpuflame.start(backend=backend)
    try:
        loop = timed(work, iters, sync)
    finally:
        t = time.perf_counter()
        profile = gpuflame.stop(write=False)
        stopped = time.perf_counter() - t
    peak = profile.totals().get("peak_space", 0) if profile is not None else 0
    return loop, stopped, peak


def measure(
    work: Callable[[], Any], plan: tuple[int, float, float], sync: Callable[[], None], backend: str, ctx: Context
) -> dict[str, Any]:
    """Rounds of the three ways until *plan*'s round count or seconds run out (three rounds at least, unless
    the part's own time limit is near).

    Each way runs as many iterations as take *plan*'s seconds per measurement (2 to 50).
    """
    max_rounds, seconds, per_measurement = plan
    iters = 2
    if per_measurement:  # the dry run's 2 iterations need no warm-up or calibration
        work(), work()  # warm-up: kernels chosen, the allocator's pools made
        per_call = timed(work, 2, sync) / 2
        iters = max(2, min(50, int(per_measurement / max(per_call, 1e-6))))
    ratios, nulls, stops, peaks, bare = [], [], [], [], []
    start = time.monotonic()
    for r in range(max_rounds):
        if (r >= 3 and time.monotonic() - start > seconds) or (r >= 1 and ctx.left(10) < 0):
            break
        got: dict[str, float] = {}
        for way in WAYS[r % 3 :] + WAYS[: r % 3]:
            if way == "gpuflame":
                got[way], stop_s, peak = recorded(work, iters, sync, backend)
                stops.append(stop_s)
                peaks.append(peak)
            else:
                got[way] = timed(work, iters, sync)
        ratios.append(got["gpuflame"] / got["bare"])
        nulls.append(got["null"] / got["bare"])
        bare.append(got["bare"] / iters)
    return {"iters": iters, "ratios": ratios, "nulls": nulls, "stops": stops, "peaks": peaks, "bare": bare}


def row(name: str, m: dict[str, Any]) -> list[str]:
    r, n = m["ratios"], m["nulls"]
    overhead = statistics.median(r) - 1
    verdict = "met" if overhead < GOAL else "MISSED"
    return [
        name,
        f"{len(r)} x {m['iters']}",
        f"{statistics.median(m['bare']) * 1e3:.2f} ms",
        f"{overhead:+.1%} ({min(r) - 1:+.1%} .. {max(r) - 1:+.1%})",
        f"{statistics.median(n) - 1:+.1%} ({min(n) - 1:+.1%} .. {max(n) - 1:+.1%})",
        f"{statistics.median(m['stops']) * 1e3:.0f} ms",
        f"{max(m['peaks']) / (1 << 20):.1f} MiB",
        verdict,
    ]


def main(ctx: Context) -> None:
    import torch

    from .models import SIZES, implementation, started

    cuda = torch.cuda.is_available()
    if not cuda and not ctx.dry_run:
        write_status(ctx.out / FILE, TITLE, "skipped: no CUDA")
        return
    device, backend = (torch.device("cuda"), "torch-cuda") if cuda else (torch.device("cpu"), "torch")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    impl = implementation(ctx.impl)
    plan = (2, 0.0, 0.0) if ctx.dry_run else (9, 20.0, 0.25)
    results = {}
    notes: list[str] = []
    for name, label in (("gpt2-train", "training step"), ("llama-generate", "generate loop")):
        work, used = started(name, SIZES[ctx.size], device, impl)
        if used != impl:
            notes.append(f"{name}: {used}")
        results[f"{label} ({name})"] = measure(work, plan, sync, backend, ctx)
        print(name, results[f"{label} ({name})"], flush=True)
    rows = [row(k, m) for k, m in results.items()]
    header = ["workload", "rounds x iterations", "bare per iteration", "overhead (range)", "null control (range)",
              "stop()", "profile peak", f"goal < {GOAL:.0%}"]  # fmt: skip
    body = (
        f"device {device}, backend {backend}, models: {impl}, size {ctx.size}; median over rounds of "
        f"each round's ratio to its own bare time\n\n" + table(header, rows)
    ) + "".join(f"\n\nmodels instead: {n}" for n in notes)
    summary = ", ".join(f"{k.split(' (')[0]} {r[3].split(' ')[0]}" for k, r in zip(results, rows, strict=True))
    empty = [k for k, m in results.items() if not min(m["peaks"])]
    if empty:  # the recording held nothing: its cost was measured on a recorder that did not record
        status = f"failed: a recording's profile was empty ({', '.join(empty)})"
    elif cuda:
        status = f"ok: {summary} (goal < {GOAL:.0%}: {'met' if all(r[-1] == 'met' for r in rows) else 'MISSED'})"
    else:
        status = f"skipped: no CUDA (dry run: the rounds ran with the torch backend on the CPU: {summary})"
    write_status(ctx.out / FILE, TITLE, status, body)
