"""The stacks of the samples a flame table keeps: from the profile's list of samples, or from the reader's columns.

A pprof file of two million samples arrives as columns
(:class:`gpuflame.model.columns.SampleColumns`); making each sample a
:class:`~gpuflame.model.parts.Sample` with its stack tuple cost more than
the rest of ``report`` together. The flame table asks for the stacks of a
band of samples at a time as arrays (their lengths, and their frame ids one
stack after another, leaf first), which columns give by slicing.
"""

from __future__ import annotations

from itertools import chain

import numpy as np

from gpuflame.errors import GpuflameError
from gpuflame.model.columns import SampleColumns
from gpuflame.model.parts import Labels, Sample
from gpuflame.model.profile import Profile


class SampleStacks:
    """The samples with a value for one sample type, numbered from 0 in profile order, and those values."""

    def __init__(
        self,
        values: np.ndarray,
        samples: list[Sample] | None = None,
        held: SampleColumns | None = None,
        keep: np.ndarray | None = None,
    ) -> None:
        self.values = values  # int64, one per kept sample
        self.samples = samples if samples is not None else []  # the list road: the kept samples
        self.held = held  # the columns road: every sample; *keep* the kept ones' indices (None: all)
        self.keep = keep
        self._starts: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.values)

    def lengths(self) -> np.ndarray:
        """Every kept sample's stack length."""
        if self.held is None:
            return np.fromiter(map(len, (s.stack for s in self.samples)), dtype=np.intp, count=len(self.samples))
        lengths = self.held.lengths
        return (lengths if self.keep is None else lengths[self.keep]).astype(np.intp)

    def band(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """(lengths, frame ids one stack after another, leaf first) of kept samples ``start:stop``."""
        if self.held is None:
            return _flat([s.stack for s in self.samples[start:stop]])
        if self.keep is None:
            lo, hi = self._offsets(np.array([start, stop])).tolist()
            return self.held.lengths[start:stop].astype(np.intp), self.held.frames[lo:hi]
        return self.of(np.arange(start, stop))

    def of(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(lengths, frame ids one stack after another, leaf first) of the kept samples *ids*, in that order."""
        if self.held is None:
            return _flat([self.samples[i].stack for i in ids.tolist()])
        rows = ids if self.keep is None else self.keep[ids]
        lens = self.held.lengths[rows].astype(np.intp)
        before = np.cumsum(lens) - lens  # where each stack starts in the result
        flat = self.held.frames[np.repeat(self._offsets(rows) - before, lens) + np.arange(int(lens.sum()))]
        return lens, flat

    def label_ids(self) -> tuple[np.ndarray, list[Labels]]:
        """Each kept sample's index into a list of distinct label sets, and that list."""
        if self.held is None:
            index: dict[Labels, int] = {}
            listed = [index.setdefault(s.labels, len(index)) for s in self.samples]
            return np.array(listed, dtype=np.intp), list(index)
        ids = self.held.label_ids
        return (ids if self.keep is None else ids[self.keep]), self.held.label_sets

    def _offsets(self, rows: np.ndarray) -> np.ndarray:
        """Where the stacks of the columns' samples *rows* start in their ``frames`` (``len``: the end)."""
        if self._starts is None:
            lengths = self.held.lengths if self.held is not None else np.zeros(0, dtype=np.int64)
            self._starts = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(lengths)])
        return self._starts[rows]


def nonzero_stacks(profile: Profile, type_index: int) -> SampleStacks:
    """The samples with a value for this type, and those values: zero rows only make empty bars.

    Columns a reader handed over stay columns: no sample becomes an object.
    """
    held = profile.held_columns()
    if held is not None:
        values = np.ascontiguousarray(held.values[:, type_index])
        keep = np.flatnonzero(values)
        if len(keep) == len(values):
            return SampleStacks(values, held=held)
        return SampleStacks(values[keep], held=held, keep=keep)
    samples = profile.samples
    try:
        values = np.fromiter((s.values[type_index] for s in samples), dtype=np.int64, count=len(samples))
    except OverflowError:  # a diff's new - base of two values near the ends of int64 (read as they were)
        raise GpuflameError(
            f"the {profile.sample_types[type_index].type} values of this profile do not fit in 64 bits; "
            "gpuflame sums in 64-bit integers, as pprof stores them"
        ) from None
    keep = np.flatnonzero(values)
    if len(keep) == len(samples):
        return SampleStacks(values, samples=samples)
    return SampleStacks(values[keep], samples=[samples[i] for i in keep.tolist()])


def _flat(stacks: list[tuple[int, ...]]) -> tuple[np.ndarray, np.ndarray]:
    lens = np.fromiter(map(len, stacks), dtype=np.intp, count=len(stacks))
    return lens, np.fromiter(chain.from_iterable(stacks), dtype=np.intp, count=int(lens.sum()))
