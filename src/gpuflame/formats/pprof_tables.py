"""The tables of a pprof file: strings, mappings, functions, locations (the frames of a profile).

Read message by message, or, for a large table, in bulk with numpy
(:mod:`gpuflame.formats.protobuf_bulk`) where that gives the same answer:
a million-frame profile has a million Functions and a million Locations.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

from gpuflame.errors import ProfileFormatError
from gpuflame.formats.pprof import frame_kind
from gpuflame.formats.protobuf_regions import Regions
from gpuflame.formats.protobuf_wire import iter_fields, read_string, to_int64
from gpuflame.model.profile import Frame, Profile, SampleType
from gpuflame.symbols.names import UNKNOWN, native_address_name

if TYPE_CHECKING:
    import numpy as np


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


def message_fields(data: bytes) -> dict[int, list[int | bytes]]:
    """All fields of a small sub-message, by number."""
    out: dict[int, list[int | bytes]] = {}
    for field, _wire, value in iter_fields(data):
        out.setdefault(field, []).append(value)
    return out


def scalar_field(fields: dict[int, list[int | bytes]], number: int, what: str) -> int:
    """The last value of a scalar field (protobuf's rule for repeated scalars), 0 if absent."""
    values = fields.get(number)
    if not values:
        return 0
    value = values[-1]
    if isinstance(value, bytes):
        raise ProfileFormatError(f"malformed pprof: field {number} of a {what} is not a number")
    return value


def _subs(fields: dict[int, list[int | bytes]], number: int, what: str) -> list[bytes]:
    values = fields.get(number, [])
    for v in values:
        if not isinstance(v, bytes):
            raise ProfileFormatError(f"malformed pprof: field {number} of a {what} is not a message")
    return values  # type: ignore[return-value]


def read_value_type(data: bytes, strings: Strings) -> SampleType:
    f = message_fields(data)
    return SampleType(
        strings.get(scalar_field(f, 1, "sample type"), "a sample type"),
        strings.get(scalar_field(f, 2, "sample type"), "a sample type's unit"),
    )


def _read_mappings(raw: RawProfile, strings: Strings) -> dict[int, str]:
    out: dict[int, str] = {}
    for data in raw.mappings:
        f = message_fields(data)
        mid = scalar_field(f, 1, "mapping")
        if mid == 0:
            raise ProfileFormatError("malformed pprof: a mapping has id 0")
        out[mid] = strings.get(scalar_field(f, 5, "mapping"), f"mapping {mid}'s file name")
    return out


def _table_id(f: dict[int, list[int | bytes]], what: str, seen: Mapping[int, object]) -> int:
    """A table entry's id (field 1): never 0, and not already in its table."""
    entry_id = scalar_field(f, 1, what)
    if entry_id == 0:
        raise ProfileFormatError(f"malformed pprof: a {what} has id 0")
    if entry_id in seen:
        raise ProfileFormatError(f"malformed pprof: {what} id {entry_id} appears twice")
    return entry_id


def _read_functions(raw: RawProfile, strings: Strings) -> dict[int, tuple[str, str, int]]:
    """Function id -> (name, file, start_line); the name falls back to system_name."""
    if len(raw.functions) >= BULK_MIN:
        from gpuflame.formats import pprof_bulk  # numpy: only for tables this large

        found = pprof_bulk.functions(raw.functions, strings)
        if found is not None:
            return found
    out: dict[int, tuple[str, str, int]] = {}
    for data in raw.functions:
        f = message_fields(data)
        fid = _table_id(f, "function", out)
        name = strings.get(scalar_field(f, 2, "function"), f"function {fid}'s name")
        if not name:
            name = strings.get(scalar_field(f, 3, "function"), f"function {fid}'s system name")
        file = strings.get(scalar_field(f, 4, "function"), f"function {fid}'s file name")
        out[fid] = (name, file, max(0, to_int64(scalar_field(f, 5, "function"))))
    return out


def read_locations(raw: RawProfile, strings: Strings, profile: Profile) -> Mapping[int, tuple[int, ...]]:
    """Location id -> frame ids (leaf first), adding the frames to *profile*."""
    mappings = _read_mappings(raw, strings)
    functions = _read_functions(raw, strings)
    if len(raw.locations) >= BULK_MIN:
        from gpuflame.formats import pprof_bulk

        found = pprof_bulk.locations(raw.locations, mappings, functions, profile)
        if found is not None:
            return found
    out: dict[int, tuple[int, ...]] = {}
    for data in raw.locations:
        f = message_fields(data)
        lid = _table_id(f, "location", out)
        mid = scalar_field(f, 2, "location")
        if mid and mid not in mappings:
            raise ProfileFormatError(f"malformed pprof: location {lid} refers to mapping {mid}, which does not exist")
        address = scalar_field(f, 3, "location")
        frames = [_line_frame(line, lid, address, mid, functions) for line in _subs(f, 4, "location")]
        if not frames:
            name = native_address_name(address)
            file = mappings.get(mid, "")
            frames = [Frame(name, file, 0, frame_kind(name, file, True))]
        out[lid] = tuple(profile.frame_id(fr) for fr in frames)
    return out


def _line_frame(
    data: bytes, lid: int, address: int, mapping_id: int, functions: dict[int, tuple[str, str, int]]
) -> Frame:
    f = message_fields(data)
    fid = scalar_field(f, 1, "line")
    line = to_int64(scalar_field(f, 2, "line"))
    start = 0
    if fid == 0:
        name, file = (native_address_name(address) if address else UNKNOWN), ""
    elif fid in functions:
        name, file, start = functions[fid]
    else:
        raise ProfileFormatError(f"malformed pprof: location {lid} refers to function {fid}, which does not exist")
    if not name:
        name = native_address_name(address) if address else UNKNOWN
    return Frame(name, file, line, frame_kind(name, file, bool(mapping_id)), start)
