"""Bytes per category (the ``category`` label): weights, gradients, optimizer state, KV cache, activations."""

from __future__ import annotations

from dataclasses import dataclass

from gpuflame.model.categories import CATEGORIES, LABEL, category_of
from gpuflame.model.profile import Profile
from gpuflame.units import percent

UNKNOWN = "(not recorded)"  # samples of a source that does not tell categories (JAX, older files)


@dataclass(frozen=True)
class CategoryTotal:
    category: str
    total: int
    percent: float
    top_function: str  # the function that allocated most of it (the widest leaf), "" when none

    def to_dict(self) -> dict[str, object]:
        return {"category": self.category, "total": self.total, "percent": self.percent,
                "top_function": self.top_function}


def category_totals(profile: Profile, type_index: int) -> list[CategoryTotal]:
    """One row per category with bytes, in the vocabulary's order; empty when no sample has a category label."""
    totals: dict[str, int] = {}
    leaves: dict[str, dict[int, int]] = {}
    known = False
    for s in profile.samples:
        value = s.values[type_index]
        known = known or s.label(LABEL) is not None  # a recorder that labels: not only synthetic frames
        name = category_of(profile, s) or UNKNOWN
        totals[name] = totals.get(name, 0) + value
        if s.stack and value:
            by_leaf = leaves.setdefault(name, {})
            by_leaf[s.stack[0]] = by_leaf.get(s.stack[0], 0) + value
    if not known:
        return []
    grand = sum(totals.values())
    order = {name: i for i, name in enumerate((*CATEGORIES, UNKNOWN))}
    rows = []
    for name in sorted((n for n in totals if totals[n]), key=lambda n: (order.get(n, len(order)), n)):
        by_leaf = leaves.get(name, {})
        top = profile.frames[max(by_leaf, key=by_leaf.__getitem__)].name if by_leaf else ""
        rows.append(CategoryTotal(name, totals[name], percent(totals[name], grand), top))
    return rows
