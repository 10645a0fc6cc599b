"""The samples of a pprof file: each Sample's bytes parsed by the ``protobuf`` runtime, or a large file's in bulk.

:mod:`gpuflame.formats.pprof_read` hands over each Sample as its bytes (the
runtime's ``SplitProfile``). A large file in the layout pprof writers use
(every location one frame, each Sample's ids packed and first) becomes
columns (:func:`gpuflame.formats.pprof_bulk.sample_columns`: the ids in
bulk with numpy, the values and labels parsed by the runtime once per
distinct tail); every other file, and every sample of a large file off that
layout, is parsed sample by sample by the runtime, which gives the exact
error. The stack limits (:mod:`gpuflame.limits`) hold on both roads.
"""

from __future__ import annotations

import io
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import accumulate, chain
from typing import TYPE_CHECKING, Any

from gpuflame import limits
from gpuflame.errors import ProfileFormatError
from gpuflame.formats.pprof_tables import BULK_MIN, Strings
from gpuflame.model.profile import Labels, Sample

if TYPE_CHECKING:
    from gpuflame.model.columns import SampleColumns


class SampleBytes:
    """Every Sample's bytes, one after another, and where each ends: the runtime's strings, in two objects.

    A list of a million ``bytes`` costs 80 bytes of object each beside the
    data; this holds the data once, and a large file's samples are cut out of
    it with numpy (:func:`gpuflame.formats.pprof_bulk.sample_columns`).
    """

    __slots__ = ("data", "ends")

    def __init__(self, parts: Iterable[bytes]) -> None:
        stream = io.BytesIO()  # write() returns each part's length: the join and the lengths in one C loop
        self.ends = array("q", accumulate(map(stream.write, parts)))  # int64, cumulative
        self.data = stream.getvalue()

    def __len__(self) -> int:
        return len(self.ends)

    def chunks(self) -> Iterator[bytes]:
        return map(self.data.__getitem__, map(slice, chain((0,), self.ends), self.ends))


def one_frame_each(location_frames: Mapping[int, tuple[int, ...]]) -> bool:
    """Every location is one frame (no inlined calls): a stack's ids map one to one onto frame ids."""
    if getattr(location_frames, "one_frame_each", False):  # pprof_bulk.OneFrameEach: so by construction
        return True
    return all(len(v) == 1 for v in location_frames.values())


# a Sample's bytes -> the runtime's split_profile_pb2.Sample (or pprof_stdlib_parse's of the same shape)
SampleParser = Callable[[bytes], Any]


def read_sample_columns(
    samples: SampleBytes,
    location_frames: Mapping[int, tuple[int, ...]],
    strings: Strings,
    n_types: int,
    parse: SampleParser,
) -> SampleColumns | None:
    """Every Sample at once as columns (numpy), for a large profile in the layout pprof writers use; else None."""
    if len(samples) < BULK_MIN or not one_frame_each(location_frames):
        return None
    from gpuflame.formats import pprof_bulk  # numpy: only for this many samples

    reader = _SampleReader(location_frames, strings, n_types, parse)
    depth = limits.STACK_DEPTH.value()
    return pprof_bulk.sample_columns(samples.data, samples.ends, location_frames, reader.tail, depth)


def read_samples(
    chunks: Iterable[bytes],
    location_frames: Mapping[int, tuple[int, ...]],
    strings: Strings,
    n_types: int,
    parse: SampleParser,
) -> list[Sample]:
    """Every Sample, parsed one by one by *parse* (the runtime's)."""
    return list(map(_SampleReader(location_frames, strings, n_types, parse).sample, chunks))


class _SampleReader:
    """What reading samples needs, built once per file: the location and label memos, the limits left."""

    def __init__(
        self, location_frames: Mapping[int, tuple[int, ...]], strings: Strings, n_types: int, parse: SampleParser
    ) -> None:
        self.parse = parse
        self.location_frames = location_frames
        self.flat = one_frame_each(location_frames)
        self.strings = strings
        self.n_types = n_types
        self.frames_of: dict[int, int | tuple[int, ...]] = {}
        self.labels: dict[tuple[int, int, int, bool], tuple[str, str]] = {}
        self.max_depth = limits.STACK_DEPTH.value()
        self.frames_left = limits.STACK_FRAMES.value()

    def sample(self, chunk: bytes) -> Sample:
        message = self.parse(chunk)
        ids = message.location_id
        if len(ids) > self.max_depth:
            raise limits.STACK_DEPTH.exceeded("pprof: a sample's stack")
        try:
            found: list[Any] = list(map(self.frames_of.__getitem__, ids))
        except KeyError:
            found = list(map(self._frames, ids))
        stack: tuple[int, ...] = tuple(found) if self.flat else tuple(chain.from_iterable(found))
        if len(stack) > self.max_depth:  # inlined locations hold several frames each
            raise limits.STACK_DEPTH.exceeded("pprof: a sample's stack")
        self.frames_left -= len(stack)
        if self.frames_left < 0:
            raise limits.STACK_FRAMES.exceeded("pprof: the count of frames in all the samples' stacks")
        return Sample(stack, self._values(message.value), self._labels(message.label))

    def tail(self, chunk: bytes) -> tuple[tuple[int, ...], Labels] | None:
        """Values and labels of what follows a sample's ids; None if it holds more ids."""
        message = self.parse(chunk)
        if message.location_id:
            return None
        return self._values(message.value), self._labels(message.label)

    def _frames(self, lid: int) -> int | tuple[int, ...]:
        frames = self.location_frames.get(lid)
        if frames is None:
            raise ProfileFormatError(f"malformed pprof: a sample refers to location {lid}, which does not exist")
        found = self.frames_of[lid] = frames[0] if self.flat else frames
        return found

    def _values(self, values: Sequence[int]) -> tuple[int, ...]:
        if len(values) != self.n_types:
            raise ProfileFormatError(
                f"malformed pprof: a sample has {len(values)} values but the profile has {self.n_types} sample types"
            )
        return tuple(values)

    def _labels(self, labels: Sequence[Any]) -> Labels:
        return tuple(sorted(map(self._label, labels))) if labels else ()

    def _label(self, label: Any) -> tuple[str, str]:
        numeric = label.HasField("num") or label.HasField("num_unit")
        key = (label.key, label.str, label.num, numeric)
        pair = self.labels.get(key)
        if pair is None:
            name = self.strings.get(label.key, "a label's key")
            if label.str:
                text = self.strings.get(label.str, f"label {name!r}'s value")
            else:
                text = str(label.num) if numeric else ""
            pair = self.labels[key] = (name, text)
        return pair
