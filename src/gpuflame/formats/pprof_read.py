"""Reading pprof (:func:`decode`) through the ``protobuf`` runtime; the mapping is :mod:`gpuflame.formats.pprof`'s.

The file is parsed by the runtime as a ``SplitProfile``
(:mod:`gpuflame.formats.pprof_proto`): pprof's Profile with each Sample,
string, Function and Location kept as its bytes. Sizes are checked before
parsing (the inflated bytes, :data:`gpuflame.limits.INFLATED_BYTES`), the
tables' counts after, before any entry becomes an object; the Functions and
Locations are parsed as columns by :mod:`gpuflame.formats.pprof_table_columns`,
the samples read by :mod:`gpuflame.formats.pprof_samples`.

The profiled process reads one kind of pprof, JAX's device-memory profile,
and must not import the runtime: ``standard_library=True`` parses with
:mod:`gpuflame.formats.pprof_stdlib_parse` instead, into the same shapes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from gpuflame import limits
from gpuflame.errors import ProfileFormatError
from gpuflame.formats.gzip_io import GZIP_MAGIC, gunzip
from gpuflame.formats.pprof_samples import SampleBytes, read_sample_columns, read_samples
from gpuflame.formats.pprof_tables import Strings, Tables, read_locations, read_value_type, tables_of
from gpuflame.gcpause import gc_paused
from gpuflame.model import history, peak, phases, processes
from gpuflame.model.comments import InflateBudget
from gpuflame.model.profile import Profile
from gpuflame.model.timeline import split_comments


class Parser(NamedTuple):
    """Bytes -> the runtime's ``SplitProfile`` and ``Sample`` (or objects of the same shape); the tables' columns."""

    profile: Callable[[bytes], Any]
    sample: Callable[[bytes], Any]
    tables: Callable[[Any], Tables]  # the parsed profile's Functions and Locations


def runtime_parser() -> Parser:
    """The ``protobuf`` runtime's parse, its errors as :class:`ProfileFormatError`."""
    from google.protobuf.message import DecodeError

    from gpuflame.formats.pprof_proto.split_profile_pb2 import Sample, SplitProfile
    from gpuflame.formats.pprof_table_columns import read_tables

    def parser(message: Any, what: str) -> Callable[[bytes], Any]:
        def parse(data: bytes) -> Any:
            try:
                return message.FromString(data)
            except DecodeError:
                raise ProfileFormatError(f"malformed pprof: {what} (cut short or corrupt)") from None

        return parse

    return Parser(
        parser(SplitProfile, "the data is not a protobuf Profile message"),
        parser(Sample, "a sample is not a protobuf Sample message"),
        lambda split: read_tables(split.function, split.location),
    )


def standard_library_parser() -> Parser:
    """The profiled process's parse (:mod:`gpuflame.formats.pprof_stdlib_parse`): no runtime imported."""
    from gpuflame.formats import pprof_stdlib_parse

    return Parser(
        pprof_stdlib_parse.parse_profile,
        pprof_stdlib_parse.parse_sample,
        lambda split: tables_of(split.function, split.location),
    )


def decode(data: bytes, *, standard_library: bool = False) -> Profile:
    """Read gzip-compressed or raw pprof; with *standard_library*, without the ``protobuf`` runtime."""
    parser = standard_library_parser() if standard_library else runtime_parser()
    if data[:2] == GZIP_MAGIC:
        data = gunzip(data)  # bounded by INFLATED_BYTES as it inflates
    elif len(data) > limits.INFLATED_BYTES.value():
        raise limits.INFLATED_BYTES.exceeded("the pprof data")
    _check_key_bytes(data)
    with gc_paused():
        split = parser.profile(data)
        _check_counts(split)
        del data  # the inflated bytes: parsed now
        strings = Strings(list(split.string_table))
        profile = _header(split, strings)
        location_frames = read_locations(split, parser.tables(split), strings, profile)
        samples = SampleBytes(split.sample)
        del split  # the parsed tables and the samples' first copy
        return _with_samples(profile, samples, location_frames, strings, parser.sample)


# A table's entries each start with its key byte (field << 3 | 2), so the count of that byte in the file
# bounds the count of entries; the parse makes an object of 16-40 bytes of each (two bytes of file can
# be an empty sample). A Location's Lines share its key byte (field 4 in both).
_KEY_BYTES = (
    (b"\x12", limits.SAMPLES, "samples"),
    (b"\x22", limits.FRAMES, "locations and their lines"),
    (b"\x2a", limits.FRAMES, "functions"),
    (b"\x32", limits.FRAMES, "strings"),
)


