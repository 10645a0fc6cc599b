"""Paired CPU timings of ``torch_snapshot.decode``: this checkout against another revision, in one process.

The other revision's ``src/gpuflame`` is copied to a temporary folder as the
package ``gpuflame_base`` (its imports rewritten), so both decoders run in
the same process, round after round, order alternating, each call after a
``gc.collect()`` and timed in CPU seconds. Per snapshot: ``before`` (the
other revision, its in-memory source indexes cleared, as a fresh process
has them), ``after`` (this checkout, the same; its on-disk source indexes
kept, as every run after the first has them), ``first`` (this checkout with
the on-disk indexes removed too) and ``null`` (``after`` again: the noise).
Printed: the medians of the per-round ratios.

    git worktree add /tmp/base BASE_REV   # or any checkout of the revision
    python bench/bench_decode_against.py /tmp/base/src [--rounds 7] [FILE ...]
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from gpuflame.defaults import source_index_dir  # noqa: E402
from gpuflame.formats import torch_snapshot  # noqa: E402
from gpuflame.symbols import qualnames  # noqa: E402


def base_package(src: Path, into: Path) -> tuple[ModuleType, ModuleType]:
    """The other revision's ``torch_snapshot`` and ``qualnames``, imported as ``gpuflame_base``."""
    target = into / "gpuflame_base"
    shutil.copytree(src / "gpuflame", target)
    for path in target.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        path.write_text(re.sub(r"^(\s*)(from|import) gpuflame\b", r"\1\2 gpuflame_base", text, flags=re.M), "utf-8")
    sys.path.insert(0, str(into))
    return importlib.import_module("gpuflame_base.formats.torch_snapshot"), importlib.import_module(
        "gpuflame_base.symbols.qualnames"
    )


def timed(fn: Callable[[], object]) -> float:
    gc.collect()
    start = time.process_time()
    fn()
    return time.process_time() - start


def bench(path: Path, rounds: int, base: ModuleType, base_names: ModuleType) -> None:
    raw = path.read_bytes()

    def before() -> None:
        base_names._FILES.clear()
        base.decode(raw)

    def after() -> None:
        qualnames._FILES.clear()
        torch_snapshot.decode(raw)

    def first() -> None:
        shutil.rmtree(source_index_dir(), ignore_errors=True)
        after()

    runs = {"before": before, "after": after, "null": after, "first": first}
    after()  # the on-disk indexes as a second run finds them
    times: dict[str, list[float]] = {name: [] for name in runs}
    for r in range(rounds):
        for name in list(runs) if r % 2 == 0 else list(reversed(runs)):
            times[name].append(timed(runs[name]))
    med = {name: statistics.median(t) * 1000 for name, t in times.items()}

    def ratio(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(times[a], times[b], strict=True))

    print(f"{path.name}: {rounds} rounds; medians " + ", ".join(f"{k} {v:.1f} ms" for k, v in med.items()))
    print(
        f"  after/before {ratio('after', 'before'):.2f}x  null after/after {ratio('null', 'after'):.2f}x  "
        f"first/before {ratio('first', 'before'):.2f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base_src", type=Path, help="the other revision's src folder")
    parser.add_argument("files", nargs="*", type=Path)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_intermixed_args()
    files = args.files or sorted((ROOT / "tests" / "data").glob("torch-snapshot-*.pickle.gz"))
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["GPUFLAME_CACHE_DIR"] = str(Path(tmp) / "cache")
        base, base_names = base_package(args.base_src, Path(tmp))
        for path in files:
            bench(path, args.rounds, base, base_names)


if __name__ == "__main__":
    main()
