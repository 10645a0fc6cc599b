"""gzip pprof (``profile.proto``), gpuflame's native on-disk format, in pure Python.

Writing (:func:`encode`) maps the model onto pprof like this:

- ``string_table[0]`` is ``""``; every other string is stored once.
- ``sample_type`` from ``profile.sample_types``; ``default_sample_type``,
  ``comment``, ``time_nanos`` and ``duration_nanos`` from the fields of the
  same names. ``period_type`` is the first sample type and ``period`` is 1:
  gpuflame records every allocation, it does not sample.
- One Location per frame, ``Location.id = frame index + base``, with one Line
  ``{function_id, line = frame.line}``. ``base`` is 1 for up to 127 frames,
  else 128 (up to 16256 frames), 16384, ...: every id then has the same
  varint width, which lets :func:`decode` read a stack in one C call
  (:func:`location_id_base`).
- One Function per distinct ``(name, system_name, filename, start_line)``: ``name`` is the
  display name of the AKS guide's table (``LlamaMLP > forward``, which is what
  Grafana/Pyroscope show), ``system_name`` the dotted qualname
  (``LlamaMLP.forward``), ``filename`` the frame's file. Where the dotted
  name is the name itself (``bar``, ``<module>``) system_name is left empty:
  ``go tool pprof`` treats a Function whose two names are equal as not yet
  demangled and strips ``<...>`` from it, which would blank ``<module>``.
  ``start_line`` is where the function is defined (``Frame.start_line``);
  the Location's Line holds the line running (``Frame.line``).
- Native frames belong to a Mapping, one per distinct file (the shared
  library), as native code does in pprof; a frame named by its address
  (``0x7f15…``) also gets ``Location.address``, and still a Line and a
  Function of that name: without one, pprof and Grafana would show the
  mapping's name instead of the AKS guide's raw address.
- ``profile.timeline`` (memory over time) has no pprof field: it is written as
  one extra ``comment`` (:mod:`gpuflame.model.timeline`), which the reader
  takes back out of the comments; a damaged one becomes a plain note. So is
  ``profile.peaks``, what the peak values are (:mod:`gpuflame.model.peak`), and
  ``profile.phases``, the per-phase table (:mod:`gpuflame.model.phases`).
- Labels are string labels. Values are int64 (diffs are negative).
- gzip level 1, as Go's runtime/pprof writes it: level 6 costs several times the
  time for a few percent of size. The gzip mtime is 0 so output is
  reproducible.

Reading (:func:`decode`) accepts gzip or raw protobuf, and files from Go's
pprof, py-spy and Pyroscope; only the fields above are read (drop/keep
frames, doc_url and the rest of Mapping are ignored).

- A Location with several Lines is inlined code: it becomes several frames,
  ``Line[0]`` the innermost (leaf-most).
- A Location with no Line is native code named by its address
  (``symbols.names.native_address_name``), with the Mapping's file.
- Frame kinds are not stored in pprof; they are derived by :func:`frame_kind`
  from the name, the file, and whether the Location has a Mapping (a frame
  with no file inside a Mapping is native code). A frame whose kind disagrees
  with that rule (a rare hand-made case) comes back with the derived kind.
- Numeric labels become strings (``Label.num`` -> ``"123"``; the unit is
  dropped). A label with neither string nor number is kept as ``""``.
- Each sample must carry one value per sample type; a location id, function
  id, mapping id or string index that does not exist is an error.
"""

from __future__ import annotations

import gzip
import struct
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from itertools import chain
from operator import itemgetter
from typing import Any, NamedTuple

