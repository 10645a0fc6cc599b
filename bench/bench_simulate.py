"""Time ``gpuflame simulate``'s replay against ``gpuflame convert`` of the same snapshot.

Both work from the same snapshot dict in one process (the unpickling,
common to both, is left out): gpuflame convert's ``from_snapshot`` (the
peak replay, in-use, alloc, qualified names) against simulate's replay of
every device through the allocator model under the recorded settings (the
state at the first event rebuilt, every event placed and compared). The
snapshot is ``bench/make_snapshot.py``'s hand-written stand-in at 20,000
and 1,000,000 trace events (its own small simulation made it, so the
replay disagrees with its placements: the comparison is timed, not checked).

    python bench/bench_simulate.py                  # 20k and 1M events
    python bench/bench_simulate.py --events 20000 --repeat 5
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpuflame.formats import torch_snapshot  # noqa: E402
from gpuflame.simulate.replay import Input, Run  # noqa: E402
from gpuflame.simulate.settings import DEFAULTS, Settings, from_recorded  # noqa: E402
from make_snapshot import make_snapshot  # noqa: E402


def best(fn: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def one(events: int, repeat: int) -> None:
    snap = make_snapshot(entries=events, depth=20)
    n = sum(len(t) for t in snap["device_traces"])
    inp = Input("<bench>", snapshot=snap, recorded=from_recorded(snap.get("allocator_settings")) or DEFAULTS)
    simulate = best(lambda: Run(inp, inp.recorded).outcomes(), repeat)
    expandable = best(lambda: Run(inp, Settings(expandable_segments=True)).outcomes(), repeat)
    convert = best(lambda: torch_snapshot.from_snapshot(snap), repeat)
    print(
        f"{n:>9,} events: simulate {simulate:6.2f} s (expandable_segments:True {expandable:6.2f} s), "
        f"convert {convert:6.2f} s, simulate/convert {simulate / convert:.2f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, nargs="*", default=[20_000, 1_000_000])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    for events in args.events:
        one(events, args.repeat if events <= 100_000 else 1)


if __name__ == "__main__":
    main()
