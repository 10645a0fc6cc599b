"""Whole-process cost of ``gpuflame run`` on the demo: paired rounds against the bare script.

Each round runs, in alternating order: the bare script, the bare script
again (the **null control**: bare against bare, what noise alone gives),
and ``gpuflame run -o ... -- python SCRIPT`` (launcher, start-up, recording,
final write and merge all counted). Optionally ``--tree OTHER`` adds
``gpuflame run`` from another checkout (for before/after pairs on one
machine). CPU time (user + system, of the whole process tree, from
``wait4``) and wall time; the median of the per-round ratios is printed.
torch runs on one thread (``OMP_NUM_THREADS=1``), as in
bench_capture_torch.py: its spinning worker threads otherwise swamp the CPU
time on a shared machine. Every variant gets a bytecode cache
(``PYTHONPYCACHEPREFIX``, ``PYTHONDONTWRITEBYTECODE`` dropped) and one
untimed warm-up run, as an installed gpuflame would have its bytecode.

    python bench/bench_run_whole.py [--rounds 7] [--tree ../main] [-- SCRIPT ARGS...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(CPU s, wall s) of *cmd* and every process it waited for."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{' '.join(cmd)} failed: {proc.stderr.read().decode() if proc.stderr else ''}")
    return usage.ru_utime + usage.ru_stime, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--tree", type=Path, action="append", default=[], help="another checkout to compare")
    parser.add_argument("script", nargs="*", default=[str(ROOT / "examples" / "demo.py")])
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="gpuflame-bench-run-"))
    bare = [sys.executable, *args.script]
    plain = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPYCACHEPREFIX=str(out / "pycache"))
    plain.pop("PYTHONDONTWRITEBYTECODE", None)
    variants: dict[str, tuple[list[str], dict[str, str]]] = {"bare": (bare, plain), "null": (bare, plain)}
    for tree in [ROOT, *args.tree]:
        env = dict(plain, PYTHONPATH=str(tree.resolve() / "src"))
        cmd = [sys.executable, "-m", "gpuflame", "run", "--force", "-o", str(out / f"{tree.name}.pb.gz"), "--", *bare]
        variants[f"run:{tree.name}"] = (cmd, env)
    cpu: dict[str, list[float]] = {k: [] for k in variants}
    wall: dict[str, list[float]] = {k: [] for k in variants}
    for name in variants:
        run(*variants[name])
    for r in range(args.rounds):
        for name in list(variants) if r % 2 == 0 else list(reversed(variants)):
            c, w = run(*variants[name])
            cpu[name].append(c)
            wall[name].append(w)
    print(f"{' '.join(args.script)}: {args.rounds} rounds")
    for name in variants:
        rc = statistics.median(a / b for a, b in zip(cpu[name], cpu["bare"], strict=True))
        rw = statistics.median(a / b for a, b in zip(wall[name], wall["bare"], strict=True))
        print(
            f"  {name:16} CPU {statistics.median(cpu[name]):6.2f} s ({rc:.2f}x bare)  "
            f"wall {statistics.median(wall[name]):6.2f} s ({rw:.2f}x bare)"
        )


if __name__ == "__main__":
    main()