from gpuflame import limits
from gpuflame.errors import GpuflameError, ProfileFormatError
from gpuflame.formats.load_save import GZIP_MAGIC, gunzip
from gpuflame.formats.protobuf_wire import (
    FIXED32,
    FIXED64,
    LEN,
    VARINT,
    VARINT_RUN,
    VarintCache,
    VarintMemo,
    decode_varint_bytes,
    encode_varint,
    field_bytes,
    field_packed,
    field_string,
    field_varint,
    iter_fields,
    read_string,
    read_varint,
    split_packed,
    tag,
    to_int64,
)
from gpuflame.gcpause import gc_paused
from gpuflame.model import history, peak, phases
from gpuflame.model.comments import InflateBudget
from gpuflame.model.profile import NATIVE, PYTHON, Frame, Labels, Profile, Sample, SampleType
from gpuflame.model.timeline import split_comments
from gpuflame.symbols.kinds import guess_kind
from gpuflame.symbols.names import SEPARATOR, UNKNOWN, native_address_name

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

GZIP_LEVEL = 1
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def frame_kind(name: str, file: str, in_mapping: bool) -> str:
    """The kind a decoded frame gets: :func:`guess_kind`, and fileless frames in a Mapping are native."""
    kind = guess_kind(name, file)
    if kind == PYTHON and in_mapping and not file:
        return NATIVE
    return kind


def system_name(display: str) -> str:
    """``LlamaMLP > forward`` -> ``LlamaMLP.forward`` (pprof's Function.system_name)."""
    return display.replace(SEPARATOR, ".")


# =============================================================================
# encode
# =============================================================================


class _StringTable(dict):
    """``str -> index`` in pprof's string table, adding strings on first use."""

    def __init__(self) -> None:
        super().__init__()
        self[""] = 0

    def __missing__(self, text: str) -> int:
        index = self[text] = len(self)
        return index

    def encoded(self) -> bytes:
        # dicts keep insertion order, which is index order here
        return b"".join(field_string(P_STRING_TABLE, s) for s in self)


def encode(profile: Profile, period_type: SampleType | None = None) -> bytes:
    """The profile as gzip-compressed pprof (``*.pb.gz``).

    *period_type* replaces the default (the first sample type): Pyroscope
    builds its profile type ids from it (``gpu_memory:inuse_space:bytes:space:bytes``).
    Raises :class:`GpuflameError` when a value or line number does not fit
    in pprof's 64-bit integers.
    """
    try:
        raw = encode_raw(profile, period_type)
    except ValueError as exc:
        raise GpuflameError(f"cannot write pprof: {exc}") from None
    return gzip.compress(raw, compresslevel=GZIP_LEVEL, mtime=0)


def encode_raw(profile: Profile, period_type_override: SampleType | None = None) -> bytes:
    """The profile as an uncompressed ``perftools.profiles.Profile`` message."""
    strings = _StringTable()
    varints = VarintCache()
    parts: list[bytes] = [_value_type(P_SAMPLE_TYPE, st, strings) for st in profile.sample_types]
    parts += _encode_samples(profile, strings, varints)
    mappings, locations, functions = _encode_frames(profile.frames, strings)
    parts += mappings
    parts += locations
    parts += functions
    stored = profile.comments + ([profile.timeline.to_comment()] if profile.timeline else [])
    stored += [peak.to_comment(profile.peaks)] if profile.peaks else []
    stored += [phases.to_comment(profile.phases)] if profile.phases else []
    stored += [profile.history.to_comment()] if profile.history is not None and profile.history.tracks else []
    comments = [strings[c] for c in stored]
    default = strings[profile.default_type] if profile.default_type else 0
    period = period_type_override or (profile.sample_types[0] if profile.sample_types else None)
    period_type = _value_type(P_PERIOD_TYPE, period, strings) if period else b""
    parts.append(strings.encoded())
    parts.append(field_varint(P_TIME_NANOS, _check_int64(profile.time_nanos, "time_nanos")))
    parts.append(field_varint(P_DURATION_NANOS, _check_int64(profile.duration_nanos, "duration_nanos")))
    parts.append(period_type)
    if profile.sample_types:
        parts.append(field_varint(P_PERIOD, 1))
    # repeated: every entry is written, the empty string (index 0) too
    parts += [tag(P_COMMENT, VARINT) + varints[c] for c in comments]
    parts.append(field_varint(P_DEFAULT_SAMPLE_TYPE, default))
    return b"".join(parts)


