"""The tables of a parsed pprof file: strings, mappings, functions, locations (the frames of a profile).

The ``protobuf`` runtime has parsed them (:mod:`gpuflame.formats.pprof_read`);
here they become frames, with the checks the runtime does not make (an id 0
or twice, an index past a table). The Functions and Locations come as
columns (:class:`Tables`): the runtime's, parsed a chunk at a time
(:mod:`gpuflame.formats.pprof_table_columns`; a million-frame profile has a
million of each), or read from message objects in C loops
(:func:`tables_of`: ``attrgetter`` over pprof_stdlib_parse's objects, or the
runtime's where the columns cannot read a table).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from functools import partial
from itertools import chain, islice
from operator import attrgetter
from typing import TYPE_CHECKING, Any, NamedTuple

from gpuflame.errors import ProfileFormatError
from gpuflame.formats.pprof_fields import frame_kind
from gpuflame.model.profile import PYTHON, Frame, Profile, SampleType
from gpuflame.symbols.kinds import python_file
from gpuflame.symbols.names import TRAMPOLINE_NAME, UNKNOWN, native_address_name

if TYPE_CHECKING:  # or pprof_stdlib_parse's objects of the same shape, in the profiled process
    from gpuflame.formats.pprof_proto.profile_pb2 import ValueType
    from gpuflame.formats.pprof_proto.split_profile_pb2 import SplitProfile

# Tables and samples from this many entries on are read with numpy (:mod:`gpuflame.formats.pprof_bulk`):
# below it, its import and fixed costs outweigh the gain.
BULK_MIN = 4096

_FUNCTION = attrgetter("id", "name", "system_name", "filename", "start_line")
_LOCATION = attrgetter("id", "mapping_id", "address", "line")
_LINE = attrgetter("function_id", "line")


# A column of ints: a tuple (read back from message objects) or a numpy array (pprof_table_columns), which
# becomes Python ints only where a loop reads it, and only for as long (:func:`_ints`).
Column = Any


class Tables(NamedTuple):
    """A file's Functions and Locations, column by column (the field names are pprof's)."""

    function_ids: Column
    names: Column
    system_names: Column
    filenames: Column
    start_lines: Column
    location_ids: Column
    mapping_ids: Column
    addresses: Column
    line_counts: Column  # each Location's count of Lines
    line_functions: Column  # function_id of every Line, Location by Location
    line_numbers: Column  # line of every Line


def _ints(column: Column) -> Sequence[int]:
    """*column* as Python ints: a numpy array's converted (a million ints: 36 MB), a tuple as it is."""
    return column.tolist() if hasattr(column, "tolist") else column


def _all_one(counts: Column) -> bool:
    """Every location has one Line."""
    if hasattr(counts, "all"):
        return bool((counts == 1).all())
    return bool(counts.count(1) == len(counts))


def tables_of(functions: Iterable[Any], locations: Iterable[Any]) -> Tables:
    """:class:`Tables` of Function and Location message objects (the runtime's or pprof_stdlib_parse's)."""
    rows = list(map(_FUNCTION, functions))
    fids, names, system_names, filenames, start_lines = zip(*rows, strict=True) if rows else [()] * 5
    rows = list(map(_LOCATION, locations))
    location_ids, mapping_ids, addresses, line_lists = zip(*rows, strict=True) if rows else [()] * 4
    del rows  # a million locations: the columns alone from here
    lines = list(map(_LINE, chain.from_iterable(line_lists)))
    line_functions, line_numbers = zip(*lines, strict=True) if lines else [(), ()]
    return Tables(
        fids,
        names,
        system_names,
        filenames,
        start_lines,
        location_ids,
        mapping_ids,
        addresses,
        list(map(len, line_lists)),
        line_functions,
        line_numbers,
    )


