"""formats/pprof_table_columns.py: a file's Functions and Locations as columns give what pprof's own messages give.

The reference is the runtime's parse of each entry as ``perftools.profiles.Function``
/ ``Location`` (read back by pprof_tables.tables_of). Entries the columns cannot
read exactly (a field written length-delimited, a value equal to a sentinel)
must go that way too, and a malformed entry must be an error, not a misread.
"""

from __future__ import annotations

import gzip

import pytest

from gpuflame.errors import ProfileFormatError
from gpuflame.formats import pprof, pprof_table_columns, pprof_tables
from gpuflame.formats.pprof_proto import profile_pb2, split_profile_pb2
from gpuflame.formats.pprof_tables import Tables, tables_of
from tests.helpers.paths import DATA

Function, Location, Line = profile_pb2.Function, profile_pb2.Location, profile_pb2.Line
U64_MAX = (1 << 64) - 1


def by_messages(functions: list[bytes], locations: list[bytes]) -> Tables:
    """What pprof's messages give: each entry parsed as profile.proto's Function / Location."""
    tables = [Function.FromString(b) for b in functions], [Location.FromString(b) for b in locations]
    return tables_of(*tables)


@pytest.fixture(autouse=True)
def columns_for_any_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tables of any size are read as columns (by default, from BULK_MIN entries)."""
    monkeypatch.setattr(pprof_tables, "BULK_MIN", 0)


def columns_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail where read_tables would fall back to pprof's messages."""

    def no_messages(*_: object) -> Tables:
        raise AssertionError("read through pprof's messages, not as columns")

    monkeypatch.setattr(pprof_table_columns, "tables_of", no_messages)


def as_lists(tables: Tables) -> list[list[int]]:
    """Each column as Python ints (the columns are numpy arrays, pprof's messages give tuples)."""
    return [column.tolist() if hasattr(column, "tolist") else list(column) for column in tables]


def file_tables(name: str) -> tuple[list[bytes], list[bytes]]:
    data = (DATA / name).read_bytes()
    split = split_profile_pb2.SplitProfile.FromString(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)
    return list(split.function), list(split.location)


USUAL = (
    [
        Function(id=1, name=1, filename=2, start_line=10).SerializeToString(),
        Function(id=2, name=3, system_name=4, filename=2).SerializeToString(),  # start_line 0: not written
        Function(id=U64_MAX - 1, name=5, start_line=-2).SerializeToString(),
    ],
    [
        Location(id=1, line=[Line(function_id=1, line=12)]).SerializeToString(),
        Location(id=2, mapping_id=1, address=0x1234).SerializeToString(),  # no Line
        Location(id=3, line=[Line(function_id=2, line=7), Line(function_id=1, line=40)]).SerializeToString(),  # inlined
        Location(id=4, is_folded=True, line=[Line(), Line(function_id=U64_MAX - 1, column=3)]).SerializeToString(),
        b"",  # every field 0
    ],
)


@pytest.mark.parametrize("chunk", [1, 2, 1 << 16])
def test_the_columns_read_every_field_as_pprofs_messages(monkeypatch: pytest.MonkeyPatch, chunk: int) -> None:
    functions, locations = USUAL
    expected = as_lists(by_messages(functions, locations))
    monkeypatch.setattr(pprof_table_columns, "CHUNK", chunk)  # tables read in several chunks, of unequal counts
    columns_only(monkeypatch)
    assert as_lists(pprof_table_columns.read_tables(functions, locations)) == expected
    assert expected[8] == [1, 0, 2, 2, 0]  # each location's count of Lines


