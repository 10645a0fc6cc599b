"""Many small protobuf messages decoded at once with numpy: the pprof reader's tables at a million entries.

Reading a million-frame profile message by message costs a few microseconds
of Python per Function, Location and Line (93-156 s in all on these
machines). Here a whole table is one byte array: every varint is found
(a byte < 0x80 ends one) and decoded by array operations, and a message is
read as a row of ``(key, value)`` pairs.

That view is exact only for messages whose fields are all varints, plus
sub-messages of all-varint fields at the field numbers the caller names
(a Location's Line). Anything else — another wire type, a varint longer
than 10 bytes, a sub-message that does not end where a varint ends, a
field number 0, a sub-message inside a sub-message, the same field twice in
one message — makes :func:`read_table` return None, and the caller reads
that table message by message, which raises the plain error a hostile file
deserves. So this module never decides that a file is bad: it only takes the
fast road where the slow one would give the same answer.

Launcher side only (numpy): the profiled process writes pprof, never reads it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from gpuflame.errors import ProfileFormatError
from gpuflame.formats.protobuf_regions import Regions

# Varints decoded per step of :func:`varints`: bounds its temporary arrays.
CHUNK = 1 << 22
# Bytes of messages read per step of :func:`read_table`: bounds its temporary arrays.
TABLE_CHUNK = 1 << 20
MAX_VARINT = 10


def blob(parts: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """*parts* as one uint8 array and each part's end offset (exclusive)."""
    if isinstance(parts, Regions):
        data, starts, stops = spans(parts)
        return gather(data, starts, stops), np.cumsum(stops - starts)
    ends = np.cumsum(np.fromiter(map(len, parts), dtype=np.int64, count=len(parts)))
    return np.frombuffer(b"".join(parts), dtype=np.uint8), ends


