"""Run every benchmark in bench/ in turn (``make bench``); ``--check`` re-measures the headline ratios.

``python bench/run_all.py --check [--only NAME ...]`` runs, for each claim
in :data:`CLAIMS` (the ratios BENCHMARKS.md's "Headline ratios" section
states, each with its command, in short rounds), its bench, reads the
measured ratio from the bench's output and prints: the claim, what
BENCHMARKS.md says, what was measured now, the bound, and whether it holds.
Exit status 1 when one no longer holds (or could not be measured). Short
rounds on a shared machine are noisy: a claim that fails here is to be
re-measured with the bench's full rounds before BENCHMARKS.md changes.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

STEPS = [
    ["bench/make_snapshot.py"],
    ["bench/bench_convert.py"],
    ["bench/bench_read_snapshot.py"],
    ["bench/bench_stop.py"],
    ["bench/bench_run_whole.py"],
    ["bench/bench_simulate.py"],
    ["bench/bench_profile.py"],
    ["bench/bench_capture_torch.py"],
    ["bench/bench_dispatch_tiny.py"],
    ["bench/bench_gil_contention.py"],
    ["bench/bench_pyroscope.py"],
    ["bench/bench_viewer.py"],
    ["bench/bench_agent.py"],  # root and BPF only; says why it skips otherwise
    ["bench/bench_agent_reader.py"],
    ["bench/bench_agent_stop.py", "--repeat", "1"],  # root and BPF only, as bench_agent.py
    ["bench/bench_agent_late.py", "--runs", "2", "--hold"],  # root and BPF only, as bench_agent.py
    ["bench/bench_pytest_plugin.py"],
    ["bench/bench_pprof_read.py"],
]

MAGMA27 = "tests/data/torch-snapshot-MAGMA27-memory_snapshot.pickle.gz"


@dataclass(frozen=True)
class Claim:
    """One headline ratio: the bench that measures it, where its output says it, and the bound it must keep."""

    name: str
    what: str  # the comparison, in words: which two things the ratio divides
    claimed: str  # as BENCHMARKS.md states it
    command: tuple[str, ...]  # bench/ script and its arguments (short rounds), run from the repository root
    pattern: str  # a regular expression whose first group is the ratio in the bench's output
    bound: float
    at_least: bool = False  # the ratio must be >= bound (a speed-up); otherwise <= bound (a cost)
    needs: tuple[str, ...] = ()  # bench/ scripts to run first (inputs the bench reads)


CLAIMS = (
    Claim(
        "pytest-small",
        "CPU of pytest --gpuflame-fail-on-increase --gpuflame-categories / plain pytest, 200 small torch tests",
        "1.09-1.13x (three runs of 7 paired rounds; goal <= 1.10x)",
        ("bench/bench_pytest_plugin.py", "--suite", "small", "--repeat", "3", "--no-peer"),
        r"ratio all: ([0-9.]+)",
        1.10,
    ),
    Claim(
        "pytest-trivial",
        "the same, 200 trivial tests (a 64x32 matmul each)",
        "1.10x (5 paired rounds, null 1.01x; goal <= 1.25x)",
        ("bench/bench_pytest_plugin.py", "--suite", "trivial", "--repeat", "3", "--no-peer"),
        r"ratio all: ([0-9.]+)",
        1.25,
    ),
    Claim(
        "torch-hook",
        "the demo's generate loop under the CPU allocator hook / bare, in one process",
        "1.03-1.08x (goal < 1.3x)",
        ("bench/bench_capture_torch.py", "--repeat", "3"),
        r"gpuflame torch ratio ([0-9.]+)x",
        1.30,
    ),
    Claim(
        "dispatch-tiny",
        "a 64-wide 2-layer Llama's generate loop under the dispatch recorder / bare (every op tiny)",
        "2.5-2.9x",
        ("bench/bench_capture_torch.py", "--model", "tiny", "--repeat", "3"),
        r"with --torch-hook dispatch ([0-9.]+)x",
        2.90,
    ),
    Claim(
        "dispatch-memray",
        "CPU over bare of gpuflame run --torch-hook dispatch / of memray run, 200k tiny ops (whole processes)",
        "goal <= 1.00x",
        ("bench/bench_dispatch_tiny.py", "--rounds", "3", "--no-hook"),
        r"(?m)^dispatch/memray ([0-9.]+)x",
        1.00,
    ),
    Claim(
        "run-demo",
        "CPU of gpuflame run on the demo / the demo bare (whole process tree)",
        "1.11x",
        ("bench/bench_run_whole.py", "--rounds", "3"),
        r"run:\S+\s+CPU\s+[0-9.]+ s \(([0-9.]+)x bare\)",
        1.25,
    ),
    Claim(
        "convert-same-dict",
        "torch _memory_viz segments()+memory() / gpuflame from_snapshot, one process, the same dict (stand-in)",
        "2.03x (goal >= 2x)",
        ("bench/bench_convert.py", "--repeat", "3"),
        r"ratio \(from the same dict\):\s+([0-9.]+)x",
        2.0,
        at_least=True,
        needs=("bench/make_snapshot.py",),
    ),
    Claim(
        "convert-viz-in-process",
        "gpuflame decode / pickle.loads + _memory_viz segments()+memory(), one process, real snapshots (worst)",
        "1.8-9.8x (slower)",
        ("bench/bench_read_snapshot.py", "--rounds", "3"),
        r"convert/viz ([0-9.]+)x",
        11.0,
    ),
    Claim(
        "convert-viz-command",
        "CPU of gpuflame convert / python -m torch.cuda._memory_viz trace_plot, whole commands (MAGMA27)",
        "0.06-0.2x (5-16x faster)",
        ("bench/bench_convert_process.py", "--rounds", "3", "--viz", MAGMA27),
        r"convert/viz-command ([0-9.]+)x",
        0.2,
    ),
    Claim(
        "pprof-load",
        "CPU of reading a 2M-sample pprof into gpuflame's profile / protobuf's Profile.FromString plus a flat top "
        "(fresh processes)",
        "goal <= 1.50x",
        ("bench/bench_pprof_read.py", "--rounds", "3"),
        r"ratio load/parse\+top: ([0-9.]+)x",
        1.50,
    ),
    Claim(
        "pprof-report",
        "CPU of gpuflame report on a 2M-sample pprof / protobuf's Profile.FromString plus a flat top (fresh processes)",
        "goal <= 1.50x",
        ("bench/bench_pprof_read.py", "--rounds", "3"),
        r"ratio report/parse\+top: ([0-9.]+)x",
        1.50,
    ),
)


def measured(claim: Claim, output: str) -> float | None:
    """The claim's ratio in a bench's *output*: the worst of its matches (several files), None without one."""
    values = [float(m) for m in re.findall(claim.pattern, output)]
    if not values:
        return None
    return min(values) if claim.at_least else max(values)


def holds(claim: Claim, value: float | None) -> bool:
    if value is None:
        return False
    return value >= claim.bound if claim.at_least else value <= claim.bound


def verdict_line(claim: Claim, value: float | None) -> str:
    now = f"{value:.2f}x" if value is not None else "not measured"
    bound = f"{'>=' if claim.at_least else '<='} {claim.bound:.2f}x"
    said = "holds" if holds(claim, value) else "NO LONGER HOLDS"
    return f"{claim.name:24} claimed {claim.claimed:26} now {now:13} bound {bound:9} {said}"


def run_bench(command: tuple[str, ...]) -> str:
    """A bench's output (stdout and stderr), run with this interpreter from the repository root."""
    done = subprocess.run([sys.executable, *command], cwd=ROOT, capture_output=True, text=True, check=False)
    return done.stdout + done.stderr


