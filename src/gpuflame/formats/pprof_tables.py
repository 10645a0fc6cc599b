"""The tables of a pprof file: mappings, functions, locations (the frames of a profile).

Read message by message, or, for a large table, in bulk with numpy
(:mod:`gpuflame.formats.protobuf_bulk`) where that gives the same answer:
a million-frame profile has a million Functions and a million Locations.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpuflame.errors import ProfileFormatError
from gpuflame.formats.pprof_raw import BULK_MIN, RawProfile, Strings, frame_kind
from gpuflame.formats.protobuf_wire import iter_fields, to_int64
from gpuflame.model.profile import Frame, Profile, SampleType
from gpuflame.symbols.names import UNKNOWN, native_address_name


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