def _value_type(field: int, st: SampleType, strings: _StringTable) -> bytes:
    return field_bytes(field, field_varint(1, strings[st.type]) + field_varint(2, strings[st.unit]))


def _encode_samples(profile: Profile, strings: _StringTable, varints: VarintCache) -> list[bytes]:
    """One ``sample`` field per sample; the hot loop of writing, kept to dict lookups and joins."""
    base = location_id_base(len(profile.frames))
    location_ids = [varints[i + base] for i in range(len(profile.frames))]
    tails: dict[tuple[tuple[int, ...], Labels], bytes] = {}
    out: list[bytes] = []
    append = out.append
    join = b"".join
    for sample in profile.samples:
        key = (sample.values, sample.labels)
        tail = tails.get(key)
        if tail is None:
            tail = tails[key] = _sample_tail(sample, strings, varints)
        if sample.stack:
            ids = join(map(location_ids.__getitem__, sample.stack))
            body = join((b"\x0a", varints[len(ids)], ids, tail))
        else:
            body = tail
        append(join((b"\x12", varints[len(body)], body)))
    return out


def _sample_tail(sample: Sample, strings: _StringTable, varints: VarintCache) -> bytes:
    """A sample's values and labels, which many samples share."""
    labels = b"".join(
        field_bytes(3, field_varint(1, strings[k]) + field_varint(2, strings[v])) for k, v in sample.labels
    )
    for v in sample.values:
        _check_int64(v, "a sample value")
    return field_packed(2, sample.values, varints) + labels


def _check_int64(value: int, what: str) -> int:
    """pprof stores values, lines and times as int64; anything wider would come back wrong."""
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise ValueError(f"{what} ({value}) does not fit in int64")
    return value


def _encode_frames(
    frames: list[Frame], strings: _StringTable
) -> tuple[list[bytes], list[bytes], list[bytes]]:
    """Mapping, Location and Function messages for the frame table."""
    base = location_id_base(len(frames))
    mapping_ids: dict[str, int] = {}
    function_ids: dict[tuple[str, str, str, int], int] = {}
    mappings: list[bytes] = []
    functions: list[bytes] = []
    locations: list[bytes] = []
    for index, frame in enumerate(frames):
        mapping_id = 0
        if frame.kind == NATIVE:
            mapping_id = mapping_ids.get(frame.file, 0)
            if not mapping_id:
                mapping_id = mapping_ids[frame.file] = len(mapping_ids) + 1
                mappings.append(_mapping(mapping_id, frame.file, strings))
        loc = field_varint(1, index + base) + field_varint(2, mapping_id)
        address = _address(frame.name) if frame.kind == NATIVE else None
        if address is not None:
            loc += field_varint(3, address)
        dotted = system_name(frame.name)
        # pprof "demangles" a Function whose system_name equals its name and blanks
        # names in angle brackets (<module>); an empty system_name tells it not to
        start = _check_int64(frame.start_line, "a line number")
        key = (frame.name, dotted if dotted != frame.name else "", frame.file, start)
        fid = function_ids.get(key)
        if fid is None:
            fid = function_ids[key] = len(function_ids) + 1
            functions.append(_function(fid, key, strings))
        line = _check_int64(frame.line, "a line number")
        loc += field_bytes(4, field_varint(1, fid) + field_varint(2, line))
        locations.append(field_bytes(P_LOCATION, loc))
    return mappings, locations, functions


def location_id_base(n_frames: int) -> int:
    """The id of the first Location: chosen so that every location id has the same varint width.

    Ids 1..127 take one byte, 128..16383 two, and so on; starting at 128 once
    a profile has more than 127 frames makes every id in a stack two bytes
    long, which :func:`decode` reads in one C call instead of varint by varint.
    """
    base = 1
    while base + n_frames > base * 128:
        base *= 128
    return base


