"""The page's function table is in Frame tuple order, names compared first as plain strings."""

from __future__ import annotations

import random

from gpuflame.model.profile import Frame
from gpuflame.render.html import _sorted_frames


def test_frames_with_equal_names_are_ordered_by_their_other_fields() -> None:
    rng = random.Random(7)
    frames = {
        Frame(
            rng.choice("abc"), rng.choice(["x.py", "y.py", ""]), rng.randrange(3), rng.choice(["python", "native"]), 0
        )
        for _ in range(200)
    }
    assert _sorted_frames(frames) == sorted(frames)


def test_distinct_names_keep_plain_string_order() -> None:
    frames = {Frame(name, "f.py", 1) for name in ["b", "B", "a", "_x", "é", "a b", ""]}
    assert [f.name for f in _sorted_frames(frames)] == sorted(f.name for f in frames)
