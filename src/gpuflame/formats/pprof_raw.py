"""The shared names of a pprof file, lowest of its readers and writer.

profile.proto's field numbers, the frame-kind rule a decoded frame follows, and a
Profile message split into its raw parts: the top-level fields as spans of the file
(:class:`RawProfile`) and the string table every other table refers to
(:class:`Strings`). The writer (:mod:`gpuflame.formats.pprof`), the tables, the
samples and the bulk readers all build on these and not on each other.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from gpuflame.errors import ProfileFormatError
from gpuflame.formats.protobuf_regions import Regions
from gpuflame.formats.protobuf_wire import read_string
from gpuflame.model.profile import NATIVE, PYTHON
from gpuflame.symbols.kinds import guess_kind

if TYPE_CHECKING:
    import numpy as np

# Field numbers of profile.proto (only those gpuflame reads or writes).
P_SAMPLE_TYPE, P_SAMPLE, P_MAPPING, P_LOCATION, P_FUNCTION, P_STRING_TABLE = 1, 2, 3, 4, 5, 6
P_TIME_NANOS, P_DURATION_NANOS, P_PERIOD_TYPE, P_PERIOD, P_COMMENT, P_DEFAULT_SAMPLE_TYPE = (
    9,
    10,
    11,
    12,
    13,
    14,
)


def frame_kind(name: str, file: str, in_mapping: bool) -> str:
    """The kind a decoded frame gets: :func:`guess_kind`, and fileless frames in a Mapping are native."""
    kind = guess_kind(name, file)
    if kind == PYTHON and in_mapping and not file:
        return NATIVE
    return kind


# Tables smaller than this are read message by message: numpy's fixed costs
# outweigh the gain, and the profiled process (JAX's small pprof) stays numpy-free.
BULK_MIN = 4096


class RawProfile(NamedTuple):
    """The top-level fields of a Profile message, sub-messages as spans of its bytes (read when asked)."""

    sample_types: Regions
    samples: Regions
    mappings: Regions
    locations: Regions
    functions: Regions
    strings: Regions
    comments: list[int]
    scalars: dict[int, int]


class Strings:
    """The string table, decoded lazily, with plain errors for bad indices."""

    def __init__(self, raw: Regions | list[bytes]) -> None:
        if raw and raw[0]:
            raise ProfileFormatError("malformed pprof: string_table[0] must be the empty string")
        self._raw = raw
        self._count = len(raw)
        # a table left in place is read by its spans here: a Regions' own methods are a Python call a lookup
        self._spans = (raw.data, raw.starts, raw.stops) if isinstance(raw, Regions) else None
        self._cache: dict[int, str] = {0: ""}
        self._all: list[str] | None = None

    def get(self, index: int, what: str) -> str:
        text = self._cache.get(index)
        if text is None:
            if not 0 <= index < self._count:
                raise ProfileFormatError(
                    f"malformed pprof: {what} refers to string {index}, but the string table has {self._count} entries"
                )
            if self._all is not None:
                text = self._all[index]
            elif self._spans is not None:
                data, starts, stops = self._spans
                text = read_string(data[starts[index] : stops[index]])
            else:
                text = read_string(self._raw[index])
            self._cache[index] = text
        return text

    def __len__(self) -> int:
        return self._count

    def many(self, indices: np.ndarray) -> list[str] | None:
        """The strings at *indices*; None if one is past the table (:meth:`get` says which).

        Decodes the whole table once: called for tables of thousands of entries.
        The encoded table is emptied then (the split's list of it too): a
        million-frame pprof's 1.4 million strings are not held twice while
        its samples are read.
        """
        if len(indices) and int(indices.max()) >= len(self):
            return None
        if self._all is None:
            self._all = _decode_all(self._raw)
            self._raw.clear()
            self._spans = None
        return list(map(self._all.__getitem__, indices.tolist()))


def _decode_all(raw: Sequence[bytes]) -> list[str]:
    """Every string of the table, as ``read_string`` decodes each.

    One decode of the table joined by NULs, split again, where no string
    holds a NUL and all are valid UTF-8 (a million names: a third of the
    time of a decode each); else one by one, invalid bytes replaced. A
    large table still in place in the file is joined from its spans (numpy).
    """
    if isinstance(raw, Regions) and len(raw) >= BULK_MIN:
        from gpuflame.formats import protobuf_bulk

        joined = protobuf_bulk.joined(raw, 0)
    else:
        joined = b"\0".join(raw)
    if joined.count(0) == len(raw) - 1:
        try:
            return joined.decode("utf-8").split("\0")
        except UnicodeDecodeError:
            pass
    return [b.decode("utf-8", "replace") for b in raw]
