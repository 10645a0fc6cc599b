"""gzip pprof (``profile.proto``), gpuflame's native on-disk format, in pure Python.

Writing (:func:`encode`) maps the model onto pprof like this:

- ``string_table[0]`` is ``""``; every other string is stored once.
- ``sample_type`` from ``profile.sample_types``; ``default_sample_type``,
  ``comment``, ``time_nanos`` and ``duration_nanos`` from the fields of the
  same names (gpuflame's own data aside, below). ``period_type`` is the first
  sample type and ``period`` is 1: gpuflame records every allocation, it does
  not sample.
- One Location per frame, ``Location.id = frame index + base``, with one Line
  ``{function_id, line = frame.line}``. ``base`` is 1 for up to 127 frames,
  else 128 (up to 16256 frames), 16384, ...: every id then has the same
  varint width (:func:`location_id_base`): gpuflame's files have kept this
  layout since an earlier reader used it, and stay byte for byte the same.
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
  one prefixed text (:mod:`gpuflame.model.timeline`) in field 1000 of Profile,
  ``gpuflame_data``, which pprof does not define (``pprof_proto/split_profile.proto``):
  Go's pprof and Pyroscope skip it, where they would print a comment. So are
  ``profile.peaks``, what the peak values are (:mod:`gpuflame.model.peak`),
  ``profile.phases``, the per-phase table (:mod:`gpuflame.model.phases`), the
  processes and the event history. The reader takes them back out of that
  field and, for files written before it, of the comments; a damaged one
  becomes a plain note. Comments hold only notes for people.
- Labels are string labels. Values are int64 (diffs are negative).
- gzip level 1, as Go's runtime/pprof writes it: level 6 costs several times the
  time for a few percent of size. The gzip mtime is 0 so output is
  reproducible.

Reading (:func:`decode`, :mod:`gpuflame.formats.pprof_read`) goes through
the ``protobuf`` runtime, on the launcher side; the profiled process reads
JAX's pprof with the standard library (:func:`decode_in_process`). It
accepts gzip or raw protobuf, and files from Go's pprof, py-spy and
Pyroscope; only the fields above are read (drop/keep frames, doc_url and
the rest of Mapping are ignored; unknown fields are skipped).

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

from gpuflame.errors import GpuflameError
from gpuflame.formats.pprof_fields import (  # noqa: F401 - frame_kind: the rule, named with the format
    P_COMMENT,
    P_DEFAULT_SAMPLE_TYPE,
    P_DURATION_NANOS,
    P_FUNCTION,
    P_GPUFLAME_DATA,
    P_LOCATION,
    P_MAPPING,
    P_PERIOD,
    P_PERIOD_TYPE,
    P_SAMPLE_TYPE,
    P_STRING_TABLE,
    P_TIME_NANOS,
    frame_kind,
)
from gpuflame.formats.protobuf_encode import (
    VARINT,
    VarintCache,
    field_bytes,
    field_packed,
    field_string,
    field_varint,
    tag,
)
from gpuflame.model import peak, phases, processes
from gpuflame.model.profile import NATIVE, Frame, Labels, Profile, Sample, SampleType
from gpuflame.symbols.names import SEPARATOR, native_address_name

GZIP_LEVEL = 1
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


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
    comments = [strings[c] for c in profile.comments]
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
    parts += [field_string(P_GPUFLAME_DATA, entry) for entry in data_entries(profile)]
    return b"".join(parts)


def data_entries(profile: Profile) -> list[str]:
    """gpuflame's own data, one prefixed text each (:mod:`gpuflame.model.comments`): field
    :data:`P_GPUFLAME_DATA`, which pprof does not define, so `go tool pprof` neither prints nor keeps it."""
    entries = [profile.timeline.to_comment()] if profile.timeline else []
    entries += [peak.to_comment(profile.peaks)] if profile.peaks else []
    entries += [phases.to_comment(profile.phases)] if profile.phases else []
    entries += [processes.to_comment(profile.processes)] if profile.processes else []
    entries += [profile.history.to_comment()] if profile.history is not None and profile.history.tracks else []
    return entries


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


def _encode_frames(frames: list[Frame], strings: _StringTable) -> tuple[list[bytes], list[bytes], list[bytes]]:
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
    long (the layout an earlier reader read in one C call; kept, so files stay the same).
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


def decode(data: bytes) -> Profile:
    """Read gzip-compressed or raw pprof (:mod:`gpuflame.formats.pprof_read`).

    Imported when called: the reader uses numpy for large tables, and the
    profiled process imports this module to write.
    """
    from gpuflame.formats.pprof_read import decode as read

    return read(data)


def decode_in_process(data: bytes) -> Profile:
    """:func:`decode` for the profiled process (JAX's device-memory profiles): the standard library only."""
    from gpuflame.formats.pprof_read import decode as read

    return read(data, standard_library=True)