def spans(parts: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(bytes, starts, stops) of *parts*: where they lie, or, for a list, where they lie once joined."""
    if isinstance(parts, Regions):
        data = np.frombuffer(parts.data, dtype=np.uint8)
        starts = np.frombuffer(parts.starts, dtype=parts.typecode).astype(np.int64)
        return data, starts, np.frombuffer(parts.stops, dtype=parts.typecode).astype(np.int64)
    data, ends = blob(parts)
    return data, np.concatenate(([0], ends[:-1])).astype(np.int64), ends


def sizes(parts: Sequence[bytes]) -> np.ndarray:
    """The length of each part (int64)."""
    if isinstance(parts, Regions):
        _, starts, stops = spans(parts)
        return stops - starts
    return np.fromiter(map(len, parts), dtype=np.int64, count=len(parts))


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


def joined(parts: Regions, sep: int) -> bytes:
    """``bytes([sep]).join(parts)``, from the spans: the byte after each part but the last stands for *sep*.

    Parts split from one message lie two bytes apart at least (the next
    field's key and length), so each part and the byte after it stay apart.
    """
    data, starts, stops = spans(parts)
    if not len(starts):
        return b""
    stops[:-1] += 1
    out = gather(data, starts, stops)
    out[np.cumsum(stops - starts)[:-1] - 1] = sep
    return out.tobytes()


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


class Table(NamedTuple):
    """The fields read from a table of messages: one uint64 column per field, 0 where absent."""

    fields: dict[int, np.ndarray]
    # the sub-messages, in order: which message each belongs to, and their own fields
    sub_owner: np.ndarray
    sub_fields: dict[int, np.ndarray]


def read_table(
    parts: Sequence[bytes], fields: tuple[int, ...], sub_field: int = 0, sub_fields: tuple[int, ...] = ()
) -> Table | None:
    """*fields* of every message in *parts*, and *sub_fields* of each sub-message at field *sub_field*.

    None where the pair view would not be exact (see the module's docstring).
    Read about :data:`TABLE_CHUNK` bytes of messages at a time: a million
    messages in one step made a dozen arrays of tens of MB, each paid for
    in fresh pages from the kernel.
    """
    ends = np.cumsum(sizes(parts))
    if not len(ends) or ends[-1] <= TABLE_CHUNK:
        return _read_piece(parts, fields, sub_field, sub_fields)
    pieces = []
    for lo, hi in runs(ends, TABLE_CHUNK):
        piece = _read_piece(parts[lo:hi], fields, sub_field, sub_fields)
        if piece is None:
            return None
        pieces.append(piece._replace(sub_owner=piece.sub_owner + lo))  # rows of the whole table
    if len(pieces) == 1:
        return pieces[0]
    return Table(
        {f: np.concatenate([p.fields[f] for p in pieces]) for f in fields},
        np.concatenate([p.sub_owner for p in pieces]),
        {f: np.concatenate([p.sub_fields[f] for p in pieces]) for f in sub_fields},
    )


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


def _read_piece(
    parts: Sequence[bytes], fields: tuple[int, ...], sub_field: int, sub_fields: tuple[int, ...]
) -> Table | None:
    """:func:`read_table` of a few MB of messages."""
    data, msg_ends = blob(parts)
    found = varints(data)
    if found is None:
        return None
    values, last = found
    if len(msg_ends) and np.any(np.diff(msg_ends, prepend=0) == 0):
        return None  # an empty message: rare, read the slow way
    # every message ends where a varint ends, with an even number of varints
    token_end = np.searchsorted(last, msg_ends - 1)
    if len(msg_ends) and (
        np.any(token_end >= len(last)) or np.any(last[np.minimum(token_end, len(last) - 1)] != msg_ends - 1)
    ):
        return None
    counts = np.diff(token_end + 1, prepend=0)
    if np.any(counts & 1):
        return None
    keys, vals = values[0::2], values[1::2]
    key_at = np.concatenate(([0], last[1::2][:-1] + 1)) if len(keys) else np.zeros(0, np.int64)  # byte of each key
    owner = np.repeat(np.arange(len(parts)), counts // 2)
    wire = keys & 7
    number = keys >> 3
    if np.any(number == 0) or np.any((wire != 0) & (wire != 2)):
        return None
    nested = _nested(keys, vals, key_at, last[1::2], owner, msg_ends, sub_field)
    if nested is None:
        return None
    depth, sub_index = nested
    top = depth == 0
    out = _columns(number[top], vals[top], owner[top], len(parts), fields)
    inner = depth == 1
    n_sub = int(np.count_nonzero(wire[top] == 2))
    sub = _columns(number[inner], vals[inner], sub_index[inner], n_sub, sub_fields)
    if out is None or sub is None:
        return None
    sub_owner = owner[top][wire[top] == 2]
    return Table(out, sub_owner, sub)


def _nested(
    keys: np.ndarray,
    vals: np.ndarray,
    key_at: np.ndarray,
    val_end: np.ndarray,
    owner: np.ndarray,
    msg_ends: np.ndarray,
    sub_field: int,
) -> tuple[np.ndarray, np.ndarray] | None:
    """Each pair's depth (0 in the message, 1 in a sub-message) and its sub-message's index; None if not exact."""
    is_len = (keys & 7) == 2
    starts = val_end[is_len].astype(np.int64) + 1
    stops = starts + vals[is_len].astype(np.int64)
    if np.any(stops > msg_ends[owner[is_len]]):
        return None
    events = np.zeros(len(key_at) + 1, dtype=np.int64)
    # a pair is inside a sub-message when its key's byte lies in [start, stop)
    np.add.at(events, np.searchsorted(key_at, starts), 1)
    np.add.at(events, np.searchsorted(key_at, stops), -1)
    depth = np.cumsum(events[:-1])
    if np.any(depth > 1) or np.any(depth < 0):
        return None
    # a sub-message ends where a pair ends: its stop is a key's byte or the end of the table
    stop_pair = np.searchsorted(key_at, stops)
    at_end = stop_pair == len(key_at)
    if np.any(~at_end & (key_at[np.minimum(stop_pair, len(key_at) - 1)] != stops)):
        return None
    if np.any(at_end & (stops != (msg_ends[-1] if len(msg_ends) else 0))):
        return None
    if np.any(is_len & (depth == 1)) or np.any(is_len & ((keys >> 3) != sub_field)):
        return None
    if np.any(~is_len & (depth == 0) & ((keys >> 3) == sub_field)):
        return None
    sub_index = np.cumsum(is_len) - 1
    return depth, sub_index


def _columns(
    number: np.ndarray, vals: np.ndarray, row: np.ndarray, rows: int, wanted: tuple[int, ...]
) -> dict[int, np.ndarray] | None:
    """One column per wanted field number; None when a field appears twice in one row."""
    out: dict[int, np.ndarray] = {}
    for f in wanted:
        pick = number == f
        where = row[pick]
        if len(where) > 1 and np.any(where[1:] == where[:-1]):
            return None
        column = np.zeros(rows, dtype=np.uint64)
        column[where] = vals[pick]
        out[f] = column
    return out


def int64(column: np.ndarray) -> np.ndarray:
    """uint64 varints read as protobuf int64 (two's complement)."""
    return column.view(np.int64)


def check_varints_end(data: bytes, what: str) -> None:
    """A packed field's bytes must end with a whole varint."""
    if data and data[-1] >= 0x80:
        raise ProfileFormatError(f"truncated protobuf: the last value of {what} runs past the end")
