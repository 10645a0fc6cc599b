"""Per-function statistics and the report that answers the AKS guide's quick-reference table.

| goal                              | where to look                  | section          |
| --------------------------------- | ------------------------------ | ---------------- |
| what allocates the most           | widest leaf bars (by self)     | ``leaves``       |
| what is responsible for the most  | widest bars at the bottom      | ``roots``        |
| optimisation targets              | wide bars with high self       | ``targets``      |
| frames you can skip               | wide bars with zero self       | ``wrappers``     |

A function is one :class:`~gpuflame.model.profile.Frame`. Its **self** is
summed over every node it has in the tree; its **total** counts each sample
once even when recursion puts the function twice in the stack, so a
function's total is never more than the profile's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gpuflame.analysis.categories import CategoryTotal, category_totals
from gpuflame.analysis.phases import PhaseRow, phase_rows
from gpuflame.analysis.tree import FlameTree, Node, StackTable, chunk_rows, frame_dict, weighted_sum
from gpuflame.model.profile import SYNTHETIC, TRAMPOLINE_KIND, Frame, Profile
from gpuflame.units import percent

# A bar is "wide" for a target when its self is at least this share of the
# total, and a target when at least this share of its own width is self.
TARGET_MIN_SHARE = 0.01
TARGET_MIN_RATIO = 0.5
# A wrapper is at least this wide, and its self is at most this share of its width.
WRAPPER_MIN_SHARE = 0.05
WRAPPER_MAX_RATIO = 0.01
# Going up from a root, a child that carries at least this share of its
# parent's width continues the trunk: the width has not split yet.
TRUNK_SHARE = 0.9
# Branches shown where a root's width splits.
BRANCHES = 5


@dataclass(eq=False)
class FunctionStats:
    """Self and total of every function, indexed by the table's frame code (0 unused)."""

    frames: list[Frame]
    self: np.ndarray
    total: np.ndarray
    grand_total: int

    def frame(self, code: int) -> Frame:
        return self.frames[code - 1]

    def ranked(self, by: str = "self") -> np.ndarray:
        """Codes of the functions with a nonzero value, largest *by* first, then by name."""
        values = self.self if by == "self" else self.total
        codes = np.flatnonzero(values)
        codes = codes[codes > 0]
        # codes are in name order already, so a stable sort keeps names as the tie-break
        return codes[np.argsort(-values[codes], kind="stable")]


def function_stats(table: StackTable) -> FunctionStats:
    """Self and once-per-sample total of every function in *table*."""
    size = len(table.frames) + 1
    exact = table.exact_float
    self_ = weighted_sum(table.leaf_codes(), table.values, size, exact)
    total = np.zeros(size, dtype=np.int64)
    step = chunk_rows(table.codes.shape[1])
    for start in range(0, table.rows, step):
        stop = min(start + step, table.rows)
        total += _distinct_totals(table.codes[start:stop], table.values[start:stop], size, exact)
    total[0] = 0
    return FunctionStats(table.frames, self_, total, table.total)


def _distinct_totals(codes: np.ndarray, values: np.ndarray, size: int, exact: bool) -> np.ndarray:
    """Each row's value added once to every distinct function in the row."""
    rows = np.sort(codes.astype(np.intp), axis=1)
    first = np.ones(rows.shape, dtype=bool)
    np.not_equal(rows[:, 1:], rows[:, :-1], out=first[:, 1:])
    first &= rows != 0
    weights = np.broadcast_to(values[:, None], rows.shape)[first]
    return weighted_sum(rows[first], weights, size, exact)


# -- report ----------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """One line of a report section: a function (or a node) with its self and total."""

    frame: Frame
    self: int
    total: int
    percent: float  # of the profile's total, for the value the section ranks by

    def to_dict(self) -> dict[str, object]:
        return {
            **frame_dict(self.frame),
            "self": self.self,
            "total": self.total,
            "percent": round(self.percent, 3),
        }


@dataclass(frozen=True)
class Root:
    """A widest bar at the bottom, followed up to where its width splits.

    ``trunk`` runs from the root to the first node whose width divides
    (root included, that node included); ``branches`` are that node's widest
    children, and ``rest`` is what its other children and its own self hold.
    """

    trunk: list[Entry]
    branches: list[Entry]
    rest: int

    @property
    def root(self) -> Entry:
        return self.trunk[0]

    @property
    def split(self) -> Entry:
        return self.trunk[-1]

    def to_dict(self) -> dict[str, object]:
        return {
            "trunk": [e.to_dict() for e in self.trunk],
            "branches": [e.to_dict() for e in self.branches],
            "rest": self.rest,
        }


@dataclass(frozen=True)
class TypeTotal:
    type: str
    unit: str
    total: int


