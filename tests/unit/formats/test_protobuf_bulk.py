"""formats/protobuf_bulk.py: every varint of a byte array at once, as Google's protobuf runtime reads them."""

from __future__ import annotations

import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest

from gpuflame.formats import protobuf_bulk as bulk
from gpuflame.formats.pprof_proto.profile_pb2 import Sample
from gpuflame.formats.protobuf_encode import encode_varint, field_bytes

U64 = (1 << 64) - 1


def by_byte(data: bytes) -> tuple[list[int], list[int]]:
    """The reference: the runtime's values (a Sample's packed location ids), and where each varint ends."""
    values = list(Sample.FromString(field_bytes(1, data)).location_id)
    return values, [i for i, b in enumerate(data) if b < 0x80]


# values of every length from 1 to 10 bytes, the edges of each length among them
EDGES = [(1 << (7 * k)) + d for k in range(10) for d in (-1, 0)] + [U64]
values_st = st.lists(st.one_of(st.sampled_from(EDGES[1:]), st.integers(0, U64), st.integers(0, 300)), max_size=300)


@hypothesis.settings(max_examples=150, deadline=None)
@hypothesis.given(values_st, st.sampled_from([1, 3, 7, 1 << 22]))
def test_varints_equal_the_byte_by_byte_reader(values: list[int], chunk: int) -> None:
    """Any mix of lengths, read in chunks of any size (the chunk edge falls anywhere)."""
    data = b"".join(map(encode_varint, values))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bulk, "CHUNK", chunk)
        found = bulk.varints(np.frombuffer(data, dtype=np.uint8))
    reference = by_byte(data)
    assert reference[0] == values
    assert found is not None and (found[0].tolist(), found[1].tolist()) == reference
    assert found[0].dtype == np.uint64


def test_a_ten_byte_varint_keeps_its_low_64_bits() -> None:
    """A tenth byte above 1 carries bits past 64: dropped, as the protobuf runtime drops them."""
    data = b"\xff" * 9 + b"\x7f"
    (value,), _ = bulk.varints(np.frombuffer(data, dtype=np.uint8))  # type: ignore[misc]
    assert int(value) == by_byte(data)[0][0] & U64 == U64


@pytest.mark.parametrize(
    "data",
    [b"\x80", b"\x01\x96", b"\x80" * 10 + b"\x01", b"\x01" + b"\xff" * 11 + b"\x01"],
    ids=["cut short", "cut after a whole one", "eleven bytes", "eleven bytes after one"],
)
def test_a_varint_cut_short_or_too_long_gives_none(data: bytes) -> None:
    """None sends the caller to the message-by-message reader, which names the fault."""
    assert bulk.varints(np.frombuffer(data, dtype=np.uint8)) is None


def test_no_bytes_no_varints() -> None:
    values, last = bulk.varints(np.zeros(0, dtype=np.uint8))  # type: ignore[misc]
    assert len(values) == len(last) == 0


@hypothesis.settings(max_examples=120, deadline=None)
@hypothesis.given(st.lists(st.tuples(st.binary(max_size=4), st.binary(max_size=5)), max_size=20), st.binary(max_size=3))
def test_spans_gathered_are_the_slices_joined(pieces: list[tuple[bytes, bytes]], tail: bytes) -> None:
    """protobuf_bulk.gather: the spans' bytes in order, as slicing each and joining them gives."""
    data, begin, size, at = b"", [], [], 0
    for gap, region in pieces:  # a gap of at least one byte before each region, as a sample's key and length
        data += b"\x0a" + gap + region
        at += 1 + len(gap)
        begin.append(at)
        size.append(len(region))
        at += len(region)
    data += tail
    begins = np.array(begin, np.int64)
    got = bulk.gather(np.frombuffer(data, dtype=np.uint8), begins, begins + np.array(size, np.int64))
    assert got.tobytes() == b"".join(data[b : b + n] for b, n in zip(begin, size, strict=True))


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(
    st.lists(st.one_of(st.text(), st.binary(max_size=8)).map(lambda v: v if isinstance(v, bytes) else v.encode()))
)
@hypothesis.example([b"a\0b", b"c"])  # a NUL inside a string
@hypothesis.example([b"ok", b"\xe2\x82", b"\xff"])  # invalid UTF-8, a truncated sequence at a string's end
@hypothesis.example([])
def test_a_string_table_decodes_as_each_string_alone(table: list[bytes]) -> None:
    """pprof_tables.Strings (the whole table in one decode where it can): each entry decoded alone.

    NULs inside a string, invalid UTF-8 and empty tables take the one-by-one road; the answer is the same.
    """
    from gpuflame.errors import ProfileFormatError
    from gpuflame.formats.pprof_tables import Strings

    raw = [b"", *table]
    expected = [b.decode("utf-8", "replace") for b in raw]
    strings = Strings(raw)
    assert strings.many(list(range(len(raw))), "test") == expected
    assert [strings.get(i, "test") for i in range(len(expected))] == expected
    assert len(strings) == len(expected)
    for bad in (len(expected), -1):
        with pytest.raises(ProfileFormatError, match=f"refers to string {bad}, but the string table has"):
            strings.many([0, bad], "test")