def _address(name: str) -> int | None:
    """The address a native frame is named after (``0x7f15…``), if its name is exactly one."""
    if not name.startswith("0x") or len(name) > 18:
        return None
    try:
        value = int(name, 16)
    except ValueError:
        return None
    return value if native_address_name(value) == name else None


def _mapping(mapping_id: int, filename: str, strings: _StringTable) -> bytes:
    # has_functions (7) tells pprof not to try to symbolize: there is nothing more to find
    body = field_varint(1, mapping_id) + field_varint(5, strings[filename]) + field_varint(7, 1)
    return field_bytes(P_MAPPING, body)


def _function(fid: int, key: tuple[str, str, str, int], strings: _StringTable) -> bytes:
    name, sysname, filename, start_line = key
    body = (
        field_varint(1, fid)
        + field_varint(2, strings[name])
        + field_varint(3, strings[sysname])
        + field_varint(4, strings[filename])
    )
    if start_line:
        body += field_varint(5, start_line)
    return field_bytes(P_FUNCTION, body)


# =============================================================================
# decode
# =============================================================================


class _Raw(NamedTuple):
    """The top-level fields of a Profile message, sub-messages still as bytes."""

    sample_types: list[bytes]
    samples: list[bytes]
    mappings: list[bytes]
    locations: list[bytes]
    functions: list[bytes]
    strings: list[bytes]
    comments: list[int]
    scalars: dict[int, int]


def decode(data: bytes) -> Profile:
    """Read gzip-compressed or raw pprof."""
    if not isinstance(data, bytes):  # slices of a bytearray would not hash in the memos
        data = bytes(data)
    if data[:2] == GZIP_MAGIC:
        data = gunzip(data)
    with gc_paused():
        return _decode_raw(data)


def _decode_raw(data: bytes) -> Profile:
    raw = _split_profile(data)
    strings = _Strings(raw.strings)
    profile = Profile(sample_types=[_read_value_type(b, strings) for b in raw.sample_types])
    budget = InflateBudget()
    profile.timeline, comments = split_comments([strings.get(i, "comment") for i in raw.comments], budget)
    profile.peaks, comments = peak.split_comments(comments)
    profile.phases, comments = phases.split_comments(comments)
    profile.history, profile.comments = history.split_comments(comments, budget)
    default = strings.get(raw.scalars.get(P_DEFAULT_SAMPLE_TYPE, 0), "default_sample_type")
    profile.default_type = default or None
    profile.time_nanos = to_int64(raw.scalars.get(P_TIME_NANOS, 0))
    profile.duration_nanos = to_int64(raw.scalars.get(P_DURATION_NANOS, 0))
    location_frames = _read_locations(raw, strings, profile)
    profile.samples = _read_samples(raw.samples, location_frames, strings, len(profile.sample_types))
    return profile


_CHECK_EVERY = 16 << 20  # bytes of pprof split between two checks of the tables' sizes


def _check_counts(raw: _Raw) -> None:
    """The tables' sizes against :mod:`gpuflame.limits`, before any entry becomes an object."""
    if len(raw.samples) > limits.SAMPLES.value():
        raise limits.SAMPLES.exceeded("pprof: the samples")
    tables = (("locations", raw.locations), ("functions", raw.functions),
              ("mappings", raw.mappings), ("strings", raw.strings))
    for name, table in tables:
        if len(table) > limits.FRAMES.value():
            raise limits.FRAMES.exceeded(f"pprof: the {name}")
    if len(raw.comments) > limits.COMMENTS.value():
        raise limits.COMMENTS.exceeded("pprof: the comments")


