"""How long ``gpuflame.stop()`` takes, and how much resident memory it adds, after N operations.

Each run is a fresh interpreter: ``gpuflame.start(backend="torch")`` (the
C++ allocator hook, or ``--hook dispatch``), N pairs of ``torch.empty`` and
its free over a few call sites, then ``stop()`` timed (building the profile,
the event history and the final write). The resident-memory jump is the
peak during ``stop()`` above the resident size just before it (the kernel's
high-water mark, reset through ``/proc/self/clear_refs``). Runs alternate
between the sizes and, with ``--tree OTHER``, between this checkout and
another (before/after pairs on one machine), and with ``--null`` this
checkout a second time (the null control: what noise alone gives). Wall and
CPU time of ``stop()`` (CPU time is steadier on a shared machine); the
medians, and the median of the per-run ratios to this checkout's run of the
same round, are printed.

    python bench/bench_stop.py [--ops 10000 100000 1000000] [--runs 3] [--hook allocator] [--tree ../main] [--null]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
import torch
import gpuflame

def rss_kib(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1])

def site_a(n):
    for _ in range(n):
        x = torch.empty(64)
        del x

def site_b(n):
    for _ in range(n):
        y = torch.empty(4096)
        del y

ops, out, hook = int(sys.argv[2]), sys.argv[3], sys.argv[4]
gpuflame.start(out, backend="torch", torch_hook=hook)
site_a(ops // 2)
site_b(ops - ops // 2)
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset the high-water mark to the current resident size
before = rss_kib("VmRSS:")
t, c = time.perf_counter(), time.process_time()
gpuflame.stop()
took, cpu = time.perf_counter() - t, time.process_time() - c
print(json.dumps({"stop_s": took, "stop_cpu_s": cpu, "rss_jump_mib": (rss_kib("VmHWM:") - before) / 1024,
                  "file_mb": os.path.getsize(out) / 1e6}))
"""


def one(tree: Path, ops: int, hook: str, folder: Path) -> dict[str, float]:
    out = folder / f"stop-{ops}.pb.gz"
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(tree / "src"), str(ops), str(out), hook],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if proc.returncode != 0:
        sys.exit(proc.stderr)
    return json.loads(proc.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--hook", default="allocator", choices=("allocator", "dispatch"))
    parser.add_argument("--tree", type=Path, action="append", default=[], help="another checkout to compare")
    parser.add_argument("--null", action="store_true", help="run this checkout twice: the null control")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="gpuflame-bench-stop-"))
    trees = [(ROOT.name, ROOT), *([("null", ROOT)] if args.null else []), *((t.name, t.resolve()) for t in args.tree)]
    results: dict[tuple[str, int], list[dict[str, float]]] = {(name, o): [] for name, _ in trees for o in args.ops}
    for run in range(args.runs):
        for name, tree in trees if run % 2 == 0 else trees[::-1]:
            for ops in args.ops:
                results[(name, ops)].append(one(tree, ops, args.hook, folder))
    for (name, ops), rows in results.items():
        med = {key: statistics.median(r[key] for r in rows) for key in rows[0]}
        mine = results[(ROOT.name, ops)]
        ratio = statistics.median(r["stop_cpu_s"] / m["stop_cpu_s"] for r, m in zip(rows, mine, strict=True))
        print(
            f"{name}: {ops:>10,} operations ({args.hook}): stop {med['stop_s']:.3f} s, CPU {med['stop_cpu_s']:.3f} s "
            f"({ratio:.2f}x {ROOT.name}), RSS jump {med['rss_jump_mib']:.1f} MiB, file {med['file_mb']:.1f} MB "
            f"({args.runs} runs)"
        )


if __name__ == "__main__":
    main()
