"""Generate a large, realistic-shaped profile for benchmarks.

Stacks are random walks down a synthetic call graph (a few thousand functions
in a few hundred classes), so prefixes are shared the way real model code
shares them, and no two samples have the same stack.

    python bench/make_profile.py -n 200000 -d 40 -o bench/out/large.pb.gz
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from gpuflame.model import Frame, Profile, memory_sample_types  # noqa: E402


def make_profile(samples: int = 200_000, depth: int = 40, functions: int = 4000, seed: int = 1) -> Profile:
    """A profile of *samples* distinct stacks, each *depth* frames deep."""
    rng = random.Random(seed)
    frames = [
        Frame(
            f"Class{i // 8} > method_{i % 8}" if i % 5 else f"function_{i}",
            f"/src/pkg{i % 37}/module{i // 97}.py",
            10 + (i * 7) % 900,
        )
        for i in range(functions)
    ]
    # each function calls a handful of others: a call graph with shared paths
    callees = [[rng.randrange(functions) for _ in range(6)] for _ in range(functions)]
    profile = Profile(sample_types=memory_sample_types())
    profile.default_type = "peak_space"
    seen: set[tuple[int, ...]] = set()
    roots = [rng.randrange(functions) for _ in range(4)]
    while len(profile.samples) < samples:
        node = rng.choice(roots)
        path = [node]
        for _ in range(depth - 1):
            node = rng.choice(callees[node])
            path.append(node)
        key = tuple(path)
        if key in seen:
            continue
        seen.add(key)
        size = rng.choice((512, 4096, 1 << 20, 1 << 22)) * rng.randint(1, 64)
        stack = [frames[f] for f in reversed(path)]
        profile.add(stack, [size, 1, size // 2, 1, size * 3, 3], {"device": f"cuda:{len(seen) % 2}"})
    return profile


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", "--samples", type=int, default=200_000)
    ap.add_argument("-d", "--depth", type=int, default=40)
    ap.add_argument("-o", "--output", default="bench/out/large.pb.gz")
    args = ap.parse_args()
    from gpuflame.formats import save

    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    save(make_profile(args.samples, args.depth), args.output)
    print(args.output)


if __name__ == "__main__":
    main()