def _split_profile(data: bytes) -> _Raw:
    """One pass over the top-level message, collecting each field's values.

    Written out instead of using :func:`iter_fields` because a large profile
    has hundreds of thousands of ``sample`` fields; one-byte keys and
    lengths, the common case, are read inline. The tables' sizes are checked
    after each :data:`_CHECK_EVERY` bytes (no cost per field), so a hostile
    file stops before its fields become more than a window's worth of slices.
    """
    raw = _Raw([], [], [], [], [], [], [], {})
    by_field: dict[int, list[bytes]] = {
        P_SAMPLE_TYPE: raw.sample_types,
        P_SAMPLE: raw.samples,
        P_MAPPING: raw.mappings,
        P_LOCATION: raw.locations,
        P_FUNCTION: raw.functions,
        P_STRING_TABLE: raw.strings,
    }
    pos = 0
    end = len(data)
    try:
        while pos < end:
            window = min(end, pos + _CHECK_EVERY)  # the counts are checked once per window
            while pos < window:
                key = data[pos]
                if key < 0x80:
                    pos += 1
                else:
                    key, pos = read_varint(data, pos)
                field = key >> 3
                wire = key & 7
                if field == 0:
                    raise ProfileFormatError("malformed protobuf: field number 0")
                if wire == LEN:
                    size = data[pos]
                    if size < 0x80:
                        pos += 1
                    else:
                        size, pos = read_varint(data, pos)
                    stop = pos + size
                    if stop > end:
                        raise ProfileFormatError(
                            f"truncated protobuf: field {field} runs past the end of the data"
                        )
                    target = by_field.get(field)
                    if target is not None:
                        target.append(data[pos:stop])
                    elif field == P_COMMENT:  # packed repeated int64, at most 10 bytes each
                        if size > 10 * limits.COMMENTS.value():
                            raise limits.COMMENTS.exceeded("pprof: the comments")
                        raw.comments.extend(_packed_ints(data[pos:stop], field))
                    pos = stop
                else:
                    pos = _read_scalar(data, pos, field, wire, raw)
            _check_counts(raw)
    except IndexError:
        raise ProfileFormatError("truncated protobuf: a field runs past the end of the data") from None
    return raw


def _read_scalar(data: bytes, pos: int, field: int, wire: int, raw: _Raw) -> int:
    """Read a non-length-delimited top-level field: keep the ones gpuflame uses, step over the rest."""
    if wire == VARINT:
        value, pos = read_varint(data, pos)
        if field == P_COMMENT:
            raw.comments.append(value)
        else:
            raw.scalars[field] = value
        return pos
    if wire == FIXED64 or wire == FIXED32:
        width = 8 if wire == FIXED64 else 4
        if pos + width > len(data):
            raise ProfileFormatError(f"truncated protobuf: field {field} runs past the end of the data")
        return pos + width
    if wire in (3, 4):
        raise ProfileFormatError(f"unsupported protobuf: field {field} uses groups (wire type {wire})")
    raise ProfileFormatError(f"malformed protobuf: field {field} has invalid wire type {wire}")


def _packed_ints(chunk: bytes, field: int) -> list[int]:
    memo = VarintMemo()
    return [memo[k] for k in split_packed(chunk, field)]


class _Strings:
    """The string table, decoded lazily, with plain errors for bad indices."""

    def __init__(self, raw: list[bytes]) -> None:
        if raw and raw[0]:
            raise ProfileFormatError("malformed pprof: string_table[0] must be the empty string")
        self._raw = raw
        self._cache: dict[int, str] = {0: ""}

    def get(self, index: int, what: str) -> str:
        text = self._cache.get(index)
        if text is None:
            if not 0 <= index < len(self._raw):
                raise ProfileFormatError(
                    f"malformed pprof: {what} refers to string {index}, "
                    f"but the string table has {len(self._raw)} entries"
                )
            text = self._cache[index] = read_string(self._raw[index])
        return text


