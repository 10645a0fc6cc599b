"""pprof_read's split of the top-level message: the numpy run (protobuf_runs.field_run) gives the field-by-field answer.

A large pprof is split with numpy (every byte equal to a field's key a
candidate, the run the chain of candidates from its first field), a small
one field by field; both leave each field as a span of the message's bytes
(protobuf_regions.Regions). The same bytes must give the same fields, and a
damaged file the same error, either way.
"""

from __future__ import annotations

import sys

import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest

from gpuflame.errors import ProfileFormatError
from gpuflame.formats import pprof_read
from gpuflame.formats import protobuf_bulk as bulk
from gpuflame.formats import protobuf_runs as runs
from gpuflame.formats.protobuf_regions import Regions
from gpuflame.formats.protobuf_wire import encode_varint

# the tables' keys (fields 1-6, length-delimited), a comment (13, varint) and time_nanos (9, varint)
TABLE_KEYS = [0x0A, 0x12, 0x1A, 0x22, 0x2A, 0x32]


def length(size: int, width: int) -> bytes:
    """*size* as a varint of at least *width* bytes (longer than needed: legal, and not the fast road)."""
    raw = bytearray(encode_varint(size))
    while len(raw) < width:
        raw[-1] |= 0x80
        raw.append(0)
    return bytes(raw)


def table_field(key: int, payload: bytes, width: int) -> bytes:
    return bytes([key]) + length(len(payload), width) + payload


# values rich in key bytes: each a candidate field inside a value, which the run must not take
payloads = st.lists(st.sampled_from([0x12, 0x22, 0x00, 0x01, 0x7F, 0x80, 0xFF, 0x05]), max_size=300).map(bytes)
fields = st.one_of(
    st.tuples(st.sampled_from(TABLE_KEYS), payloads, st.sampled_from([1, 1, 1, 2, 3])).map(lambda f: table_field(*f)),
    st.integers(0, 1 << 40).map(lambda v: b"\x68" + encode_varint(v)),  # a comment
    st.integers(0, 1 << 40).map(lambda v: b"\x48" + encode_varint(v)),  # time_nanos
)
messages = st.tuples(st.lists(fields, max_size=40), st.integers(0, 6)).map(
    lambda m: b"".join(m[0])[: len(b"".join(m[0])) - m[1]]  # sometimes cut short
)


def split(data: bytes, monkeypatch: pytest.MonkeyPatch, bulk_from: int) -> object:
    """What ``_split_profile`` gives (each table's fields as bytes) or the error it raises."""
    monkeypatch.setattr(pprof_read, "_BULK_BYTES", bulk_from)
    try:
        raw = pprof_read._split_profile(data)
    except ProfileFormatError as exc:
        return str(exc)
    tables = [list(raw[i]) for i in range(6)]
    assert all(isinstance(raw[i], Regions) and raw[i].data is data for i in range(6))
    return tables, raw.comments, raw.scalars


