"""The short answer, for one line of text or a test failure: totals, top function, top stacks.

The notebook magic prints it under the inline flame graph, the pytest
plugin in its table and in an over-budget test's failure. Both read it from
the same flame tree the report and the viewer draw, so the names are the
flame graph's (``LlamaMLP > forward``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpuflame.analysis.tree import NO_STACK, FlameTree, Node, frame_sort_key, function_frames
from gpuflame.model.columns import exact_sum
from gpuflame.model.peak import PeakUnit
from gpuflame.model.profile import Frame, Labels, Profile
from gpuflame.symbols import names
from gpuflame.units import percent


@dataclass(frozen=True)
class Stack:
    """One allocating stack, root first, and the bytes its leaf holds itself."""

    frames: list[Frame]
    value: int
    percent: float
    line: int = 0  # the leaf's line that allocated the most of *value* (its bar's own line is its def)

    @property
    def leaf(self) -> Frame:
        return self.frames[-1]

    def where(self) -> str:
        """``file:line`` of the allocation, for a message that names the line to look at."""
        leaf = self.leaf
        return f"{leaf.file}:{self.line}" if leaf.file and self.line else leaf.location()


@dataclass(frozen=True)
class Leaf:
    """A function and its self: what it allocated itself, summed over every stack it ends."""

    frame: Frame
    self: int


@dataclass(frozen=True)
class Summary:
    """Totals by sample type and the widest leaf of the shown type (``top``)."""

    type: str
    unit: str
    totals: dict[str, int]
    top: Leaf | None

    def total(self, type_name: str) -> int | None:
        return self.totals.get(type_name)


def summarize(profile: Profile, type_name: str | None = None) -> Summary:
    """Totals and the function with the largest self for *type_name* (default: the profile's)."""
    index = profile.pick_type(type_name)
    st = profile.sample_types[index]
    return Summary(st.type, st.unit, profile.totals(), widest_leaf(profile, index))


def widest_leaf(profile: Profile, type_index: int) -> Leaf | None:
    """The function with the largest self, as the report's widest leaf bar (ties: by name).

    Self is the value of the stacks a function ends, so this is one pass over
    the samples: the pytest plugin asks it of every test, where building the
    flame tree would cost more than the test.
    """
    shown = function_frames(profile.frames)
    selfs: dict[Frame, int] = {}
    for sample in profile.samples:
        value = sample.values[type_index]
        if value:
            leaf = shown[sample.stack[0]] if sample.stack else NO_STACK
            selfs[leaf] = selfs.get(leaf, 0) + value
    positive = [(frame, value) for frame, value in selfs.items() if value > 0]
    if not positive:
        return None
    frame, value = min(positive, key=lambda item: (-item[1], frame_sort_key(item[0])))
    return Leaf(frame, value)


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
        level = tree.level(depth)
        line = tree.table.self_line(int(level.start[index]), int(level.end[index]), depth)
        out.append(Stack(frames, -neg, percent(-neg, tree.total), line))
    return out


FRAGMENTED = 0.10  # reserved but unused above this share of the reserved peak: report suggests gpuflame simulate


def reserved_peaks(profile: Profile) -> list[PeakUnit]:
    """The peak units that know the allocator's true reserved peak (a PyTorch snapshot's trace), of the
    devices whose samples are shown."""
    units = [u for u in profile.peaks if u.reserved]
    if not units:
        return []
    shown = {_device(row.labels) for row in profile.label_set_totals() if any(row.nonzero)}
    return [u for u in units if u.device in shown]


def _device(labels: Labels) -> str:
    """A label set's device (the first ``device`` label, as ``Sample.label``), "" without one."""
    return next((v for k, v in labels if k == "device"), "") or ""


def fragmented(profile: Profile) -> tuple[int, int] | None:
    """(reserved, allocated) at the reserved peak, when the unused rest exceeds :data:`FRAGMENTED` of it.

    The reserved peak is the most the allocator held at any moment
    (:func:`reserved_peaks`, summed over devices); a profile that does not
    know it (one converted before it was recorded) falls back to the
    reserved bytes at the allocations' peak: ``peak_space`` holds the
    reserved rest as ``<cached free blocks>`` (formats/torch_snapshot.py).
    Other profiles have neither, so this is None.
    """
    units = reserved_peaks(profile)
    if units:
        reserved = sum(u.reserved for u in units)
        allocated = sum(u.reserved_allocated for u in units)
    else:
        found = _cached_at_peak(profile)
        if found is None:
            return None
        reserved, allocated = found[0], found[0] - found[1]
    if reserved <= 0 or reserved - allocated <= FRAGMENTED * reserved:
        return None
    return reserved, allocated


def _cached_at_peak(profile: Profile) -> tuple[int, int] | None:
    """(reserved, cached free) at the peak of a snapshot's ``peak_space``; None for other profiles."""
    if "peak_space" not in profile.type_names():
        return None
    index = profile.type_index("peak_space")
    cached_ids = {i for i, f in enumerate(profile.frames) if f.name == names.CACHED_FREE}
    if not cached_ids:
        return None
    held = profile.held_columns()
    if held is not None:
        values = held.values[:, index]
        return exact_sum(values), exact_sum(values[np.isin(held.leaf_ids(), list(cached_ids))])
    reserved = cached = 0
    for s in profile.samples:
        reserved += s.values[index]
        if s.stack and s.stack[0] in cached_ids:
            cached += s.values[index]
    return reserved, cached