def _fields(data: bytes) -> dict[int, list[int | bytes]]:
    """All fields of a small sub-message, by number."""
    out: dict[int, list[int | bytes]] = {}
    for field, _wire, value in iter_fields(data):
        out.setdefault(field, []).append(value)
    return out


def _int(fields: dict[int, list[int | bytes]], number: int, what: str) -> int:
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


def _read_value_type(data: bytes, strings: _Strings) -> SampleType:
    f = _fields(data)
    return SampleType(
        strings.get(_int(f, 1, "sample type"), "a sample type"),
        strings.get(_int(f, 2, "sample type"), "a sample type's unit"),
    )


def _read_mappings(raw: _Raw, strings: _Strings) -> dict[int, str]:
    out: dict[int, str] = {}
    for data in raw.mappings:
        f = _fields(data)
        mid = _int(f, 1, "mapping")
        if mid == 0:
            raise ProfileFormatError("malformed pprof: a mapping has id 0")
        out[mid] = strings.get(_int(f, 5, "mapping"), f"mapping {mid}'s file name")
    return out


def _table_id(f: dict[int, list[int | bytes]], what: str, seen: Mapping[int, object]) -> int:
    """A table entry's id (field 1): never 0, and not already in its table."""
    entry_id = _int(f, 1, what)
    if entry_id == 0:
        raise ProfileFormatError(f"malformed pprof: a {what} has id 0")
    if entry_id in seen:
        raise ProfileFormatError(f"malformed pprof: {what} id {entry_id} appears twice")
    return entry_id


def _read_functions(raw: _Raw, strings: _Strings) -> dict[int, tuple[str, str, int]]:
    """Function id -> (name, file, start_line); the name falls back to system_name."""
    out: dict[int, tuple[str, str, int]] = {}
    for data in raw.functions:
        f = _fields(data)
        fid = _table_id(f, "function", out)
        name = strings.get(_int(f, 2, "function"), f"function {fid}'s name")
        if not name:
            name = strings.get(_int(f, 3, "function"), f"function {fid}'s system name")
        file = strings.get(_int(f, 4, "function"), f"function {fid}'s file name")
        out[fid] = (name, file, max(0, to_int64(_int(f, 5, "function"))))
    return out


def _read_locations(raw: _Raw, strings: _Strings, profile: Profile) -> dict[int, tuple[int, ...]]:
    """Location id -> frame ids (leaf first), adding the frames to *profile*."""
    mappings = _read_mappings(raw, strings)
    functions = _read_functions(raw, strings)
    out: dict[int, tuple[int, ...]] = {}
    for data in raw.locations:
        f = _fields(data)
        lid = _table_id(f, "location", out)
        mid = _int(f, 2, "location")
        if mid and mid not in mappings:
            raise ProfileFormatError(
                f"malformed pprof: location {lid} refers to mapping {mid}, which does not exist"
            )
        address = _int(f, 3, "location")
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
    f = _fields(data)
    fid = _int(f, 1, "line")
    line = to_int64(_int(f, 2, "line"))
    start = 0
    if fid == 0:
        name, file = (native_address_name(address) if address else UNKNOWN), ""
    elif fid in functions:
        name, file, start = functions[fid]
    else:
        raise ProfileFormatError(
            f"malformed pprof: location {lid} refers to function {fid}, which does not exist"
        )
    if not name:
        name = native_address_name(address) if address else UNKNOWN
    return Frame(name, file, line, frame_kind(name, file, bool(mapping_id)), start)


class _LocationMemo(dict):
    """``location id (varint bytes or int) -> frame id(s)``: the inner lookup of every stack."""

    def __init__(self, frames_of: dict[int, tuple[int, ...]], flat: bool) -> None:
        super().__init__()
        self._frames_of = frames_of
        self._flat = flat

    def __missing__(self, key: bytes | int) -> int | tuple[int, ...]:
        lid = key if isinstance(key, int) else decode_varint_bytes(key)
        frames = self._frames_of.get(lid)
        if frames is None:
            raise ProfileFormatError(
                f"malformed pprof: a sample refers to location {lid}, which does not exist"
            )
        value = frames[0] if self._flat else frames
        self[key] = value
        return value


