"""Bytes per category (the ``category`` label): weights, gradients, optimizer state, KV cache, activations."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuflame.model.categories import CATEGORIES, LABEL, category_of
from gpuflame.model.profile import Profile, Sample
from gpuflame.units import percent

UNKNOWN = "(not recorded)"  # samples of a source that does not tell categories (JAX, older files)


@dataclass(frozen=True)
class CategoryTotal:
    category: str  # or the phase, for bytes by phase (analysis/phases.py)
    total: int
    percent: float
    top_function: str  # the function that allocated most of it (the widest leaf), "" when none

    def to_dict(self) -> dict[str, object]:
        return {
            "category": self.category,
            "total": self.total,
            "percent": self.percent,
            "top_function": self.top_function,
        }


def category_totals(profile: Profile, type_index: int) -> list[CategoryTotal]:
    """One row per category with bytes, in the vocabulary's order; empty when no sample has a category label."""
    if not any(s.label(LABEL) is not None for s in profile.samples):  # a recorder that labels, not only synthetics
        return []
    order = {name: i for i, name in enumerate((*CATEGORIES, UNKNOWN))}
    return sums_by(
        profile, type_index, lambda s: category_of(profile, s) or UNKNOWN, lambda n: (order.get(n, len(order)), n)
    )


def sums_by(
    profile: Profile, type_index: int, key_of: Callable[[Sample], str], sort_key: Callable[[str], Any]
) -> list[CategoryTotal]:
    """Bytes per *key_of* value (rows with bytes only, ordered by *sort_key*), with the widest leaf of each."""
    totals: dict[str, int] = {}
    leaves: dict[str, dict[int, int]] = {}
    for s in profile.samples:
        value = s.values[type_index]
        name = key_of(s)
        totals[name] = totals.get(name, 0) + value
        if s.stack and value:
            by_leaf = leaves.setdefault(name, {})
            by_leaf[s.stack[0]] = by_leaf.get(s.stack[0], 0) + value
    grand = sum(totals.values())
    rows = []
    for name in sorted((n for n in totals if totals[n]), key=sort_key):
        by_leaf = leaves.get(name, {})
        top = profile.frames[max(by_leaf, key=by_leaf.__getitem__)].name if by_leaf else ""
        rows.append(CategoryTotal(name, totals[name], percent(totals[name], grand), top))
    return rows
