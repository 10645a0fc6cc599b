"""The dispatch recorder against ``memray run`` on 200,000 tiny ops: whole processes, paired rounds.

The workload is bench/tiny_ops.py (four aten ops on 16 floats a step, two
of them new storages). Each round runs, in alternating order:

* ``bare``: ``python bench/tiny_ops.py``; ``null``: the same again (the
  null control: what noise alone gives);
* ``dispatch``: ``gpuflame run --backend torch --torch-hook dispatch``
  (the dispatch recorder: launcher, start-up, recording, final write and
  merge all counted); ``dispatch:NAME`` the same from another checkout
  (``--tree``, for before/after pairs in one run);
* ``empty-mode``: the workload under a ``TorchDispatchMode`` that only
  calls each op (``tiny_ops.py --empty-mode``): the floor of any recorder
  built on a dispatch mode, torch's own cost per op once a mode is on;
* ``hook``: ``gpuflame run --backend torch --torch-hook allocator`` (the
  CPU allocator hook), unless ``--no-hook``;
* ``memray``: ``python -m memray run`` (every malloc with its Python
  stack, to a file), when memray is installed (the ``bench`` extra).

CPU time (user + system of the process tree, from ``wait4``), one thread
for torch (``OMP_NUM_THREADS=1``). Every round is printed with the load
average at its start, each variant as CPU seconds and its ratio to that
round's bare; then the median ratio per variant, the recorders' cost per
op in µs ((variant - bare) / ops, medians), and the dispatch recorder's
cost over memray's (``dispatch/memray``: (dispatch - bare) / (memray -
bare), the medians of the rounds).

    python bench/bench_dispatch_tiny.py [--rounds 7] [--ops 200000] [--tree OLD_CHECKOUT]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

Variant = tuple[list[str], dict[str, str]]


def cpu_of(cmd: list[str], env: dict[str, str]) -> float:
    """CPU seconds of *cmd* and every process it waited for."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{' '.join(cmd)} failed: {proc.stderr.read().decode() if proc.stderr else ''}")
    return usage.ru_utime + usage.ru_stime


def variants(ops: int, trees: list[Path], hook: bool, out: Path) -> dict[str, Variant]:
    """Each way to run the workload: its command and environment."""
    work = [str(ROOT / "bench" / "tiny_ops.py"), str(ops)]
    plain = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPYCACHEPREFIX=str(out / "pycache"))
    plain.pop("PYTHONDONTWRITEBYTECODE", None)
    plain.pop("PYTHONPATH", None)
    bare = [sys.executable, *work]
    found: dict[str, Variant] = {"bare": (bare, plain), "null": (bare, plain)}

    def gpuflame(tree: Path, how: str, name: str) -> Variant:
        env = dict(plain, PYTHONPATH=str(tree.resolve() / "src"))
        output = str(out / f"{name.replace(':', '-')}.pb.gz")
        cmd = [sys.executable, "-m", "gpuflame", "run", "--backend", "torch", "--torch-hook", how]
        return [*cmd, "--force", "-o", output, "--", *bare], env

    found["empty-mode"] = ([*bare, "--empty-mode"], plain)
    found["dispatch"] = gpuflame(ROOT, "dispatch", "dispatch")
    for tree in trees:
        found[f"dispatch:{tree.name}"] = gpuflame(tree, "dispatch", f"dispatch:{tree.name}")
    if hook:
        found["hook"] = gpuflame(ROOT, "allocator", "hook")
    if importlib.util.find_spec("memray") is not None:
        memray = [sys.executable, "-m", "memray", "run", "-q", "-f", "-o", str(out / "memray.bin"), *work]
        found["memray"] = (memray, plain)
    return found


def load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--ops", type=int, default=200_000)
    parser.add_argument("--tree", type=Path, action="append", default=[], help="another checkout to compare")
    parser.add_argument("--no-hook", dest="hook", action="store_false", help="leave the allocator hook out")
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="gpuflame-bench-tiny-"))
    ways = variants(args.ops, args.tree, args.hook, out)
    for name in ways:  # warm-up: bytecode caches, the hook's compile
        cpu_of(*ways[name])
    cpu: dict[str, list[float]] = {k: [] for k in ways}
    print(f"{args.ops} tiny ops (bench/tiny_ops.py), {args.rounds} rounds, CPU s (x that round's bare)")
    for r in range(args.rounds):
        order = list(ways) if r % 2 == 0 else list(reversed(ways))
        at = load()
        for name in order:
            cpu[name].append(cpu_of(*ways[name]))
        cells = "  ".join(f"{n} {cpu[n][-1]:.2f} ({cpu[n][-1] / cpu['bare'][-1]:.2f}x)" for n in ways)
        print(f"round {r + 1} load {at}: {cells}", flush=True)
    print(f"medians over {args.rounds} rounds (load now {load()}):")
    for name in ways:
        ratio = statistics.median(a / b for a, b in zip(cpu[name], cpu["bare"], strict=True))
        per_op = statistics.median((a - b) / args.ops * 1e6 for a, b in zip(cpu[name], cpu["bare"], strict=True))
        print(f"  {name:20} CPU {statistics.median(cpu[name]):6.2f} s  {ratio:.2f}x bare  {per_op:+6.2f} us/op")
    if "memray" in ways:
        for name in [n for n in ways if n.startswith("dispatch")]:
            ours = statistics.median(a - b for a, b in zip(cpu[name], cpu["bare"], strict=True))
            peer = statistics.median(a - b for a, b in zip(cpu["memray"], cpu["bare"], strict=True))
            print(f"{name}/memray {ours / peer:.2f}x (the recorders' cost over bare, medians)")


if __name__ == "__main__":
    main()
