"""Packed varints decoded with numpy, all at once: the location ids of a million pprof samples.

The ``protobuf`` runtime parses pprof (:mod:`gpuflame.formats.pprof_read`),
but reading a million samples' location ids back out of its message objects
costs microseconds of Python each. A large file's samples hold their ids
packed, first, in the layout every pprof writer uses; there the ids of all
samples are one byte array, and every varint in it is found (a byte < 0x80
ends one) and decoded by array operations. Anything else — a varint longer
than 10 bytes, ids that do not end where a varint ends — makes the caller
read the samples one by one through the runtime
(:mod:`gpuflame.formats.pprof_samples`), so this module never decides that a
file is bad: it only takes the fast road where the runtime would give the
same answer.

Launcher side only (numpy): the profiled process writes pprof, never reads it.
"""

from __future__ import annotations

import numpy as np

# Varints decoded per step of :func:`varints`: bounds its temporary arrays.
CHUNK = 1 << 22
MAX_VARINT = 10


def gather(data: np.ndarray, begin: np.ndarray, stop: np.ndarray) -> np.ndarray:
    """The bytes ``data[begin[i] : stop[i]]`` one after another, for spans in order that do not touch.

    One mask, written as runs (``np.repeat`` of the gaps and the spans'
    lengths), picks them: no ``bytes`` slice per span (a million samples'
    location ids). A mask summed from +1 and -1 marks took three times as
    long (numpy's cumulative sum of bytes is a loop of its own).
    """
    kept = stop > begin
    begin, stop = begin[kept], stop[kept]
    if not len(begin):
        return np.zeros(0, dtype=np.uint8)
    if len(begin) > 1 and np.any(begin[1:] <= stop[:-1]):
        raise ValueError("spans must be in order, apart")  # a caller's bug: fields lie apart
    first = int(begin[0])
    runs = np.empty(2 * len(begin), dtype=np.int64)
    runs[0] = 0
    runs[2::2] = begin[1:] - stop[:-1]
    runs[1::2] = stop - begin
    picked = np.zeros(len(runs), dtype=bool)
    picked[1::2] = True
    return data[first : int(stop[-1])][np.repeat(picked, runs)]


def varints(data: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Every varint of *data* (uint64, low 64 bits) and the index of its last byte.

    None when the data does not end with a whole varint or one is longer
    than 10 bytes (the message-by-message reader says which). One gather
    per byte position, masked where a varint is shorter, in 32 bits while
    the varints fit (location ids: most are 1-3 bytes); indexes in 32 bits
    where the data allows, which halves what each gather moves.
    """
    last = np.flatnonzero(data < 0x80)
    if len(data) and (not len(last) or last[-1] != len(data) - 1):
        return None
    ends_all = last.astype(np.int32) if len(data) < 2**31 else last
    out = np.empty(len(last), dtype=np.uint64)
    for begin in range(0, len(last), CHUNK):
        ends = ends_all[begin : begin + CHUNK]
        starts = np.empty_like(ends)
        starts[0] = ends_all[begin - 1] + 1 if begin else 0
        starts[1:] = ends[:-1] + 1
        more = ends - starts  # bytes after the first
        top = int(more.max())
        if top >= MAX_VARINT:
            return None
        wide = np.uint64 if top >= 4 else np.uint32  # 4 bytes of 7 bits fit in 32
        values = (data[starts] & 0x7F).astype(wide)
        for k in range(1, top + 1):
            byte = data[np.minimum(starts + k, ends)] & 0x7F
            byte *= more >= k  # 0 where the varint ended before byte k
            values |= byte.astype(wide) << wide(7 * k)
        out[begin : begin + CHUNK] = values
    return out, last


def runs(ends: np.ndarray, size: int) -> list[tuple[int, int]]:
    """Runs ``lo:hi`` of consecutive messages, about *size* bytes each; *ends*: where each message ends (cumulative).

    A message longer than *size* is a run of its own; no run is empty. The
    bulk readers work a run at a time so their temporary arrays stay a few
    MB, which the allocator reuses, instead of hundreds fresh from the kernel.
    """
    total = int(ends[-1]) if len(ends) else 0
    cuts = np.searchsorted(ends, np.arange(size, total, size), side="right")
    bounds = np.unique(np.concatenate(([0], cuts, [len(ends)]))).tolist()
    return list(zip(bounds[:-1], bounds[1:], strict=True))