@dataclass(frozen=True)
class Report:
    """The answers to the AKS guide's quick-reference table for one sample type."""

    type: str
    unit: str
    total: int
    totals: list[TypeTotal]
    comments: list[str]
    leaves: list[Entry]
    roots: list[Root]
    targets: list[Entry]
    wrappers: list[Entry]
    categories: list[CategoryTotal] = field(default_factory=list)  # empty: the source has no categories
    phases: list[PhaseRow] = field(default_factory=list)  # empty: no phase was marked

    def to_dict(self) -> dict[str, object]:
        """Exact values in the sample type's unit; percents of ``total``."""
        return {
            "sample_type": self.type,
            "unit": self.unit,
            "total": self.total,
            "totals": [{"type": t.type, "unit": t.unit, "total": t.total} for t in self.totals],
            "comments": self.comments,
            "widest_leaves": [e.to_dict() for e in self.leaves],
            "widest_roots": [r.to_dict() for r in self.roots],
            "optimisation_targets": [e.to_dict() for e in self.targets],
            "skippable_wrappers": [e.to_dict() for e in self.wrappers],
            "by_category": [c.to_dict() for c in self.categories],
            "by_phase": [p.to_dict() for p in self.phases],
        }


def build_report(profile: Profile, tree: FlameTree, limit: int = 10) -> Report:
    """All four sections for the tree's sample type, *limit* entries each."""
    stats = function_stats(tree.table)
    totals = profile.totals()
    return Report(
        type=tree.table.sample_type.type,
        unit=tree.table.sample_type.unit,
        total=tree.total,
        totals=[TypeTotal(st.type, st.unit, totals[st.type]) for st in profile.sample_types],
        comments=list(profile.comments),
        leaves=widest_leaves(stats, limit),
        roots=widest_roots(tree, max(1, limit // 2)),
        targets=optimisation_targets(stats, limit),
        wrappers=skippable_wrappers(stats, limit),
        categories=category_totals(profile, profile.type_index(tree.table.sample_type.type)),
        phases=phase_rows(profile),
    )


def entry(stats: FunctionStats, code: int, by: str) -> Entry:
    s, t = int(stats.self[code]), int(stats.total[code])
    return Entry(stats.frame(code), s, t, percent(s if by == "self" else t, stats.grand_total))


def top_functions(stats: FunctionStats, by: str = "self", limit: int = 10) -> list[Entry]:
    """The *limit* functions with the largest self (or total)."""
    return [entry(stats, int(c), by) for c in stats.ranked(by)[:limit]]


def widest_leaves(stats: FunctionStats, limit: int) -> list[Entry]:
    """What allocates the most: the functions with the largest self (the leaf bars)."""
    return [e for e in top_functions(stats, "self", limit) if e.self > 0]


def optimisation_targets(stats: FunctionStats, limit: int) -> list[Entry]:
    """Wide bars whose width is mostly their own allocation, in code one can change.

    Synthetic frames (``<cached free blocks>``) and interpreter trampolines
    are not code; they are left to the other sections.
    """
    floor = TARGET_MIN_SHARE * stats.grand_total
    out: list[Entry] = []
    for code in stats.ranked("self"):
        e = entry(stats, int(code), "self")
        if e.self < floor or len(out) == limit:
            break
        if e.frame.kind not in (SYNTHETIC, TRAMPOLINE_KIND) and e.self >= TARGET_MIN_RATIO * e.total:
            out.append(e)
    return out


def skippable_wrappers(stats: FunctionStats, limit: int) -> list[Entry]:
    """Wide bars with (almost) no self: orchestration to read past, not a source."""
    floor = WRAPPER_MIN_SHARE * stats.grand_total
    out: list[Entry] = []
    for code in stats.ranked("total"):
        e = entry(stats, int(code), "total")
        if e.total < floor or len(out) == limit:
            break
        if e.self <= WRAPPER_MAX_RATIO * e.total:
            out.append(e)
    return out


def node_entry(tree: FlameTree, node: Node) -> Entry:
    total = tree.node_total(node)
    return Entry(tree.frame(node), tree.node_self(node), total, percent(total, tree.total))


def widest_roots(tree: FlameTree, limit: int) -> list[Root]:
    """The widest bars at the bottom, each followed up to where its width splits.

    Roots are mostly ``<module>`` or an entry point, which says little; the
    first node where the width divides (no child holds :data:`TRUNK_SHARE`
    of it) is where responsibility becomes specific, so its branches are
    shown with it.
    """
    if not tree.depth:
        return []
    level = tree.level(0)
    order = np.argsort(-level.total, kind="stable")[:limit]
    return [_follow_trunk(tree, Node(0, int(i))) for i in order]


def _follow_trunk(tree: FlameTree, node: Node) -> Root:
    trunk = [node]
    while True:
        children = tree.children(trunk[-1])
        if not children:
            return Root([node_entry(tree, n) for n in trunk], [], 0)
        widest = max(children, key=tree.node_total)
        if tree.node_total(widest) < TRUNK_SHARE * tree.node_total(trunk[-1]):
            break
        trunk.append(widest)
    children.sort(key=lambda n: -tree.node_total(n))
    branches = [node_entry(tree, n) for n in children[:BRANCHES]]
    rest = tree.node_total(trunk[-1]) - sum(b.total for b in branches)
    return Root([node_entry(tree, n) for n in trunk], branches, rest)
