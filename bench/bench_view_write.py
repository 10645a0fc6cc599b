"""Time ``gpuflame view`` writing the page of a large profile: one source tree against another, paired.

Each round runs ``python -m gpuflame view PROFILE -o PAGE`` once with every
source tree (``--base`` an unpacked ``git archive REV src``, and this
checkout's ``src``), in alternating order, plus a second run of the base as
the **null control**: the base against itself, whose ratio is what noise
alone gives on this shared machine. Reported per round and as medians: the
child's CPU seconds (user + system, from ``os.wait4``; steadier than wall
time when other work shares the cores) and wall seconds. The profile is
``tests/helpers/large_profile.py``'s ``tree_profile(N)`` (N distinct functions, one
sample each, stacks 40-60 deep), made once into ``bench/out/``.

    git archive a37b21f src | tar -x -C /tmp/base
    python bench/bench_view_write.py --frames 100000 --rounds 5 --base /tmp/base/src
    python bench/bench_view_write.py --frames 1000000 --rounds 1 --base /tmp/base/src
"""

from __future__ import annotations

import argparse
import base64
import gzip
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out" / "view_write"


def make_profile(frames: int) -> Path:
    """The generated profile as gzip pprof, written once (its own process: it takes minutes at 1M)."""
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"tree{frames}.pb.gz"
    if not path.exists():
        code = (
            "import sys; sys.path[:0] = [sys.argv[1], sys.argv[2]]\n"
            "from tests.helpers.large_profile import tree_profile\nfrom gpuflame.formats import save\n"
            "save(tree_profile(int(sys.argv[3])), sys.argv[4])"
        )
        subprocess.run([sys.executable, "-c", code, str(ROOT / "src"), str(ROOT), str(frames), str(path)], check=True)
    return path


def run_view(src: Path, profile: Path, page: Path) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one ``gpuflame view`` with *src* first on the path."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    start = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-m", "gpuflame", "view", str(profile), "-o", str(page)], env=env, stdout=subprocess.DEVNULL
    )
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"gpuflame view failed with {src}")
    return usage.ru_utime + usage.ru_stime, wall


def page_body(page: Path) -> bytes:
    """The page's payload inflated: equal data whatever zlib level either side compressed it at."""
    text = page.read_text(encoding="utf-8")
    found = re.search(r'<script type="application/octet-stream"[^>]*>([^<]*)</script>', text)
    if found is None:
        raise SystemExit(f"{page}: no payload found")
    return gzip.decompress(base64.b64decode(found.group(1)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--base", type=Path, required=True, help="the src/ folder to compare against")
    parser.add_argument("--new", type=Path, default=ROOT / "src", help="the src/ folder measured (default: this one)")
    args = parser.parse_args()
    profile = make_profile(args.frames)
    trees = {"base": args.base.resolve(), "null": args.base.resolve(), "new": args.new.resolve()}
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in trees}
    for round_ in range(args.rounds):
        order = list(trees) if round_ % 2 == 0 else list(reversed(trees))
        for name in order:
            times[name].append(run_view(trees[name], profile, OUT / f"{name}.html"))
        row = {k: v[-1] for k, v in times.items()}
        print(
            f"round {round_ + 1}: " + ", ".join(f"{k} {c:.1f} s CPU / {w:.1f} s wall" for k, (c, w) in row.items()),
            f"| new/base {row['new'][0] / row['base'][0]:.2f}x, null/base {row['null'][0] / row['base'][0]:.2f}x",
            flush=True,
        )
    same = page_body(OUT / "new.html") == page_body(OUT / "base.html")
    for kind, i in (("CPU", 0), ("wall", 1)):
        ratio = statistics.median(n[i] / b[i] for n, b in zip(times["new"], times["base"], strict=True))
        null = statistics.median(n[i] / b[i] for n, b in zip(times["null"], times["base"], strict=True))
        print(
            f"{args.frames} frames, {kind}: base {statistics.median(t[i] for t in times['base']):.1f} s, "
            f"new {statistics.median(t[i] for t in times['new']):.1f} s; median new/base {ratio:.3f}x, "
            f"null (base/base) {null:.3f}x"
        )
    print("pages hold identical data" if same else "pages differ")


if __name__ == "__main__":
    main()
