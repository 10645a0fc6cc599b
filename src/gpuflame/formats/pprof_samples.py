"""The samples of a pprof file: the loop where reading a large profile spends its time.

A stack's location ids are read as bytes or 16-bit words and turned into
frame ids by one ``itemgetter`` call where :func:`gpuflame.formats.pprof.encode`'s
layout allows; wider ids (over 16,256 frames) are decoded for all samples
at once with numpy; anything else goes sample by sample.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from itertools import chain
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from gpuflame import limits
from gpuflame.errors import ProfileFormatError
from gpuflame.formats.pprof_raw import BULK_MIN, Strings
from gpuflame.formats.pprof_tables import message_fields, scalar_field
from gpuflame.formats.protobuf_wire import (
    LEN,
    VARINT,
    VARINT_RUN,
    VarintMemo,
    decode_varint_bytes,
    encode_varint,
    iter_fields,
    read_varint,
    split_packed,
    to_int64,
)
from gpuflame.model.profile import Labels, Sample

if TYPE_CHECKING:
    from gpuflame.model.columns import SampleColumns


class _LocationMemo(dict):
    """``location id (varint bytes or int) -> frame id(s)``: the inner lookup of every stack."""

    def __init__(self, frames_of: Mapping[int, tuple[int, ...]], flat: bool) -> None:
        super().__init__()
        self._frames_of = frames_of
        self._flat = flat

    def __missing__(self, key: bytes | int) -> int | tuple[int, ...]:
        lid = key if isinstance(key, int) else decode_varint_bytes(key)
        frames = self._frames_of.get(lid)
        if frames is None:
            raise ProfileFormatError(f"malformed pprof: a sample refers to location {lid}, which does not exist")
        value = frames[0] if self._flat else frames
        self[key] = value
        return value


class _TailMemo(dict):
    """``bytes after a sample's location ids -> (values, labels)``.

    Samples share values and labels far more often than not, so each distinct
    tail is parsed once. A tail that holds more location ids maps to None and
    the sample is parsed the slow way.
    """

    def __init__(self, strings: Strings, n_types: int) -> None:
        super().__init__()
        self._strings = strings
        self._n_types = n_types
        self._values = VarintMemo(to_int64)
        self._labels: dict[bytes, tuple[str, str]] = {}

    def __missing__(self, tail: bytes) -> tuple[tuple[int, ...], Labels] | None:
        ids, values, labels = self.parse(tail)
        result = None if ids else (values, labels)
        self[tail] = result
        return result

    def parse(self, data: bytes) -> tuple[list[bytes | int], tuple[int, ...], Labels]:
        """Location id keys, values and labels of a whole Sample message."""
        ids: list[bytes | int] = []
        values: list[int] = []
        labels: list[tuple[str, str]] = []
        for field, wire, value in iter_fields(data):  # value: bytes where wire is LEN, else int (the ignores)
            if field == 1:
                if wire == LEN:
                    ids.extend(split_packed(value, 1))  # type: ignore[arg-type]
                elif wire == VARINT:
                    ids.append(value)
            elif field == 2:
                if wire == LEN:
                    values.extend(self._values[k] for k in split_packed(value, 2))  # type: ignore[arg-type]
                elif wire == VARINT:
                    values.append(to_int64(value))  # type: ignore[arg-type]
            elif field == 3 and wire == LEN:
                labels.append(self._label(value))  # type: ignore[arg-type]
        if len(values) != self._n_types:
            raise ProfileFormatError(
                f"malformed pprof: a sample has {len(values)} values but the profile has {self._n_types} sample types"
            )
        return ids, tuple(values), tuple(sorted(labels))

    def _label(self, data: bytes) -> tuple[str, str]:
        pair = self._labels.get(data)
        if pair is None:
            f = message_fields(data)
            key = self._strings.get(scalar_field(f, 1, "label"), "a label's key")
            str_index = scalar_field(f, 2, "label")
            if str_index:
                text = self._strings.get(str_index, f"label {key!r}'s value")
            elif 3 in f or 4 in f:
                text = str(to_int64(scalar_field(f, 3, "label")))
            else:
                text = ""
            pair = self._labels[data] = (key, text)
        return pair


def one_frame_each(location_frames: Mapping[int, tuple[int, ...]]) -> bool:
    """Every location is one frame (no inlined calls): a stack's ids map one to one onto frame ids."""
    if getattr(location_frames, "one_frame_each", False):  # pprof_bulk.OneFrameEach: so by construction
        return True
    return all(len(v) == 1 for v in location_frames.values())


