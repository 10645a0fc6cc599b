"""What a change costs the CPU allocator hook: the demo loop under the hook of two revisions, side by side.

Each round runs one process per tree, alternating (``--base`` REV, then
this working tree): a process loads that tree's gpuflame and demo, warms
up, then times the demo's generate loop bare and under that tree's
:class:`TorchAllocatorRecorder`, interleaved, ``--repeat`` times. Ratios are
the best hook loop over the best bare loop, by wall time and by the
process's CPU time (steadier on a shared machine: waiting for a CPU does
not count). Then the same for 100,000 ``torch.empty(10)`` (an allocation
and a free each): what the hook adds per allocation, in CPU nanoseconds.
Each tree compiles its own hook once (cached by source).

    python bench/bench_hook_revisions.py --base c035558 [--rounds 4] [--repeat 7]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child(tree: Path, repeat: int) -> None:
    """Time bare and hooked loops with *tree*'s code; print the best of each as JSON."""
    sys.path.insert(0, str(tree / "src"))
    sys.path.insert(0, str(tree / "bench"))
    import torch

    import gpuflame
    from bench_capture_torch import demo_workload
    from gpuflame.capture.recorders.allocator import TorchAllocatorRecorder
    from gpuflame.capture.recorders.allocator.native import load_cpu_hook

    assert Path(gpuflame.__file__).resolve().is_relative_to(tree.resolve()), gpuflame.__file__
    torch.set_num_threads(1)
    demo = demo_workload(4, 32, 16)
    hook = load_cpu_hook()
    demo()
    best: dict[str, float] = {}
    for _ in range(repeat):
        for work, name in [(demo, n) for n in ("bare", "hook")] + [(churn, n) for n in ("churn bare", "churn hook")]:
            rec = TorchAllocatorRecorder(hook) if name.endswith("hook") else None
            wall, cpu = time.perf_counter(), time.process_time()
            if rec:
                rec.start()
            work()
            if rec:
                rec.stop()
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            best[name + " wall"] = min(best.get(name + " wall", wall), wall)
            best[name + " cpu"] = min(best.get(name + " cpu", cpu), cpu)
    print(json.dumps(best))


def churn() -> None:
    import torch

    for _ in range(100_000):
        torch.empty(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the git revision to compare with")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child, args.repeat)
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.base], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive.stdout, check=True)
        trees = {args.base: base, "working tree": ROOT}
        best: dict[str, dict[str, float]] = {name: {} for name in trees}
        for _ in range(args.rounds):
            for name, tree in trees.items():
                cmd = [sys.executable, __file__, "--base", args.base, "--repeat", str(args.repeat)]
                cmd += ["--child", str(tree)]
                out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
                for key, value in json.loads(out.splitlines()[-1]).items():
                    best[name][key] = min(best[name].get(key, value), value)
    print(f"demo generate loop, best of {args.rounds} x {args.repeat}; hook loop / bare loop")
    for name, b in best.items():
        print(
            f"{name:14} wall {b['hook wall'] / b['bare wall']:.3f}x ({b['bare wall'] * 1e3:.1f} ms bare)"
            f"   cpu {b['hook cpu'] / b['bare cpu']:.3f}x ({b['bare cpu'] * 1e3:.1f} ms bare)"
            f"   per allocation +{(b['churn hook cpu'] - b['churn bare cpu']) * 1e4:.0f} ns cpu"
            f" ({b['churn bare cpu'] * 1e4:.0f} ns bare)"
        )


if __name__ == "__main__":
    main()
