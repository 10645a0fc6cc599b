"""Paired CPU timings of whole commands on a snapshot: ``gpuflame convert`` against ``pickle.load`` of the file.

Each contender is a fresh Python process (start-up and imports included, as
a user runs them), run round after round with the order alternating; its CPU
time (user + system, from ``RUSAGE_CHILDREN``) is what counts, so the load
of a shared machine moves the figures less than wall time would:

- ``pickle``: ``python -c 'pickle.load(gzip.open(FILE))'`` (plain ``open``
  for an uncompressed file), twice: the second is the null control;
- ``convert``: ``python -m gpuflame convert FILE -o OUT.pb.gz`` (the
  on-disk source indexes of earlier runs kept, in a folder of this run's own);
- ``base`` (with ``--base-src``): the same command from another revision's
  ``src`` folder (``PYTHONPATH``), for a before/after;
- ``viz`` (with ``--viz``): PyTorch's own command,
  ``python -m torch.cuda._memory_viz trace_plot FILE -o OUT.html``, on the
  file gunzipped once beforehand (it reads plain pickles only; the gunzip is
  not counted). Its ``convert/viz`` is the whole-command comparison, unlike
  ``bench_read_snapshot.py``'s ``convert/viz`` (in one process, from the
  same bytes, ``segments()`` + ``memory()`` only, no torch import counted).

    python bench/bench_convert_process.py [--rounds 7] [--base-src /tmp/base/src] [--viz] [FILE ...]
"""

from __future__ import annotations

import argparse
import gzip
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOAD = "import gzip, pickle, sys; f = sys.argv[1]; pickle.load(gzip.open(f) if f.endswith('.gz') else open(f, 'rb'))"


def cpu_of(command: list[str], env: dict[str, str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def bench(path: Path, rounds: int, base_src: Path | None, tmp: Path, viz: bool = False) -> None:
    env = dict(os.environ, GPUFLAME_CACHE_DIR=str(tmp / "cache"), PYTHONPATH=str(ROOT / "src"))
    convert = [sys.executable, "-m", "gpuflame", "convert", str(path), "-o", str(tmp / "out.pb.gz"), "--force"]
    runs: dict[str, tuple[list[str], dict[str, str]]] = {
        "pickle": ([sys.executable, "-c", LOAD, str(path)], env),
        "null": ([sys.executable, "-c", LOAD, str(path)], env),
        "convert": (convert, env),
    }
    if base_src is not None:
        runs["base"] = (convert, dict(env, PYTHONPATH=str(base_src)))
    if viz:
        plain = tmp / "snapshot.pickle"
        plain.write_bytes(gzip.open(path).read() if path.name.endswith(".gz") else path.read_bytes())
        trace_plot = ["-m", "torch.cuda._memory_viz", "trace_plot", str(plain), "-o", str(tmp / "out.html")]
        runs["viz"] = ([sys.executable, *trace_plot], env)
    cpu_of(*runs["convert"])  # the on-disk source indexes, as every run after the first finds them
    times: dict[str, list[float]] = {name: [] for name in runs}
    for r in range(rounds):
        for name in list(runs) if r % 2 == 0 else list(reversed(runs)):
            times[name].append(cpu_of(*runs[name]))

    def ratio(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(times[a], times[b], strict=True))

    med = ", ".join(f"{name} {statistics.median(t) * 1000:.0f} ms" for name, t in times.items())
    line = f"  null/pickle {ratio('null', 'pickle'):.2f}x  convert/pickle {ratio('convert', 'pickle'):.2f}x"
    if base_src is not None:
        line += f"  convert/base {ratio('convert', 'base'):.2f}x"
    if viz:
        line += f"  convert/viz-command {ratio('convert', 'viz'):.2f}x"
    print(f"{path.name}: {rounds} rounds, CPU medians {med}\n{line}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", type=Path)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--base-src", type=Path, help="another revision's src folder, for a before/after")
    parser.add_argument("--viz", action="store_true", help="also time PyTorch's _memory_viz trace_plot command")
    args = parser.parse_intermixed_args()
    files = args.files or sorted((ROOT / "tests" / "data").glob("torch-snapshot-*.pickle.gz"))
    with tempfile.TemporaryDirectory() as tmp:
        for path in files:
            bench(path, args.rounds, args.base_src, Path(tmp), args.viz)


if __name__ == "__main__":
    main()