class _TailMemo(dict):
    """``bytes after a sample's location ids -> (values, labels)``.

    Samples share values and labels far more often than not, so each distinct
    tail is parsed once. A tail that holds more location ids maps to None and
    the sample is parsed the slow way.
    """

    def __init__(self, strings: _Strings, n_types: int) -> None:
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
        for field, wire, value in iter_fields(data):
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
                f"malformed pprof: a sample has {len(values)} values "
                f"but the profile has {self._n_types} sample types"
            )
        return ids, tuple(values), tuple(sorted(labels))

    def _label(self, data: bytes) -> tuple[str, str]:
        pair = self._labels.get(data)
        if pair is None:
            f = _fields(data)
            key = self._strings.get(_int(f, 1, "label"), "a label's key")
            str_index = _int(f, 2, "label")
            if str_index:
                text = self._strings.get(str_index, f"label {key!r}'s value")
            elif 3 in f or 4 in f:
                text = str(to_int64(_int(f, 3, "label")))
            else:
                text = ""
            pair = self._labels[data] = (key, text)
        return pair


def _read_samples(
    chunks: list[bytes], location_frames: dict[int, tuple[int, ...]], strings: _Strings, n_types: int
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
    table, tails, words_of, getter, high = reader.table, reader.tails, reader.words_of, itemgetter, _HIGH_BYTES
    out: list[Sample] = []
    append = out.append
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
            append(reader.general(raw, ids, tail))
            continue
        n = len(words)
        if n > max_depth:
            raise limits.STACK_DEPTH.exceeded("pprof: a sample's stack")
        try:
            stack = getter(*words)(table) if n > 1 else (table[words[0]],) if n else ()
        except IndexError:
            stack = (-1,)
        if -1 in stack:
            _raise_missing(words, table)
        append(Sample(stack, tail[0], tail[1]))
    return out


class _SampleReader:
    """What decoding samples needs, built once per profile, and the way for samples off the fast path."""

    def __init__(self, location_frames: dict[int, tuple[int, ...]], strings: _Strings, n_types: int) -> None:
        self.flat = all(len(v) == 1 for v in location_frames.values())
        self.lookup = _LocationMemo(location_frames, self.flat).__getitem__
        self.table = _fast_table(location_frames) if self.flat else None
        self.words_of = _WordUnpackers()
        self.tails = _TailMemo(strings, n_types)
        self.max_depth = limits.STACK_DEPTH.value()

    def general(self, raw: bytes, ids: bytes, tail: tuple[tuple[int, ...], Labels] | None) -> Sample:
        """Fields in another order (*tail* None: parse it all), ids of mixed widths, locations of many frames."""
        keys: Sequence[bytes | int]  # location ids: bytes of one-byte varints, or each id's varint
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
        return Sample(stack, values, labels)


class _WordUnpackers(dict):
    """``byte length -> Struct.unpack`` reading that many bytes as native 16-bit words."""

    def __missing__(self, size: int) -> Callable[[bytes], tuple[int, ...]]:
        unpack = self[size] = struct.Struct(f"={size // 2}H").unpack
        return unpack


_HIGH_BYTES = bytes(range(0x80, 0x100))


def _stack(frame_ids: Iterator[Any], flat: bool) -> tuple[int, ...]:
    return tuple(frame_ids) if flat else tuple(chain.from_iterable(frame_ids))


def _fast_table(location_frames: dict[int, tuple[int, ...]]) -> list[int]:
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
            raise ProfileFormatError(
                f"malformed pprof: a sample refers to location {lid}, which does not exist"
            )
    raise ProfileFormatError("malformed pprof: a sample refers to a location that does not exist")
