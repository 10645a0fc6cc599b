"""What a dispatch mode costs per op before it records anything, beside memray and gpuflame's recorders.

Why the dispatch recorder cannot be as cheap as ``memray run`` on tiny ops
(issue 42 item 2): the cost of a ``TorchDispatchMode`` that records nothing
is measured here in parts, on bench/tiny_ops.py's loop (four aten ops on 16
floats a step, two of them new storages), in a fresh process per variant
and round, timing the loop only (CPU time of the process during it: no
start-up, no final write):

* ``bare``: the loop; ``null``: the same again (the noise);
* ``glue``: a mode whose ``__torch_dispatch__`` returns a tensor made
  beforehand instead of calling the loop's four ops: torch's round trip
  into Python and back, the part no mode can avoid;
* ``empty``: a mode that calls each op (``func._op(*args)``): the floor of
  any recorder built on a dispatch mode;
* ``dispatch``: gpuflame's dispatch recorder (``gpuflame.profile``,
  ``torch_hook="dispatch"``), ``allocator`` the CPU allocator hook;
* ``memray``: ``memray.Tracker`` (every malloc with its Python stack).

Each line is µs per op over that round's bare (medians over rounds); the
last says how much of memray's per-op cost the empty mode already takes.

    python bench/bench_dispatch_floor.py [--rounds 5] [--ops 200000]
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

CHILD = """
import contextlib, io, sys, time
sys.path[:0] = [{bench!r}, {src!r}]
import torch
from torch.utils._python_dispatch import TorchDispatchMode
import tiny_ops

variant, ops, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
torch.set_num_threads(1)
made = torch.ones(4, 4)
aten = torch.ops.aten
loop_ops = {{aten.add.Tensor, aten.view.default, aten.mul_.Tensor, aten.mm.default}}


class Glue(TorchDispatchMode):
    @classmethod
    def _should_skip_dynamo(cls):
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in loop_ops:
            return made.detach()
        return func._op(*args, **(kwargs or {{}}))


if variant == "glue":
    ctx = Glue()
elif variant == "empty":
    ctx = tiny_ops.EmptyMode()
elif variant in ("dispatch", "allocator"):
    import gpuflame
    ctx = gpuflame.profile(out, backend="torch", torch_hook=variant)
elif variant == "memray":
    import memray
    ctx = memray.Tracker(out)
else:
    ctx = contextlib.nullcontext()
with ctx:
    with contextlib.redirect_stdout(io.StringIO()):
        t = time.process_time()
        tiny_ops.main(ops)
        spent = time.process_time() - t
print(spent)
"""


def loop_cpu(variant: str, ops: int, work: Path, script: Path) -> float:
    """CPU seconds of the loop alone under *variant*, in a fresh process."""
    out = work / f"{variant}.out"
    out.unlink(missing_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, str(script), variant, str(ops), str(out)], env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        sys.exit(f"{variant} failed: {done.stderr[-2000:]}")
    return float(done.stdout.split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ops", type=int, default=200_000)
    args = parser.parse_args()
    names = ["bare", "null", "glue", "empty", "dispatch", "allocator"]
    if importlib.util.find_spec("memray") is not None:
        names.append("memray")
    extra: dict[str, list[float]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory(prefix="gpuflame-floor-") as tmp:
        work = Path(tmp)
        script = work / "child.py"
        script.write_text(CHILD.format(bench=str(ROOT / "bench"), src=str(ROOT / "src")))
        print(f"{args.ops} tiny ops (bench/tiny_ops.py), {args.rounds} rounds, the loop's CPU, us/op over bare")
        for r in range(args.rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            cpu = {n: loop_cpu(n, args.ops, work, script) for n in order}
            for n in names:
                extra[n].append((cpu[n] - cpu["bare"]) / args.ops * 1e6)
            cells = "  ".join(f"{n} {cpu[n]:.2f}s" for n in names)
            print(f"round {r + 1} load {' '.join(f'{x:.2f}' for x in os.getloadavg())}: {cells}")
    med = {n: statistics.median(v) for n, v in extra.items()}
    print("medians over the rounds:")
    for n in names:
        print(f"  {n:10} {med[n]:+6.2f} us/op   rounds {' '.join(f'{x:+.2f}' for x in extra[n])}")
    if "memray" in med and med["memray"] > 0:
        print(f"empty mode / memray: {med['empty'] / med['memray']:.2f} of memray's per-op cost before recording")
        print(f"dispatch / memray: {med['dispatch'] / med['memray']:.2f}")


if __name__ == "__main__":
    main()