def read_sample_columns(
    chunks: Sequence[bytes], location_frames: Mapping[int, tuple[int, ...]], strings: Strings, n_types: int
) -> SampleColumns | None:
    """Every Sample at once as columns (numpy), for a large profile in the layout pprof writers use; else None."""
    if len(chunks) < BULK_MIN or not one_frame_each(location_frames):
        return None
    from gpuflame.formats import pprof_bulk  # numpy: only for this many samples

    tails = _TailMemo(strings, n_types)
    return pprof_bulk.sample_columns(chunks, location_frames, tails.__getitem__, limits.STACK_DEPTH.value())


def read_samples(
    chunks: Sequence[bytes], location_frames: Mapping[int, tuple[int, ...]], strings: Strings, n_types: int
) -> list[Sample]:
    """Decode every Sample: the loop where reading a large profile spends its time.

    The fast path covers the layout pprof writers use (location ids first,
    packed) with ids that are all one byte or all two bytes long, which is what
    :func:`encode` writes: such a list is read as bytes or as 16-bit words and
    turned into frame ids by one ``itemgetter`` call over a flat table. Other
    layouts go through :meth:`_SampleReader.general`.
    """
    reader = _SampleReader(location_frames, strings, n_types)
    max_depth = reader.max_depth
    frames_left = limits.STACK_FRAMES.value()  # the general path counts its own into reader.frames_left
    table, tails, words_of, getter, high = reader.table, reader.tails, reader.words_of, itemgetter, _HIGH_BYTES
    out: list[Sample] = []
    append = out.append
    wide: list[tuple[int, bytes, bytes, Any]] = []
    for raw in chunks:
        if raw[:1] == b"\x0a":  # field 1 (the location ids) first: split it from the rest
            size = raw[1] if len(raw) > 1 else 0x80
            start = 2
            if size >= 0x80:
                size, start = read_varint(raw, 1)
            stop = start + size
            if stop > len(raw):
                raise ProfileFormatError("truncated protobuf: field 1 runs past the end of the data")
            ids = raw[start:stop]
            tail = tails[raw[stop:]]
        else:
            ids = b""
            tail = tails[raw]
        if tail is None or table is None:
            append(reader.general(raw, ids, tail))
            continue
        if ids.isascii():
            words: bytes | tuple[int, ...] = ids
        elif not len(ids) & 1 and ids[1::2].isascii() and not ids[::2].translate(None, high):
            words = words_of[len(ids)](ids)
        else:
            wide.append((len(out), raw, ids, tail))
            append(None)  # type: ignore[arg-type]
            continue
        n = len(words)
        if n > max_depth:
            raise limits.STACK_DEPTH.exceeded("pprof: a sample's stack")
        frames_left -= n
        if frames_left < 0:
            raise limits.STACK_FRAMES.exceeded("pprof: the count of frames in all the samples' stacks")
        try:
            stack = getter(*words)(table) if n > 1 else (table[words[0]],) if n else ()
        except IndexError:
            stack = (-1,)
        if -1 in stack:
            _raise_missing(words, table)
        append(Sample(stack, tail[0], tail[1]))
    if wide:
        _read_wide(wide, out, reader)
    return out


def _read_wide(wide: list[tuple[int, bytes, bytes, Any]], out: list[Sample], reader: _SampleReader) -> None:
    """Samples whose location ids are wider than two bytes (over 16,256 frames): in bulk where possible."""
    stacks = None
    if len(wide) >= BULK_MIN and reader.flat:
        from gpuflame.formats import pprof_bulk  # numpy: only for this many samples

        stacks = pprof_bulk.stacks([w[2] for w in wide], reader.location_frames, reader.max_depth)
    if stacks is None:
        for index, raw, ids, tail in wide:
            out[index] = reader.general(raw, ids, tail)
        return
    for (index, _, _, tail), stack in zip(wide, stacks, strict=True):
        out[index] = Sample(stack, tail[0], tail[1])


