"""Reading pprof (:func:`decode`), the reading half of :mod:`gpuflame.formats.pprof` (whose docstring maps it).

Large tables (a million Functions and Locations, a million samples) are
read in bulk with numpy (:mod:`gpuflame.formats.protobuf_bulk`) where the
message-by-message reading would give the same answer; everything else,
and every error, goes message by message. Every table's size is checked
against :mod:`gpuflame.limits` before its entries become objects.
"""

from __future__ import annotations

from collections.abc import Callable

from gpuflame import limits
from gpuflame.errors import ProfileFormatError
from gpuflame.formats.gzip_io import GZIP_MAGIC, gunzip
from gpuflame.formats.pprof_raw import (
    P_COMMENT,
    P_DEFAULT_SAMPLE_TYPE,
    P_DURATION_NANOS,
    P_FUNCTION,
    P_LOCATION,
    P_MAPPING,
    P_SAMPLE,
    P_SAMPLE_TYPE,
    P_STRING_TABLE,
    P_TIME_NANOS,
    RawProfile,
    Strings,
)
from gpuflame.formats.pprof_samples import read_sample_columns, read_samples
from gpuflame.formats.pprof_tables import read_locations, read_value_type
from gpuflame.formats.protobuf_regions import Regions
from gpuflame.formats.protobuf_wire import (
    FIXED32,
    FIXED64,
    LEN,
    VARINT,
    VarintMemo,
    read_varint,
    split_packed,
    to_int64,
)
from gpuflame.gcpause import gc_paused
from gpuflame.model import history, peak, phases, processes
from gpuflame.model.comments import InflateBudget
from gpuflame.model.profile import Profile
from gpuflame.model.timeline import split_comments


def decode(data: bytes) -> Profile:
    """Read gzip-compressed or raw pprof."""
    if not isinstance(data, bytes):  # slices of a bytearray would not hash in the memos
        data = bytes(data)
    with gc_paused():
        # the tables stay spans of the inflated bytes (a million frames: 225 MB), copied by no split
        return _decode_raw(_split_profile(gunzip(data) if data[:2] == GZIP_MAGIC else data))


def _decode_raw(raw: RawProfile) -> Profile:
    """The profile of a split pprof; each table is let go once read (the next one reuses its memory)."""
    strings = Strings(raw.strings)
    profile = Profile(sample_types=[read_value_type(b, strings) for b in raw.sample_types])
    budget = InflateBudget()
    profile.timeline, comments = split_comments([strings.get(i, "comment") for i in raw.comments], budget)
    profile.peaks, comments = peak.split_comments(comments)
    profile.phases, comments = phases.split_comments(comments)
    profile.processes, comments = processes.split_comments(comments)
    profile.history, profile.comments = history.split_comments(comments, budget)
    default = strings.get(raw.scalars.get(P_DEFAULT_SAMPLE_TYPE, 0), "default_sample_type")
    profile.default_type = default or None
    profile.time_nanos = to_int64(raw.scalars.get(P_TIME_NANOS, 0))
    profile.duration_nanos = to_int64(raw.scalars.get(P_DURATION_NANOS, 0))
    location_frames = read_locations(raw, strings, profile)
    for table in (raw.functions, raw.locations, raw.mappings):
        table.clear()
    columns = read_sample_columns(raw.samples, location_frames, strings, len(profile.sample_types))
    if columns is not None:  # a large profile: its samples stay arrays until something asks for them
        if len(columns.frames) > limits.STACK_FRAMES.value():  # 4 bytes each here, 8 once they are tuples
            raise limits.STACK_FRAMES.exceeded("pprof: the count of frames in all the samples' stacks")
        profile.set_columns(columns)
    else:
        profile.samples = read_samples(raw.samples, location_frames, strings, len(profile.sample_types))
    return profile


_CHECK_EVERY = 16 << 20  # bytes of pprof split between two checks of the tables' sizes