@pytest.mark.parametrize("name", ["go-1.19-heap.pb.gz", "jax-0.10.2-cpu-device-memory.prof"])
def test_real_files_read_as_columns_as_by_messages(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    functions, locations = file_tables(name)
    expected = as_lists(by_messages(functions, locations))
    columns_only(monkeypatch)
    assert as_lists(pprof_table_columns.read_tables(functions, locations)) == expected


def test_a_field_written_twice_reads_its_last_value(monkeypatch: pytest.MonkeyPatch) -> None:
    twice = Function(id=7, name=1).SerializeToString() + Function(name=2, start_line=5).SerializeToString()
    line_twice = Line(function_id=7, line=1).SerializeToString() + Line(line=9).SerializeToString()
    location = Location(id=3, address=1).SerializeToString() + Location(id=4).SerializeToString()
    location += b"\x22" + bytes([len(line_twice)]) + line_twice
    expected = as_lists(by_messages([twice], [location]))
    assert expected[:5] == [[7], [2], [0], [0], [5]] and expected[5] == [4] and expected[9:] == [[7], [9]]
    columns_only(monkeypatch)
    assert as_lists(pprof_table_columns.read_tables([twice], [location])) == expected


def length_delimited(field: int, value: int) -> bytes:
    """Field *field* written as packed varints, which pprof's messages skip (a scalar of another wire type)."""
    return split_profile_pb2.LengthDelimited(**{f"field{field}": [bytes([value])]}).SerializeToString()


ODD = {
    "function field length-delimited": (
        [Function(id=1, name=1).SerializeToString() + length_delimited(2, 5)],
        [Location(id=1, line=[Line(function_id=1)]).SerializeToString()],
    ),
    "location field length-delimited": (
        [Function(id=1).SerializeToString()],
        [Location(id=1, line=[Line(function_id=1)]).SerializeToString() + length_delimited(3, 9)],
    ),
    "line field length-delimited": (
        [Function(id=1).SerializeToString()],
        [
            Location(id=1).SerializeToString()
            + b"\x22\x05"
            + Line(function_id=1).SerializeToString()
            + length_delimited(2, 4)
        ],
    ),
    "a value equal to a sentinel": (
        [Function(id=U64_MAX, name=0, start_line=-1).SerializeToString()],
        [Location(id=U64_MAX, address=U64_MAX, line=[Line(function_id=U64_MAX, line=-1)]).SerializeToString()],
    ),
}


@pytest.mark.parametrize("case", ODD)
def test_entries_the_columns_would_misread_are_read_as_pprofs_messages(
    monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    functions, locations = ODD[case]
    expected = as_lists(by_messages(functions, locations))
    called = []
    monkeypatch.setattr(pprof_table_columns, "tables_of", lambda *a: called.append(1) or tables_of(*a))
    assert as_lists(pprof_table_columns.read_tables(functions, locations)) == expected
    assert called == [1]


@pytest.mark.parametrize(
    "entries",
    [
        ([Function(id=1).SerializeToString()[:-1]], []),  # the id cut short
        ([], [Location(id=1).SerializeToString() + b"\x22\x02\x08"]),  # a Line runs past its location
        ([], [Location(id=2).SerializeToString() + b"\x22\x01\x08"]),  # a Line of one byte: its value cut short
    ],
)
def test_a_malformed_entry_is_an_error_not_a_misread(entries: tuple[list[bytes], list[bytes]]) -> None:
    functions, locations = entries
    with pytest.raises(Exception):  # noqa: B017,PT011 - the reference: pprof's messages refuse it
        by_messages(functions, locations)
    with pytest.raises(ProfileFormatError, match="not a protobuf Profile message"):
        pprof_table_columns.read_tables(functions, locations)


def test_small_tables_are_read_as_messages_without_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pprof_tables, "BULK_MIN", len(USUAL[1]) + 1)

    def no_columns(*_: object) -> None:
        raise AssertionError("small tables read as columns")

    monkeypatch.setattr(pprof_table_columns, "_columns", no_columns)
    assert as_lists(pprof_table_columns.read_tables(*USUAL)) == as_lists(by_messages(*USUAL))


def test_a_file_reads_the_same_as_columns_and_in_the_profiled_process() -> None:
    """The whole read (frames, start_line below 0 read as 0, inlined and address-only locations) against the
    standard-library parse, which reads pprof's messages and never the columns."""
    functions, locations = USUAL[0], USUAL[1][:-1]  # not the location of id 0
    message = profile_pb2.Profile(
        sample_type=[profile_pb2.ValueType(type=1, unit=2)],
        sample=[profile_pb2.Sample(location_id=[i, 1], value=[i]) for i in range(1, 5)],
        mapping=[profile_pb2.Mapping(id=1, filename=6)],
        string_table=["", "f", "/a.py", "g", "g_sys", "h", "lib.so"],
    )
    data = message.SerializeToString()
    data += b"".join(b"\x2a" + bytes([len(f)]) + f for f in functions)  # field 5, each shorter than 128 bytes
    data += b"".join(b"\x22" + bytes([len(loc)]) + loc for loc in locations)  # field 4
    read = pprof.decode(data)
    named = [(f.name, f.line, f.start_line) for f in read.frames]
    assert {("f", 12, 10), ("g", 7, 0), ("f", 40, 10), ("h", 0, 0)} <= set(named)  # h: start_line -2
    in_process = pprof.decode_in_process(data)
    assert (read.frames, [s.stack for s in read.samples]) == (in_process.frames, [s.stack for s in in_process.samples])