class Strings:
    """The string table, decoded once, with plain errors for bad indices."""

    def __init__(self, raw: list[bytes]) -> None:
        if raw and raw[0]:
            raise ProfileFormatError("malformed pprof: string_table[0] must be the empty string")
        self._all = _decode_all(raw) if raw else [""]
        self._count = len(raw)

    def get(self, index: int, what: str) -> str:
        if not 0 <= index < self._count and index:
            raise ProfileFormatError(
                f"malformed pprof: {what} refers to string {index}, but the string table has {self._count} entries"
            )
        return self._all[index]

    def __len__(self) -> int:
        return self._count

    def many(self, indices: Sequence[int], what: str) -> list[str]:
        """The strings at *indices* (C loops; :meth:`get` names a bad one)."""
        try:
            if min(indices, default=0) >= 0:
                return list(map(self._all.__getitem__, indices))
        except IndexError:
            pass
        for index in indices:
            self.get(index, what)
        raise AssertionError("unreachable: a bad index is named above")


def _decode_all(raw: list[bytes]) -> list[str]:
    """Every string of the table, invalid UTF-8 replaced.

    One decode of the table joined by NULs, split again, where no string
    holds a NUL and all are valid UTF-8 (a million names: a third of the
    time of a decode each); else one by one.
    """
    joined = b"\0".join(raw)
    if joined.count(0) == len(raw) - 1:
        try:
            return joined.decode("utf-8").split("\0")
        except UnicodeDecodeError:
            pass
    return [b.decode("utf-8", "replace") for b in raw]


def read_value_type(value_type: ValueType, strings: Strings) -> SampleType:
    name = strings.get(value_type.type, "a sample type")
    return SampleType(name, strings.get(value_type.unit, "a sample type's unit"))


def _read_mappings(split: SplitProfile, strings: Strings) -> dict[int, str]:
    out: dict[int, str] = {}
    for mapping in split.mapping:
        mid = mapping.id
        if mid == 0:
            raise ProfileFormatError("malformed pprof: a mapping has id 0")
        out[mid] = strings.get(mapping.filename, f"mapping {mid}'s file name")
    return out


def _check_ids(ids: Column, what: str) -> None:
    """A table's ids (field 1): never 0, never twice."""
    if hasattr(ids, "dtype"):  # a numpy array: checked sorted, in array passes; the ints only to name a bad id
        ordered = ids.copy()
        ordered.sort()
        if not len(ordered) or (ordered[0] != 0 and not (ordered[1:] == ordered[:-1]).any()):
            return
        ids = ids.tolist()
    if 0 in ids:
        raise ProfileFormatError(f"malformed pprof: a {what} has id 0")
    if len(set(ids)) != len(ids):
        seen: set[int] = set()
        twice = next(i for i in ids if i in seen or seen.add(i))  # type: ignore[func-returns-value]
        raise ProfileFormatError(f"malformed pprof: {what} id {twice} appears twice")


def _read_functions(tables: Tables, strings: Strings) -> dict[int, tuple[str, str, int]]:
    """Function id -> (name, file, start_line); the name falls back to system_name."""
    if not len(tables.function_ids):
        return {}
    _check_ids(tables.function_ids, "function")
    fids, name_ix, file_ix = _ints(tables.function_ids), _ints(tables.names), _ints(tables.filenames)
    try:
        names = strings.many(name_ix, "a function's name")
        files = strings.many(file_ix, "a function's file name")
    except ProfileFormatError:
        for fid, name_index, file_index in zip(fids, name_ix, file_ix, strict=True):  # the first bad one
            strings.get(name_index, f"function {fid}'s name")
            strings.get(file_index, f"function {fid}'s file name")
        raise
    del name_ix, file_ix
    for i, name in enumerate(names):
        if not name:
            names[i] = strings.get(int(tables.system_names[i]), f"function {fids[i]}'s system name")
    starts = tables.start_lines  # a negative start_line reads as 0
    starts = starts.clip(0).tolist() if hasattr(starts, "clip") else [max(0, s) for s in starts]
    return dict(zip(fids, zip(names, files, starts, strict=True), strict=True))


