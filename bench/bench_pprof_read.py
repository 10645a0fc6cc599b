"""``gpuflame report`` on a large pprof against a plain protobuf parse plus a flat top, whole processes, paired.

Each round runs, in alternating order: **parse+top** (a fresh interpreter
that inflates the file, parses it with ``profile_pb2.Profile.FromString``,
the protobuf runtime's classes for pprof's own profile.proto, and sums each
sample's first value by its leaf location in Python: the least a reader of
pprof does), **null** (parse+top again: what noise alone gives),
``gpuflame report FILE`` from this checkout, **load** (a fresh interpreter
that reads the file into gpuflame's profile, ``gpuflame.formats.load``: the
reader alone, start-up and imports included), and, with ``--tree``, both
from other checkouts (before/after on one machine).
CPU time (user + system, from ``wait4``) and peak RSS of each process; every
round is printed with the load average before it, then the median of the
per-round ratios to parse+top. The file is made once with
``bench/make_profile.py`` (``--samples``, ``--depth``) unless one is given.
With ``--load-only`` each round runs only **load** of this checkout and of
each ``--tree``, and the first tree's again as the null control; ratios are
to the first tree's (a million-frame file, where ``report`` takes minutes).
``--no-report`` leaves ``report`` out of the rounds (the reader alone).

    python bench/bench_pprof_read.py [--rounds 5] [--tree /tmp/base] [--samples 2000000 --depth 10] [FILE]
    python bench/bench_pprof_read.py --load-only --tree /tmp/base FILE
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LOAD = "import sys\nfrom gpuflame.formats import load\nload(sys.argv[1])"
PARSE_TOP = """
import gzip, sys
from gpuflame.formats.pprof_proto.profile_pb2 import Profile
data = open(sys.argv[1], "rb").read()
p = Profile.FromString(gzip.decompress(data) if data[:2] == b"\\x1f\\x8b" else data)
flat = {}
for s in p.sample:
    if s.location_id:
        leaf = s.location_id[0]
        flat[leaf] = flat.get(leaf, 0) + s.value[0]
names = {f.id: p.string_table[f.name] for f in p.function}
where = {loc.id: names.get(loc.line[0].function_id, "?") if loc.line else "?" for loc in p.location}
for leaf, value in sorted(flat.items(), key=lambda kv: -kv[1])[:20]:
    print(value, where[leaf])
"""


def run(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(CPU s, peak RSS MB) of *cmd*."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{' '.join(cmd)} failed: {proc.stderr.read().decode() if proc.stderr else ''}")
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def profile_file(args: argparse.Namespace) -> Path:
    if args.file:
        return args.file
    path = ROOT / "bench" / "out" / f"pprof-{args.samples}x{args.depth}.pb.gz"
    if not path.exists():
        make = [sys.executable, str(ROOT / "bench" / "make_profile.py"), "-n", str(args.samples)]
        subprocess.run([*make, "-d", str(args.depth), "-o", str(path)], check=True, stdout=subprocess.DEVNULL)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tree", type=Path, action="append", default=[], help="another checkout's root to compare")
    parser.add_argument("--samples", type=int, default=2_000_000)
    parser.add_argument("--depth", type=int, default=10)
    parser.add_argument("--load-only", action="store_true", help="load of each checkout only, against the first tree")
    parser.add_argument("--no-report", action="store_true", help="leave gpuflame report out of the rounds")
    parser.add_argument("file", nargs="?", type=Path)
    args = parser.parse_args()
    path = profile_file(args)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    variants = {"parse+top": ([sys.executable, "-c", PARSE_TOP, str(path)], env)}
    variants["null"] = variants["parse+top"]
    if args.load_only:
        variants = {}
    for tree in [ROOT, *args.tree]:
        suffix = "" if tree == ROOT else f":{tree.name}"
        tree_env = dict(os.environ, PYTHONPATH=str(tree.resolve() / "src"))
        if not (args.load_only or args.no_report):
            variants[f"report{suffix}"] = ([sys.executable, "-m", "gpuflame", "report", str(path)], tree_env)
        variants[f"load{suffix}"] = ([sys.executable, "-c", LOAD, str(path)], tree_env)
    base_name = f"load:{args.tree[0].name}" if args.load_only else "parse+top"
    if args.load_only:
        variants["null"] = variants[base_name]
    cpu: dict[str, list[float]] = {k: [] for k in variants}
    rss: dict[str, list[float]] = {k: [] for k in variants}
    print(f"{path.name}: {path.stat().st_size / 1e6:.1f} MB; {args.rounds} rounds, order alternating")
    for r in range(args.rounds):
        order = list(variants) if r % 2 == 0 else list(reversed(variants))
        load = os.getloadavg()[0]
        start = time.perf_counter()
        for name in order:
            c, m = run(*variants[name])
            cpu[name].append(c)
            rss[name].append(m)
        base = cpu[base_name][-1]
        each = "  ".join(f"{k} {cpu[k][-1]:.2f} s {cpu[k][-1] / base:.2f}x {rss[k][-1]:.0f} MB" for k in variants)
        print(f"round {r + 1} (load {load:.1f}, {time.perf_counter() - start:.0f} s wall): {each}")
    for name in variants:
        ratio = statistics.median(a / b for a, b in zip(cpu[name], cpu[base_name], strict=True))
        rounds = " ".join(f"{a / b:.2f}" for a, b in zip(cpu[name], cpu[base_name], strict=True))
        print(
            f"ratio {name}/{base_name}: {ratio:.2f}x (rounds {rounds});"
            f" CPU median {statistics.median(cpu[name]):.2f} s;"
            f" peak RSS median {statistics.median(rss[name]):.0f} MB"
        )
    print(f"load after {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
