"""Bytes per category (the ``category`` label): weights, gradients, optimizer state, KV cache, activations."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuflame.model.categories import CATEGORIES, LABEL, category_of
from gpuflame.model.columns import SampleColumns, exact_sum
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
    if not profile.has_label(LABEL):  # a recorder that labels, not only synthetics
        return []
    order = {name: i for i, name in enumerate((*CATEGORIES, UNKNOWN))}
    return sums_by(
        profile, type_index, lambda s: category_of(profile, s) or UNKNOWN, lambda n: (order.get(n, len(order)), n)
    )


def sums_by(
    profile: Profile, type_index: int, key_of: Callable[[Sample], str], sort_key: Callable[[str], Any]
) -> list[CategoryTotal]:
    """Bytes per *key_of* value (rows with bytes only, ordered by *sort_key*), with the widest leaf of each.

    *key_of* reads a sample's labels and its leaf frame only: of columns a
    reader handed over, it is asked once per distinct (label set, leaf).
    """
    held = profile.held_columns()
    if held is not None:
        totals, leaves = _column_sums(held, type_index, key_of)
    else:
        totals, leaves = _sample_sums(profile.samples, type_index, key_of)
    grand = sum(totals.values())
    rows = []
    for name in sorted((n for n in totals if totals[n]), key=sort_key):
        by_leaf = leaves.get(name, {})
        top = profile.frames[max(by_leaf, key=by_leaf.__getitem__)].name if by_leaf else ""
        rows.append(CategoryTotal(name, totals[name], percent(totals[name], grand), top))
    return rows


def _sample_sums(
    samples: list[Sample], type_index: int, key_of: Callable[[Sample], str]
) -> tuple[dict[str, int], dict[str, dict[int, int]]]:
    """Per key: its total, and {leaf frame id: bytes} in order of each leaf's first sample with bytes."""
    totals: dict[str, int] = {}
    leaves: dict[str, dict[int, int]] = {}
    for s in samples:
        value = s.values[type_index]
        name = key_of(s)
        totals[name] = totals.get(name, 0) + value
        if s.stack and value:
            by_leaf = leaves.setdefault(name, {})
            by_leaf[s.stack[0]] = by_leaf.get(s.stack[0], 0) + value
    return totals, leaves


def _column_sums(
    held: SampleColumns, type_index: int, key_of: Callable[[Sample], str]
) -> tuple[dict[str, int], dict[str, dict[int, int]]]:
    """:func:`_sample_sums` of columns, with numpy: the same sums, the leaves in the same order."""
    values = held.values[:, type_index]
    leaf = held.leaf_ids()
    width = int(leaf.max(initial=-1)) + 2  # leaf + 1 in 0..width-1
    uniq, inverse = np.unique(held.label_ids.astype(np.int64) * width + leaf + 1, return_inverse=True)
    pairs = [divmod(int(p), width) for p in uniq.tolist()]
    names = [key_of(Sample((f - 1,) if f else (), (), held.label_sets[i])) for i, f in pairs]
    keys = list(dict.fromkeys(names))
    key = np.array([keys.index(n) for n in names], dtype=np.int64)[inverse.ravel()] if names else leaf
    totals = {name: exact_sum(values[key == k]) for k, name in enumerate(keys)}
    ok = (values != 0) & (leaf >= 0)
    found, first, where = np.unique(key[ok] * width + leaf[ok], return_index=True, return_inverse=True)
    sums = np.zeros(len(found), dtype=np.int64 if _fits(values) else object)
    np.add.at(sums, where.ravel(), values[ok])
    leaves: dict[str, dict[int, int]] = {}
    for j in np.argsort(first, kind="stable").tolist():
        k, f = divmod(int(found[j]), width)
        leaves.setdefault(keys[k], {})[f] = int(sums[j])
    return totals, leaves


def _fits(values: np.ndarray) -> bool:
    """Whether no sum of *values* can pass int64."""
    return not len(values) or max(int(values.max()), -int(values.min())) < (1 << 62) // len(values)
