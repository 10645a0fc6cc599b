"""A generated profile over many distinct functions, for the large-page tests and bench/bench_viewer.py."""

from __future__ import annotations

import random

from gpuflame.model import Frame, Profile, memory_sample_types


def tree_parents(frames: int, rng: random.Random) -> list[int]:
    """Function i's caller: an earlier function drawn towards recent ones (``i * u**0.3``), -1 for the root.

    Stacks come out about 20 (1k functions) to 40 (100k) deep, like model code.
    """
    return [-1] + [int(i * rng.random() ** 0.3) for i in range(1, frames)]


def function_frame(i: int) -> Frame:
    return Frame(
        f"Class{i // 8} > method_{i % 8}" if i % 5 else f"function_{i}",
        f"/src/pkg{i % 37}/module{i // 97}.py",
        10 + (i * 7) % 900,
    )


def tree_profile(frames: int, seed: int = 1) -> Profile:
    """A call tree over exactly *frames* distinct functions, one sample ending in each.

    The merged flame graph has exactly *frames* nodes (function i's only
    node is under its caller's), so a test can compute every bar's value.
    Sample i's values are ``[size, 1, size // 2, 1, size * 3, 3]`` with a
    random size, labelled ``device=cuda:{i % 2}``.
    """
    rng = random.Random(seed)
    table = [function_frame(i) for i in range(frames)]
    parent = tree_parents(frames, rng)
    profile = Profile(sample_types=memory_sample_types())
    profile.default_type = "peak_space"
    for i in range(frames):
        stack, node = [], i
        while node >= 0:  # leaf first, as Profile.add takes it
            stack.append(table[node])
            node = parent[node]
        size = rng.choice((512, 4096, 1 << 20, 1 << 22)) * rng.randint(1, 64)
        profile.add(stack, [size, 1, size // 2, 1, size * 3, 3], {"device": f"cuda:{i % 2}"})
    return profile
