"""Paired timings of reading real PyTorch snapshots: gpuflame against plain pickle and ``_memory_viz``.

For each snapshot (default: the real ones in ``tests/data``), in one
process, round after round with the order of the contenders alternating,
each call timed in CPU seconds (``time.process_time``) after a ``gc.collect()``:

- ``pickle``: plain ``pickle.loads`` of the (gunzipped) bytes, twice per
  round: the second is the **null control** (bare against bare), whose
  median ratio says how far two identical runs drift on this machine;
- ``scan``: the restricted reader's opcode scan alone (``safe_pickle.scan``:
  what it adds to the C unpickler, the floor of any safe read here);
- ``safe``: gpuflame's restricted reader (``safe_pickle.loads``: the opcode
  scan, then the C unpickler limited to plain data);
- ``convert``: the whole of ``gpuflame convert`` but the write
  (``torch_snapshot.decode``: restricted read and conversion), the
  in-memory source-file indexes cleared first, as a fresh process has them,
  the on-disk ones (``symbols/index_cache.py``, in a temporary folder here)
  kept, as every run after the first has them;
- ``first``: the same with the on-disk indexes removed too: the first run
  on a machine, every source file on the stacks parsed with ``ast``;
- ``viz``: ``pickle.loads`` then ``torch.cuda._memory_viz.segments()`` and
  ``memory()`` (their folded text, flamegraph.pl not run), cache cleared.

The medians of the per-round ratios are printed: ``safe/pickle``,
``convert/pickle`` (issue 23's goal: <= 1.5x), ``convert/viz`` and
``first/viz`` (goal <= 1x on small traces). Only ever reads a
snapshot with gpuflame's restricted reader first (plain pickle runs on the
same bytes only once that accepted them).

    python bench/bench_read_snapshot.py [--rounds 11] [FILE ...]
"""

from __future__ import annotations

import argparse
import gc
import os
import pickle
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from gpuflame.defaults import source_index_dir  # noqa: E402
from gpuflame.formats import safe_pickle, torch_snapshot  # noqa: E402
from gpuflame.formats.gzip_io import GZIP_MAGIC, gunzip  # noqa: E402
from gpuflame.symbols import qualnames  # noqa: E402


def timed(fn: Callable[[], object]) -> float:
    gc.collect()
    start = time.process_time()  # CPU seconds: the machine is shared, wall time measures the neighbours
    fn()
    return time.process_time() - start


def median_ratio(num: list[float], den: list[float]) -> float:
    return statistics.median(a / b for a, b in zip(num, den, strict=True))


def bench(path: Path, rounds: int) -> None:
    from torch.cuda import _memory_viz

    raw = path.read_bytes()
    data = gunzip(raw) if raw[:2] == GZIP_MAGIC else raw
    snap = safe_pickle.loads(data)  # refuses anything but plain data before plain pickle sees the bytes
    events = sum(len(t) for t in snap.get("device_traces", []))

    def viz() -> None:
        _memory_viz._frame_filter.cache_clear()
        loaded = pickle.loads(data)
        identity: Callable[[str], str] = lambda text: text  # noqa: E731  (skip flamegraph.pl)
        _memory_viz.segments(loaded, identity)
        _memory_viz.memory(loaded, identity)

    def convert() -> None:
        qualnames._FILES.clear()
        torch_snapshot.decode(raw)

    def first() -> None:
        qualnames._FILES.clear()
        shutil.rmtree(source_index_dir(), ignore_errors=True)
        torch_snapshot.decode(raw)

    runs: dict[str, Callable[[], object]] = {
        "pickle": lambda: pickle.loads(data),
        "null": lambda: pickle.loads(data),
        "scan": lambda: safe_pickle.scan(data),
        "safe": lambda: safe_pickle.loads(data),
        "convert": convert,
        "first": first,
        "viz": viz,
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    for r in range(rounds):
        for name in list(runs) if r % 2 == 0 else list(reversed(runs)):
            times[name].append(timed(runs[name]))
    med = {name: statistics.median(t) * 1000 for name, t in times.items()}
    print(f"{path.name}: {len(data) / 1e6:.2f} MB, {events:,} trace events, {rounds} rounds")
    print("  medians: " + ", ".join(f"{name} {ms:.1f} ms" for name, ms in med.items()))
    print(
        f"  null pickle/pickle {median_ratio(times['null'], times['pickle']):.2f}x  "
        f"scan/pickle {median_ratio(times['scan'], times['pickle']):.2f}x  "
        f"safe/pickle {median_ratio(times['safe'], times['pickle']):.2f}x  "
        f"convert/pickle {median_ratio(times['convert'], times['pickle']):.2f}x  "
        f"convert/viz {median_ratio(times['convert'], times['viz']):.2f}x  "
        f"first/viz {median_ratio(times['first'], times['viz']):.2f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", type=Path)
    parser.add_argument("--rounds", type=int, default=11)
    args = parser.parse_args()
    files = args.files or sorted((ROOT / "tests" / "data").glob("torch-snapshot-*.pickle.gz"))
    with tempfile.TemporaryDirectory() as cache:
        os.environ["GPUFLAME_CACHE_DIR"] = cache  # the on-disk source indexes: a folder of this run's own
        for path in files:
            bench(path, args.rounds)


if __name__ == "__main__":
    main()
