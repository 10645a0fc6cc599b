"""A profile's samples as arrays: how a reader hands a million samples to the page without an object each.

:class:`gpuflame.model.profile.Profile` keeps its samples either as a list of
:class:`Sample` or as :class:`SampleColumns` (what the pprof reader makes of a
large file), and turns columns into the list the first time anything asks for
``profile.samples``. Code that can work on arrays (the viewer's page) asks
:meth:`Profile.columns` instead and never pays for a million stack tuples.

Launcher side only (numpy): the profiled process never makes columns.
"""

from __future__ import annotations

from itertools import chain
from typing import NamedTuple

import numpy as np

from gpuflame.model.parts import Labels, LabelSetTotal, Sample


class SampleColumns(NamedTuple):
    """Every sample of a profile, in order: its stack length, its frame ids, its values and its label set."""

    lengths: np.ndarray  # int64 (n,): frames in each stack
    frames: np.ndarray  # int32 or int64: the stacks' frame ids, leaf first, one stack after another
    values: np.ndarray  # int64 (n, sample types)
    label_ids: np.ndarray  # int64 (n,): each sample's index into label_sets
    label_sets: list[Labels]  # the distinct label sets

    def to_samples(self) -> list[Sample]:
        """The same samples as :class:`Sample` objects (what ``profile.samples`` holds)."""
        stacks = stack_tuples(self.frames, np.cumsum(self.lengths).tolist())
        labels = map(self.label_sets.__getitem__, self.label_ids.tolist())
        return list(map(Sample, stacks, map(tuple, self.values.tolist()), labels))

    def leaf_ids(self) -> np.ndarray:
        """Each sample's leaf frame id (the frame that allocated), -1 for an empty stack."""
        leaves = np.full(len(self.lengths), -1, dtype=np.int64)
        has = self.lengths > 0
        leaves[has] = self.frames[(np.cumsum(self.lengths) - self.lengths)[has]]
        return leaves

    def totals(self) -> list[int]:
        """Each sample type's sum over every sample, exact past int64 (as Python ints)."""
        return [exact_sum(self.values[:, k]) for k in range(self.values.shape[1])]

    def label_set_totals(self) -> list[LabelSetTotal]:
        """Per distinct label set: each type's sum and whether any sample's value is not 0 (arrays, no row each)."""
        count = len(self.label_sets)
        if not count:
            return []
        sums = np.zeros((count, self.values.shape[1]), dtype=np.int64)
        if len(self.values) and max(int(self.values.max()), -int(self.values.min())) >= (1 << 62) // len(self.values):
            sums = sums.astype(object)  # sums past int64 stay exact as Python ints
        np.add.at(sums, self.label_ids, self.values)
        nonzero = np.zeros(sums.shape, dtype=bool)
        for k in range(self.values.shape[1]):
            nonzero[self.label_ids[self.values[:, k] != 0], k] = True
        return [
            LabelSetTotal(labels, tuple(total), tuple(flags))
            for labels, total, flags in zip(self.label_sets, sums.tolist(), nonzero.tolist(), strict=True)
        ]


def exact_sum(values: np.ndarray) -> int:
    """The sum of int64 *values* as a Python int: numpy's where no partial sum can pass int64, else Python's."""
    if not len(values):
        return 0
    if max(int(values.max()), -int(values.min())) < (1 << 62) // len(values):  # not np.abs: -2**63 stays negative
        return int(values.sum())
    return sum(values.tolist())


def from_samples(samples: list[Sample], n_types: int) -> SampleColumns:
    """*samples* as columns, in C loops: a page of a million samples forty frames deep pays no step per frame."""
    lengths = np.fromiter(map(len, (s.stack for s in samples)), dtype=np.int64, count=len(samples))
    frames = np.fromiter(chain.from_iterable(s.stack for s in samples), dtype=np.int64, count=int(lengths.sum()))
    values = np.array([s.values for s in samples], dtype=np.int64).reshape(len(samples), n_types)
    index: dict[Labels, int] = {}
    ids = np.fromiter((index.setdefault(s.labels, len(index)) for s in samples), dtype=np.int64, count=len(samples))
    return SampleColumns(lengths, frames, values, ids, list(index))


def stack_tuples(frame_ids: np.ndarray, ends: list[int]) -> list[tuple[int, ...]]:
    """Slices ``[previous end, end)`` of *frame_ids* as tuples of shared int objects.

    Not a new int object per id: forty million of them would take 28 bytes
    each; the ids come from a pool of one object per distinct frame id.
    """
    pool = np.array(list(range(int(frame_ids.max()) + 1 if len(frame_ids) else 0)), dtype=object)
    out: list[tuple[int, ...]] = []
    start, first = 0, 0
    step = 1 << 22  # ids made into a list at a time
    while first < len(ends):
        last = first
        while last < len(ends) and ends[last] - start <= step:
            last += 1
        last = max(last, first + 1)
        chunk = pool[frame_ids[start : ends[last - 1]]].tolist()
        prev = 0
        for end in ends[first:last]:
            out.append(tuple(chunk[prev : end - start]))
            prev = end - start
        start, first = ends[last - 1], last
    return out
