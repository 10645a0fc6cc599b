"""A large pprof's samples read at once into columns (numpy), where that gives the runtime's answer.

Each Sample's bytes (the ``protobuf`` runtime leaves them as bytes,
:mod:`gpuflame.formats.pprof_proto`) start with its packed location ids in
the layout pprof writers use; the ids of every sample are decoded in bulk
(:mod:`gpuflame.formats.protobuf_bulk`), and what follows them (values and
labels, which samples share) is parsed by the runtime once per distinct
tail. :func:`sample_columns` returns None for anything else (another layout,
an id that is not a location, a stack past the depth limit), and the caller
reads the samples one by one through the runtime, which gives the exact
error. Launcher side only (numpy).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterator, Mapping, Sequence

import numpy as np

from gpuflame.formats import protobuf_bulk as bulk
from gpuflame.model.columns import SampleColumns
from gpuflame.model.profile import Labels

# Bytes of samples decoded per step of :func:`sample_columns`: bounds its temporary arrays.
SAMPLE_CHUNK = 1 << 22


# what follows a sample's location ids -> (values, labels), or None where it holds more ids
TailParser = Callable[[bytes], "tuple[tuple[int, ...], Labels] | None"]


class OneFrameEach(Mapping[int, tuple[int, ...]]):
    """Location id -> (frame id,) for locations of one frame each, kept as two arrays.

    What :func:`gpuflame.formats.pprof_tables.read_locations` gives a million locations: the samples' reader
    looks their ids up in the arrays (:class:`_FrameLookup`), where a dict
    of a million 1-tuples took 0.7 s and 150 MB to build. Anything else
    reading it as a mapping gets that dict, made on first use.
    """

    one_frame_each = True  # what pprof_samples.one_frame_each asks, without importing numpy

    @classmethod
    def of(cls, ids: Sequence[int], frame_ids: Sequence[int]) -> OneFrameEach:
        return cls(np.array(ids, dtype=np.uint64), np.array(frame_ids, dtype=np.int64))

    def __init__(self, ids: np.ndarray, frame_ids: np.ndarray) -> None:
        self.ids, self.frame_ids = ids, frame_ids
        self._dict: dict[int, tuple[int, ...]] | None = None

    def _as_dict(self) -> dict[int, tuple[int, ...]]:
        if self._dict is None:
            self._dict = dict(zip(self.ids.tolist(), zip(self.frame_ids.tolist()), strict=True))
        return self._dict

    def __getitem__(self, lid: int) -> tuple[int, ...]:
        return self._as_dict()[lid]

    def __iter__(self) -> Iterator[int]:
        return iter(self._as_dict())

    def __len__(self) -> int:
        return len(self.ids)


def sample_columns(
    source: bytes,
    sample_ends: array[int],
    location_frames: Mapping[int, tuple[int, ...]],
    tails: TailParser,
    max_depth: int,
) -> SampleColumns | None:
    """Every Sample message at once, as columns: where each holds its packed location ids first.

    *source* holds the messages one after another, each ending where
    *sample_ends* says (``pprof_samples.SampleBytes``).

    *tails* parses what follows the ids (values and labels), once per
    distinct tail; it gives None where a tail holds more location ids.
    None (read sample by sample) for any other layout.
    """
    if not len(sample_ends):
        return None
    data = np.frombuffer(source, dtype=np.uint8)
    ends = np.frombuffer(sample_ends, dtype=np.int64)
    starts = np.concatenate(([0], ends[:-1])).astype(np.int64)
    ids_first = np.flatnonzero(ends > starts)  # samples whose message starts with its ids (a stack)...
    ids_first = ids_first[data[starts[ids_first]] == 0x0A]
    if np.any(ends[ids_first] - starts[ids_first] < 2):
        return None
    head = np.zeros(len(ends), dtype=np.int64)  # ...the rest: no ids, or not first (the tail says)
    size = np.zeros(len(ends), dtype=np.int64)
    length = data[starts[ids_first] + 1]
    head[ids_first], size[ids_first] = 2, length & 0x7F
    longer = ids_first[length >= 0x80]  # ids of 128 bytes or more: a two-byte length
    if len(longer):
        second = starts[longer] + 2
        if np.any(second >= ends[longer]) or np.any(data[second] >= 0x80):
            return None  # 16 KiB of ids or a truncated message: sample by sample
        size[longer] |= data[second].astype(np.int64) << 7
        head[longer] = 3
    if np.any(starts + head + size > ends):
        return None
    found = _chunked_stacks(data, starts, ends, head, size, _FrameLookup.of(location_frames), max_depth)
    if found is None:
        return None
    del data
    # each sample's tail, then each distinct one numbered: loops in C (a million samples, a few distinct tails)
    tail_of = list(map(source.__getitem__, map(slice, (starts + head + size).tolist(), ends.tolist())))
    distinct = {tail: i for i, tail in enumerate(dict.fromkeys(tail_of))}
    which = np.fromiter(map(distinct.__getitem__, tail_of), dtype=np.int64, count=len(tail_of))
    del tail_of
    parsed = [tails(tail) for tail in distinct]
    if None in parsed:
        return None
    label_index: dict[Labels, int] = {}
    tail_labels = [label_index.setdefault(p[1], len(label_index)) for p in parsed]  # type: ignore[index]
    values = np.array([p[0] for p in parsed], dtype=np.int64).reshape(len(parsed), -1)  # type: ignore[index]
    frame_ids = found[1]  # int32 where the ids fit (_FrameLookup): half the bytes
    return SampleColumns(found[0], frame_ids, values[which], np.array(tail_labels)[which], list(label_index))


def _chunked_stacks(
    data: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    head: np.ndarray,
    size: np.ndarray,
    lookup: _FrameLookup | None,
    max_depth: int,
) -> tuple[np.ndarray, np.ndarray] | None:
    """:func:`_stack_columns` of each sample's ids: ``size[i]`` bytes from ``starts[i] + head[i]``, before ``ends[i]``.

    SAMPLE_CHUNK bytes of samples at a time (:func:`protobuf_bulk.runs`):
    decoding a million samples' ids in one step made arrays of hundreds of
    MB, each paid for in fresh pages from the kernel.
    """
    counts, frames = [], []
    for lo, hi in bulk.runs(ends, SAMPLE_CHUNK):
        begin = starts[lo:hi] + head[lo:hi]
        ids = bulk.gather(data, begin, begin + size[lo:hi])
        found = _stack_columns(ids, np.cumsum(size[lo:hi]), lookup, max_depth)
        if found is None:
            return None
        counts.append(found[0])
        frames.append(found[1])
    return np.concatenate(counts), np.concatenate(frames)


def _stack_columns(
    data: np.ndarray, ends: np.ndarray, lookup: _FrameLookup | None, max_depth: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """(stack lengths, frame ids) of packed location id lists that end at *ends* in *data*."""
    found = bulk.varints(data)
    if found is None or lookup is None:
        return None
    lids, last = found
    bounds = np.searchsorted(last, ends)  # varints of sample i: bounds[i-1]:bounds[i]
    counts = np.diff(bounds, prepend=0)
    cut = ends[counts > 0] - 1  # a stack's ids end where a varint ends
    if np.any(last[bounds[counts > 0] - 1] != cut) or np.any((counts == 0) & (np.diff(ends, prepend=0) > 0)):
        return None
    if len(counts) and counts.max() > max_depth:
        return None  # the sample-by-sample reader says which limit
    frame_ids = lookup(lids)
    return None if frame_ids is None else (counts, frame_ids)  # None: the sample-by-sample reader names it


class _FrameLookup:
    """The frame id of each location id, for locations of one frame each; None if one is not a location.

    A table indexed by id where the ids are dense (pprof writers number them
    1..n, gpuflame from a base), a binary search otherwise: forty million
    random searches cost seconds, forty million table reads a fraction.
    Built once per profile, used for every piece of its samples.
    """

    def __init__(self, keys: np.ndarray, frame_of: np.ndarray) -> None:
        if len(frame_of) and frame_of.max() < 2**31:
            frame_of = frame_of.astype(np.int32)  # what every stack's ids are kept in: half the bytes to gather
        self.top = int(keys.max())
        self.table: np.ndarray | None = None
        if self.top <= 4 * len(keys) + (1 << 22):
            self.table = np.full(self.top + 1, -1, dtype=frame_of.dtype)
            self.table[keys] = frame_of
        else:
            order = np.argsort(keys)
            self.keys, self.frame_of = keys[order], frame_of[order]

    @classmethod
    def of(cls, location_frames: Mapping[int, tuple[int, ...]]) -> _FrameLookup | None:
        if not location_frames:
            return None
        if isinstance(location_frames, OneFrameEach):
            return cls(location_frames.ids, location_frames.frame_ids)
        keys = np.fromiter(location_frames, np.uint64, len(location_frames))
        return cls(keys, np.fromiter((v[0] for v in location_frames.values()), np.int64, len(keys)))

    def __call__(self, lids: np.ndarray) -> np.ndarray | None:
        if self.table is not None:
            if len(lids) and int(lids.max()) > self.top:
                return None
            found = self.table[lids]
            return None if np.any(found < 0) else found
        at = np.minimum(np.searchsorted(self.keys, lids), len(self.keys) - 1)
        return None if np.any(self.keys[at] != lids) else self.frame_of[at]