def check(claims: tuple[Claim, ...], run: Callable[[tuple[str, ...]], str] = run_bench) -> list[bool]:
    """Measure each claim with *run* (a command -> its output), print its line; whether each holds."""
    prepared: set[str] = set()
    results = []
    for claim in claims:
        for need in claim.needs:
            if need not in prepared:
                run((need,))
                prepared.add(need)
        print(f"$ python {' '.join(claim.command)}   # load average {load()}", flush=True)
        output = run(claim.command)
        value = measured(claim, output)
        print(f"  {claim.what}")
        for line in [line for line in output.splitlines() if re.search(claim.pattern, line)][:8]:
            print(f"  | {line.strip()}")
        print("  " + verdict_line(claim, value), flush=True)
        results.append(holds(claim, value))
    return results


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def chosen(names: list[str]) -> tuple[Claim, ...]:
    """The claims named (all when none); an unknown name is one line and exit 2."""
    known = {c.name: c for c in CLAIMS}
    unknown = [n for n in names if n not in known]
    if unknown:
        print(f"run_all.py: no claim named {', '.join(unknown)} (claims: {', '.join(known)})", file=sys.stderr)
        raise SystemExit(2)
    return tuple(known[n] for n in names) if names else CLAIMS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="re-measure the headline ratios; say which still hold")
    parser.add_argument("--only", nargs="+", default=[], metavar="NAME", help="with --check: these claims only")
    args = parser.parse_args(argv)
    if args.check:
        results = check(chosen(args.only))
        failed = results.count(False)
        print(f"{len(results) - failed} of {len(results)} claims hold" + (f"; {failed} no longer" if failed else ""))
        return 1 if failed else 0
    for step in STEPS:
        print(f"$ python {' '.join(step)}", flush=True)
        rc = subprocess.call([sys.executable, *step], cwd=ROOT)
        if rc:
            return rc
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