@hypothesis.settings(max_examples=400, deadline=None, suppress_health_check=list(hypothesis.HealthCheck))
@hypothesis.given(
    data=messages,
    piece=st.sampled_from([1, 3, 7, 64, 1 << 18]),
    window=st.sampled_from([5, 40, 1 << 24]),
    field_by_field=st.sampled_from([0, 3, 1 << 12]),
)
@hypothesis.example(data=b"\n\x00\n\x82", piece=1, window=5, field_by_field=0)  # a two-byte length cut short
@hypothesis.example(data=b"\n\x00\n", piece=1, window=5, field_by_field=0)  # a length missing
def test_the_numpy_split_gives_the_fields_and_errors_of_the_field_by_field_one(
    data: bytes, piece: int, window: int, field_by_field: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pieces and windows a few bytes long put their edges inside fields, lengths and runs."""
    monkeypatch.setattr(runs, "RUN_FIRST", max(1, piece // 4))
    monkeypatch.setattr(runs, "RUN_CHUNK", piece)
    monkeypatch.setattr(pprof_read, "_CHECK_EVERY", window)
    monkeypatch.setattr(pprof_read, "_FIELD_BY_FIELD", field_by_field)
    assert split(data, monkeypatch, 0) == split(data, monkeypatch, 1 << 62)


@pytest.mark.parametrize("per_run", [1, 2, 45, 200])
def test_the_numpy_split_scans_each_byte_a_few_times_at_most(per_run: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs of two keys in turn, short or long: the pieces scanned add up to a few times the file at most.

    Scanning a whole piece for each run of one field would read a hostile
    file of two keys in turn once per field (hours for 100 MB).
    """
    run = lambda key: table_field(key, bytes(range(1, 100)), 1) * per_run  # noqa: E731
    data = (run(0x12) + run(0x1A)) * (200_000 // (per_run * 200) + 1)
    scanned: list[int] = []
    piece_of = runs._run_piece
    monkeypatch.setattr(
        runs, "_run_piece", lambda d, pos, piece, key: scanned.append(piece - pos) or piece_of(d, pos, piece, key)
    )
    tables, _, _ = split(data, monkeypatch, 0)  # type: ignore[misc]
    assert len(tables[1]) + len(tables[2]) == len(data) // 101
    assert sum(scanned) <= 4 * len(data)


def test_a_value_made_of_fields_is_one_value(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Sample whose bytes read as a chain of forty Samples: longer than pruning follows, so doubling decides."""
    inner = b"\x12\x00" * 40  # forty empty "fields" inside one value, each linking to the next, the last to a field
    data = table_field(0x12, inner, 1) + table_field(0x12, b"ab", 1) + table_field(0x12, inner, 2)
    monkeypatch.setattr(pprof_read, "_FIELD_BY_FIELD", 0)
    doubled: list[int] = []
    doubling = runs._doubling
    monkeypatch.setattr(runs, "_doubling", lambda step: doubled.append(len(step)) or doubling(step))
    tables, _, _ = split(data, monkeypatch, 0)  # type: ignore[misc]
    assert tables[1] == [inner, b"ab", inner] and doubled


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(st.lists(st.integers(1, 12), max_size=60))
def test_reached_is_the_walk_from_the_first_node(jumps: list[int]) -> None:
    """_reached (pruning, then doubling) against following the links one by one."""
    step = np.minimum(np.arange(len(jumps)) + np.array(jumps, dtype=np.int64), len(jumps))
    walk, node = [], 0
    while len(jumps) and node < len(jumps):
        walk.append(node)
        node = int(step[node])
    if not jumps:
        return
    assert runs._reached(step).tolist() == walk
    assert runs._doubling(np.append(step, len(step))).tolist() == walk


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(st.lists(payloads, max_size=30), st.sampled_from([0, 1, 0x7F]))
def test_spans_joined_with_a_separator_are_the_join_of_the_slices(values: list[bytes], sep: int) -> None:
    """protobuf_bulk.joined: what ``bytes([sep]).join`` gives, read from the spans in place."""
    data = b"".join(table_field(0x32, v, 1 + i % 2) for i, v in enumerate(values))
    regions = pprof_read._split_profile(data)[5] if values else Regions(data)
    assert list(regions) == values
    assert bulk.joined(regions, sep) == bytes([sep]).join(values)


def test_regions_read_slice_and_let_go() -> None:
    data = b"..abc..de...f"
    regions = Regions(data)
    for start, stop in ((2, 5), (7, 9), (12, 13)):
        regions.append(start, stop)
    assert list(regions) == [b"abc", b"de", b"f"] and regions[1] == b"de" and len(regions) == 3
    assert list(regions[1:]) == [b"de", b"f"] and regions[1:].data is data
    regions.clear()
    assert len(regions) == 0 and regions.data == b""


def test_a_string_table_read_whole_keeps_no_hold_on_the_file() -> None:
    """Strings.many decodes the table once; then neither the table nor Strings holds the inflated bytes."""
    from gpuflame.formats.pprof_raw import Strings

    names = [b"", *(b"name%d" % i for i in range(5000))]  # above BULK_MIN: decoded whole from its spans
    data = b"".join(table_field(0x32, s, 1) for s in names)
    regions = pprof_read._split_profile(data)[5]
    held = sys.getrefcount(data)
    strings = Strings(regions)
    assert strings.get(7, "a name") == "name6" and strings.many(np.array([1, 5000])) == ["name0", "name4999"]
    assert sys.getrefcount(data) == held - 1 and len(regions) == 0  # the table's hold gone, none added