class _SampleReader:
    """What decoding samples needs, built once per profile, and the way for samples off the fast path."""

    def __init__(self, location_frames: Mapping[int, tuple[int, ...]], strings: Strings, n_types: int) -> None:
        self.location_frames = location_frames
        self.flat = one_frame_each(location_frames)
        self.lookup = _LocationMemo(location_frames, self.flat).__getitem__
        self.table = _fast_table(location_frames) if self.flat else None
        self.words_of = _WordUnpackers()
        self.tails = _TailMemo(strings, n_types)
        self.max_depth = limits.STACK_DEPTH.value()
        self.frames_left = limits.STACK_FRAMES.value()

    def general(self, raw: bytes, ids: bytes, tail: tuple[tuple[int, ...], Labels] | None) -> Sample:
        """Fields in another order (*tail* None: parse it all), ids of mixed widths, locations of many frames."""
        keys: Sequence[bytes | int]  # location id keys: varint bytes, or the ints of one-byte ids
        if tail is None:
            keys, values, labels = self.tails.parse(raw)
        else:
            if ids and ids[-1] >= 0x80:
                raise ProfileFormatError("truncated protobuf: the last value of packed field 1 runs past the end")
            keys = ids if ids.isascii() else VARINT_RUN.findall(ids)
            values, labels = tail
        if len(keys) > self.max_depth:
            raise limits.STACK_DEPTH.exceeded("pprof: a sample's stack")
        stack = _stack(map(self.lookup, keys), self.flat)
        if len(stack) > self.max_depth:  # inlined locations hold several frames each
            raise limits.STACK_DEPTH.exceeded("pprof: a sample's stack")
        self.frames_left -= len(stack)
        if self.frames_left < 0:
            raise limits.STACK_FRAMES.exceeded("pprof: the count of frames in all the samples' stacks")
        return Sample(stack, values, labels)


class _WordUnpackers(dict):
    """``byte length -> Struct.unpack`` reading that many bytes as native 16-bit words."""

    def __missing__(self, size: int) -> Callable[[bytes], tuple[int, ...]]:
        unpack = self[size] = struct.Struct(f"={size // 2}H").unpack
        return unpack


_HIGH_BYTES = bytes(range(0x80, 0x100))


def _stack(frame_ids: Iterator[Any], flat: bool) -> tuple[int, ...]:
    return tuple(frame_ids) if flat else tuple(chain.from_iterable(frame_ids))


def _fast_table(location_frames: Mapping[int, tuple[int, ...]]) -> list[int]:
    """Frame id by one-byte varint (0..127) or by a two-byte varint read as a native 16-bit word.

    Two-byte varints have their first byte >= 0x80, so their words are >= 128
    in either byte order and never collide with one-byte keys. Slots that are
    not a location hold -1, which the caller checks for; keys past the end
    raise IndexError, which the caller turns into the same error.
    """
    keys: dict[int, int] = {}
    for lid, frames in location_frames.items():
        if lid < 0x80:
            keys[lid] = frames[0]
        elif lid < 0x4000:
            keys[int.from_bytes(encode_varint(lid), sys.byteorder)] = frames[0]
    table = [-1] * (max(keys) + 1 if keys else 0)
    for key, frame_id in keys.items():
        table[key] = frame_id
    return table


def _raise_missing(words: bytes | tuple[int, ...], table: list[int]) -> None:
    for w in words:
        if w >= len(table) or table[w] == -1:
            lid = w if w < 0x80 else decode_varint_bytes(w.to_bytes(2, sys.byteorder))
            raise ProfileFormatError(f"malformed pprof: a sample refers to location {lid}, which does not exist")
    raise ProfileFormatError("malformed pprof: a sample refers to a location that does not exist")