def _check_counts(raw: RawProfile) -> None:
    """The tables' sizes against :mod:`gpuflame.limits`, before any entry becomes an object."""
    if len(raw.samples) > limits.SAMPLES.value():
        raise limits.SAMPLES.exceeded("pprof: the samples")
    tables = (
        ("locations", raw.locations),
        ("functions", raw.functions),
        ("mappings", raw.mappings),
        ("strings", raw.strings),
    )
    for name, table in tables:
        if len(table) > limits.FRAMES.value():
            raise limits.FRAMES.exceeded(f"pprof: the {name}")
    if len(raw.comments) > limits.COMMENTS.value():
        raise limits.COMMENTS.exceeded("pprof: the comments")


def _split_profile(data: bytes) -> RawProfile:
    """One pass over the top-level message, collecting each field's values.

    Written out instead of using :func:`iter_fields` because a large profile
    has hundreds of thousands of ``sample`` fields; one-byte keys and
    lengths, the common case, are read inline. The tables' sizes are checked
    after each :data:`_CHECK_EVERY` bytes (no cost per field), so a hostile
    file stops before its fields become more than a window's worth of spans.
    """
    raw = RawProfile(Regions(data), Regions(data), Regions(data), Regions(data), Regions(data), Regions(data), [], {})
    by_field: dict[int, Regions] = {
        P_SAMPLE_TYPE: raw.sample_types,
        P_SAMPLE: raw.samples,
        P_MAPPING: raw.mappings,
        P_LOCATION: raw.locations,
        P_FUNCTION: raw.functions,
        P_STRING_TABLE: raw.strings,
    }
    pos = 0
    end = len(data)
    run = _run if end < _BULK_BYTES else _bulk_run(data)
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
                        raise ProfileFormatError(f"truncated protobuf: field {field} runs past the end of the data")
                    target = by_field.get(field)
                    if target is not None:
                        target.append(pos, stop)
                        pos = run(data, stop, window, key, target)
                        continue
                    if field == P_COMMENT:  # packed repeated int64, at most 10 bytes each
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


def _run(data: bytes, pos: int, window: int, key: int, target: Regions) -> int:
    """More fields of the same one-byte *key* with sizes of one or two bytes: the bulk of a large profile.

    Returns where the run ends (another key, a longer size, or the window's end).
    """
    if key >= 0x80:
        return pos
    starts, stops = target.starts.append, target.stops.append  # two C calls a field, no Python frame
    end = len(data)
    while pos < window and data[pos] == key:
        size = data[pos + 1]
        start = pos + 2
        if size >= 0x80:
            if start >= end:
                break  # a length cut short: the caller's varint reader says so, as after protobuf_runs
            high = data[start]
            if high >= 0x80:
                break
            size = (size & 0x7F) | (high << 7)
            start += 1
        pos = start + size
        if pos > end:
            raise ProfileFormatError(f"truncated protobuf: field {key >> 3} runs past the end of the data")
        starts(start)
        stops(pos)
    return pos


# Profiles from this size on are split with numpy (:func:`protobuf_runs.field_run`): below it, its import and
# fixed costs outweigh the gain, and the profiled process's own small pprof stays numpy-free.
_BULK_BYTES = 1 << 20
# A run's first bytes are read field by field: most runs of a small table end there, where a
# numpy piece would scan more bytes than the run has (fields of two keys in turn, in a hostile file).
_FIELD_BY_FIELD = 1 << 12


def _bulk_run(data: bytes) -> Callable[[bytes, int, int, int, Regions], int]:
    """:func:`_run` with numpy over *data* once a run is longer than :data:`_FIELD_BY_FIELD` bytes."""
    import numpy as np

    from gpuflame.formats import protobuf_runs

    array = np.frombuffer(data, dtype=np.uint8)

    def run(_data: bytes, pos: int, window: int, key: int, target: Regions) -> int:
        pos = _run(data, pos, min(window, pos + _FIELD_BY_FIELD), key, target)
        if pos < window and pos < len(data) and data[pos] == key:
            starts, stops, pos = protobuf_runs.field_run(array, pos, window, key)
            target.extend(starts.astype(target.typecode).tobytes(), stops.astype(target.typecode).tobytes())
        return pos

    return run


def _read_scalar(data: bytes, pos: int, field: int, wire: int, raw: RawProfile) -> int:
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