def read_locations(
    split: SplitProfile, tables: Tables, strings: Strings, profile: Profile
) -> Mapping[int, tuple[int, ...]]:
    """Location id -> frame ids (leaf first), adding the frames to *profile*; *tables* are *split*'s."""
    mappings = _read_mappings(split, strings)
    functions = _read_functions(tables, strings)
    lids, mids, addresses, counts, line_functions, line_numbers = tables[5:]
    del tables  # the Lines' columns are let go once they are frames
    if not len(lids):
        return {}
    _check_ids(lids, "location")
    frames = None
    if _all_one(counts):
        frames = _one_line_frames(_ints(line_functions), _ints(line_numbers), _ints(mids), mappings, functions)
    if frames is None:
        lines = zip(_ints(line_functions), _ints(line_numbers), strict=True)
        frames = _frames(_ints(lids), _ints(mids), _ints(addresses), _ints(counts), lines, mappings, functions)
    del line_functions, line_numbers, mids, addresses
    frame_ids = profile.frame_ids(frames)
    if len(frame_ids) == len(lids) and len(lids) >= BULK_MIN:
        from gpuflame.formats.pprof_bulk import OneFrameEach  # numpy: only for tables this large

        return OneFrameEach.of(lids, frame_ids)
    out: dict[int, tuple[int, ...]] = {}
    at = 0
    for lid, count in zip(_ints(lids), _ints(counts), strict=True):
        out[lid] = tuple(frame_ids[at : at + (count or 1)])
        at += count or 1
    return out


def _frames(
    lids: Sequence[int],
    mids: Sequence[int],
    addresses: Sequence[int],
    counts: Sequence[int],
    lines: Iterator[tuple[int, int]],
    mappings: dict[int, str],
    functions: dict[int, tuple[str, str, int]],
) -> list[Frame]:
    """Every location's frames, location by location: inlined Lines, no Line, a function 0 or unknown."""
    frame = _FrameMaker(functions)
    frames: list[Frame] = []
    for lid, mid, address, count in zip(lids, mids, addresses, counts, strict=True):
        if mid and mid not in mappings:
            raise ProfileFormatError(f"malformed pprof: location {lid} refers to mapping {mid}, which does not exist")
        if count:
            frames += [frame(fid, line, lid, address, mid) for fid, line in islice(lines, count)]
        else:
            name, file = native_address_name(address), mappings.get(mid, "")
            frames.append(Frame(name, file, 0, frame_kind(name, file, True)))
    return frames


def _one_line_frames(
    line_functions: Sequence[int],
    line_numbers: Sequence[int],
    mids: Sequence[int],
    mappings: dict[int, str],
    functions: dict[int, tuple[str, str, int]],
) -> list[Frame] | None:
    """The frames of locations of one Line each, of known, named functions (every writer's usual table), in C loops.

    None for anything else (a mapping or function not in its table, a nameless function): :func:`_frames` then
    reads each location, and names what is wrong.
    """
    if not set(mids) <= mappings.keys() | {0}:
        return None
    entries = list(map(functions.get, line_functions))
    if None in entries:
        return None
    names, files, starts = zip(*entries, strict=True)
    if "" in names:
        return None
    python = {file: python_file(file) for file in set(files)}  # what frame_kind answers, asked once per file
    kinds = [
        PYTHON if python[file] and name != TRAMPOLINE_NAME else frame_kind(name, file, bool(mid))
        for name, file, mid in zip(names, files, mids, strict=True)
    ]
    return list(map(_new_frame, zip(names, files, line_numbers, kinds, starts, strict=True)))


_new_frame = partial(tuple.__new__, Frame)  # a Frame from a tuple of its fields, in C (Frame(...) runs Python)


class _FrameMaker:
    """A Line's frame: its function's name and file, the line, the kind (:func:`frame_kind`, per file where it can)."""

    def __init__(self, functions: dict[int, tuple[str, str, int]]) -> None:
        self.functions = functions
        self.python: dict[str, bool] = {}  # file -> python_file(file), asked once per file

    def __call__(self, fid: int, line: int, lid: int, address: int, mapping_id: int) -> Frame:
        start = 0
        if fid == 0:
            name, file = (native_address_name(address) if address else UNKNOWN), ""
        else:
            found = self.functions.get(fid)
            if found is None:
                raise ProfileFormatError(
                    f"malformed pprof: location {lid} refers to function {fid}, which does not exist"
                )
            name, file, start = found
        if not name:
            name = native_address_name(address) if address else UNKNOWN
        plain = self.python.get(file)
        if plain is None:
            plain = self.python[file] = python_file(file)
        if plain and name != TRAMPOLINE_NAME:  # what frame_kind answers, without its calls
            return Frame(name, file, line, PYTHON, start)
        return Frame(name, file, line, frame_kind(name, file, bool(mapping_id)), start)