_NOT_KEYS = bytes(b for b in range(256) if bytes((b,)) not in {key for key, _, _ in _KEY_BYTES})
_KEY_WINDOW = 16 << 20  # bytes of file whose key bytes are counted at once: bounds the copy


def _check_key_bytes(data: bytes) -> None:
    """Before the parse: the tables' counts at most (their key bytes, one C count each) against the limits.

    Only a file near a limit has as many key bytes (a genuine 2M-sample file has about 2.3M of the
    samples' key byte), and a hostile one of empty samples stops here, not after the parse has made
    half a billion objects.
    """
    if len(data) < 2 * min(limit.value() for _, limit, _ in _KEY_BYTES):
        return  # too short to hold more of any table than its limit allows (two bytes an entry at least)
    counts = [0] * len(_KEY_BYTES)
    for start in range(0, len(data), _KEY_WINDOW):  # every other byte deleted (one C pass), then counted
        keys = data[start : start + _KEY_WINDOW].translate(None, _NOT_KEYS)
        for i, (key, _, _) in enumerate(_KEY_BYTES):
            counts[i] += keys.count(key)
    for count, (_, limit, name) in zip(counts, _KEY_BYTES, strict=True):
        if count > limit.value():
            raise limit.exceeded(f"pprof: the {name} (counted by their key bytes, before parsing)")


def _check_counts(split: Any) -> None:
    """The tables' sizes against :mod:`gpuflame.limits`, before any entry becomes an object."""
    if len(split.sample) > limits.SAMPLES.value():
        raise limits.SAMPLES.exceeded("pprof: the samples")
    tables = (
        ("locations", split.location),
        ("functions", split.function),
        ("mappings", split.mapping),
        ("strings", split.string_table),
    )
    for name, table in tables:
        if len(table) > limits.FRAMES.value():
            raise limits.FRAMES.exceeded(f"pprof: the {name}")
    if len(split.comment) + len(split.gpuflame_data) > limits.COMMENTS.value():
        raise limits.COMMENTS.exceeded("pprof: the comments and gpuflame's data entries")


UNREAD_DATA_NOTE = "gpuflame: this file holds data of a later gpuflame version that this one does not read"


def _header(split: Any, strings: Strings) -> Profile:
    """A profile of the file's sample types, comments, gpuflame's data and times.

    gpuflame's data is read from its own field and, as files written before that field held it,
    from the comments; both go through the same split, under one budget.
    """
    profile = Profile(sample_types=[read_value_type(vt, strings) for vt in split.sample_type])
    budget = InflateBudget()
    data = [entry.decode("utf-8", "replace") for entry in split.gpuflame_data]
    comments = [strings.get(i, "comment") for i in split.comment] + data
    profile.timeline, comments = split_comments(comments, budget)
    profile.peaks, comments = peak.split_comments(comments)
    profile.phases, comments = phases.split_comments(comments)
    profile.processes, comments = processes.split_comments(comments)
    profile.history, comments = history.split_comments(comments, budget)
    unread = set(data)  # data of a later gpuflame, which this one does not read: not shown as a comment
    profile.comments = [c for c in comments if c not in unread]
    if len(profile.comments) < len(comments):
        profile.comments.append(UNREAD_DATA_NOTE)
    profile.default_type = strings.get(split.default_sample_type, "default_sample_type") or None
    profile.time_nanos = split.time_nanos
    profile.duration_nanos = split.duration_nanos
    return profile


def _with_samples(
    profile: Profile,
    samples: SampleBytes,
    location_frames: Mapping[int, tuple[int, ...]],
    strings: Strings,
    parse: Callable[[bytes], Any],
) -> Profile:
    """*profile* with its samples: columns for a large file in the usual layout, else a list."""
    n_types = len(profile.sample_types)
    columns = read_sample_columns(samples, location_frames, strings, n_types, parse)
    if columns is not None:  # a large profile: its samples stay arrays until something asks for them
        if len(columns.frames) > limits.STACK_FRAMES.value():  # 4 bytes each here, 8 once they are tuples
            raise limits.STACK_FRAMES.exceeded("pprof: the count of frames in all the samples' stacks")
        profile.set_columns(columns)
    else:
        profile.samples = read_samples(samples.chunks(), location_frames, strings, n_types, parse)
    return profile
