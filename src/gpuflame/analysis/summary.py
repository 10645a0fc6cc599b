"""The short answer, for one line of text or a test failure: totals, top function, top stacks.

The notebook magic prints it under the inline flame graph, the pytest
plugin in its table and in an over-budget test's failure. Both read it from
the same flame tree the report and the viewer draw, so the names are the
flame graph's (``LlamaMLP > forward``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpuflame.analysis.hotspots import Entry, function_stats, top_functions
from gpuflame.analysis.tree import FlameTree, Node, build_tree
from gpuflame.model.profile import Frame, Profile
from gpuflame.units import percent


@dataclass(frozen=True)
class Stack:
    """One allocating stack, root first, and the bytes its leaf holds itself."""

    frames: list[Frame]
    value: int
    percent: float

    @property
    def leaf(self) -> Frame:
        return self.frames[-1]


@dataclass(frozen=True)
class Summary:
    """Totals by sample type and the widest leaf of the shown type (``top``)."""

    type: str
    unit: str
    totals: dict[str, int]
    top: Entry | None

    def total(self, type_name: str) -> int | None:
        return self.totals.get(type_name)


def summarize(profile: Profile, type_name: str | None = None) -> Summary:
    """Totals and the function with the largest self for *type_name* (default: the profile's)."""
    index = profile.pick_type(type_name)
    tree = build_tree(profile, index)
    top = top_functions(function_stats(tree.table), "self", 1)
    st = profile.sample_types[index]
    return Summary(st.type, st.unit, profile.totals(), top[0] if top else None)


def top_stacks(tree: FlameTree, limit: int = 3) -> list[Stack]:
    """The *limit* tree nodes with the largest self, each with its callers (read bottom-up).

    A node is one distinct stack in the flame graph, so these are the
    leaf bars a reader would point at, widest first.
    """
    found: list[tuple[int, int, int]] = []  # (-self, depth, index)
    for depth in range(tree.depth):
        selfs = tree.level_self(depth)
        best = np.argsort(-selfs, kind="stable")[:limit]
        found.extend((-int(selfs[i]), depth, int(i)) for i in best if selfs[i] > 0)
    found.sort()
    out = []
    for neg, depth, index in found[:limit]:
        frames = [tree.frame(n) for n in tree.path(Node(depth, index))]
        out.append(Stack(frames, -neg, percent(-neg, tree.total)))
    return out
