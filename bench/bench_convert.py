"""Time ``gpuflame convert`` against PyTorch's ``_memory_viz`` on one large snapshot.

Both work from the same dict in one process: gpuflame's ``from_snapshot``
(peak by replaying the trace, in-use, alloc, and qualified names recovered
from source) against ``torch.cuda._memory_viz.segments()`` plus ``memory()``
(the folded text of the blocks alive at the end, flamegraph.pl not run). The
file-to-file times add the unpickling: gpuflame's restricted unpickler
against plain ``pickle.load``. Best of --repeat runs; caches are cleared
before each run so every run pays for its first look at a source file.

The snapshot may be someone else's (a real one downloaded from a public
repository): it is only ever read with gpuflame's restricted unpickler, and
plain ``pickle.loads`` is timed on a copy re-pickled here from that dict.
``--native`` times the ``--native`` reading of ``stacks="all"`` frames.

    python bench/make_snapshot.py                 # bench/out/large_snapshot.pickle
    python bench/bench_convert.py                 # prints the ratio
"""

from __future__ import annotations

import argparse
import pickle
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from gpuflame.formats import safe_pickle, torch_snapshot  # noqa: E402
from gpuflame.formats.gzip_io import GZIP_MAGIC, gunzip  # noqa: E402
from gpuflame.symbols import qualnames  # noqa: E402
from gpuflame.units import format_bytes  # noqa: E402


def best(fn: Callable[[], Any], repeat: int, before: Callable[[], None]) -> tuple[float, Any]:
    times = []
    result = None
    for _ in range(repeat):
        before()
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return min(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("snapshot", nargs="?", type=Path, default=Path("bench/out/large_snapshot.pickle"))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--native", action="store_true", help="keep the C++ frames (convert --native)")
    args = parser.parse_args()
    if not args.snapshot.exists():
        sys.exit(f"{args.snapshot}: missing; run: python bench/make_snapshot.py -o {args.snapshot}")

    from torch.cuda import _memory_viz

    data = args.snapshot.read_bytes()
    if data[:2] == GZIP_MAGIC:
        data = gunzip(data)
    snap = safe_pickle.loads(data)  # never plain pickle on a file from elsewhere
    plain = pickle.dumps(snap, protocol=2)  # what _dump_snapshot writes, made here from plain dicts
    trace = sum(len(t) for t in snap.get("device_traces", []))
    blocks = sum(len(s["blocks"]) for s in snap["segments"])
    reserved = sum(s["total_size"] for s in snap["segments"])
    print(
        f"snapshot: {args.snapshot} ({len(data) / 1e6:.1f} MB, {format_bytes(reserved)} reserved, "
        f"{trace:,} trace entries, {blocks:,} blocks)"
    )

    def clear_gpuflame() -> None:
        qualnames._FILES.clear()
        qualnames._MEMO.clear()

    def clear_viz() -> None:
        _memory_viz._frame_filter.cache_clear()

    def viz() -> int:
        identity: Callable[[str], str] = lambda text: text  # noqa: E731  (skip flamegraph.pl)
        return len(_memory_viz.segments(snap, identity)) + len(_memory_viz.memory(snap, identity))

    t_ours, profile = best(lambda: torch_snapshot.from_snapshot(snap, native=args.native), args.repeat, clear_gpuflame)
    t_viz, _ = best(viz, args.repeat, clear_viz)
    t_load_ours, _ = best(lambda: safe_pickle.loads(data), args.repeat, lambda: None)
    t_load_plain, _ = best(lambda: pickle.loads(plain), args.repeat, lambda: None)

    totals = profile.totals()
    print(
        f"gpuflame from_snapshot:        {t_ours:7.3f} s  "
        f"(peak {format_bytes(totals.get('peak_space', 0))}, in use {format_bytes(totals['inuse_space'])}, "
        f"allocated {format_bytes(totals.get('alloc_space', 0))}; "
        f"{len(profile.samples):,} samples)"
    )
    print(f"_memory_viz segments+memory:  {t_viz:7.3f} s  (folded text of the end state only)")
    print(f"ratio (from the same dict):   {t_viz / t_ours:7.2f}x  (goal: >= 2x)")
    print(f"unpickle: gpuflame {t_load_ours:.3f} s (restricted), pickle.load {t_load_plain:.3f} s")
    file_ours = t_load_ours + t_ours
    file_viz = t_load_plain + t_viz
    ratio = file_viz / file_ours
    print(f"file to profile:              {file_ours:7.3f} s vs {file_viz:.3f} s  -> {ratio:.2f}x")


if __name__ == "__main__":
    main()
