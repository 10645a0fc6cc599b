"""formats/protobuf_bulk.py: every varint of a byte array at once, as the byte-by-byte reader reads them."""

from __future__ import annotations

import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest

from gpuflame.formats import protobuf_bulk as bulk
from gpuflame.formats.protobuf_wire import encode_varint, read_varint

U64 = (1 << 64) - 1


def by_byte(data: bytes) -> tuple[list[int], list[int]]:
    """The reference: protobuf_wire's reader, one varint after another."""
    values, last, pos = [], [], 0
    while pos < len(data):
        value, pos = read_varint(data, pos)
        values.append(value)
        last.append(pos - 1)
    return values, last


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
    """A tenth byte above 1 carries bits past 64: dropped, as protobuf and read_varint drop them."""
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


# -- record_run: a run of top-level fields found at once ---------------------------------


def one_by_one(data: bytes, pos: int, window: int, key: int) -> tuple[list[int], list[int], int | str]:
    """The reference: pprof_read's loop, a record at a time ("past the end" where it would raise)."""
    starts: list[int] = []
    stops: list[int] = []
    while pos < window and data[pos] == key:
        if pos + 1 >= len(data):
            return starts, stops, pos
        size, start = data[pos + 1], pos + 2
        if size >= 0x80:
            if start >= len(data) or data[start] >= 0x80:
                return starts, stops, pos
            size, start = (size & 0x7F) | (data[start] << 7), start + 1
        if start + size > len(data):
            return starts, stops, pos  # the caller's loop raises "runs past the end" here
        starts.append(start)
        stops.append(start + size)
        pos = start + size
    return starts, stops, pos


@st.composite
def runs(draw: st.DrawFn) -> tuple[bytes, int, int, int]:
    """Records of one key whose payloads are full of that key's byte, other fields, sizes of 1-3 bytes, cut ends."""
    key = draw(st.sampled_from([0x12, 0x22, 0x2A, 0x32]))
    noise = st.binary(max_size=40).map(lambda b: bytes(key if x % 3 == 0 else x for x in b))
    out = bytearray(draw(st.binary(max_size=3)))
    for _ in range(draw(st.integers(0, 60))):
        kind = draw(st.sampled_from(["record", "record", "record", "wide", "other", "huge"]))
        payload = draw(noise)
        if kind == "wide":
            payload = payload * (130 // max(1, len(payload)) + 1)  # a two-byte size
        if kind == "huge":
            out += bytes([key, 0x80, 0x80, 0x01])  # a three-byte size: the caller's
        out += bytes([key if kind != "other" else 0x3A]) + encode_varint(len(payload)) + payload
    out += draw(st.binary(max_size=3))  # maybe a record cut short
    data = bytes(out)
    pos = draw(st.integers(0, max(0, len(data) - 1)))
    window = draw(st.integers(pos, len(data)))
    return data, pos, window, key


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(runs())
def test_a_run_found_at_once_is_the_run_read_one_by_one(case: tuple[bytes, int, int, int]) -> None:
    data, pos, window, key = case
    starts, stops, end = bulk.record_run(data, pos, window, key)
    assert (starts.tolist(), stops.tolist(), end) == one_by_one(data, pos, window, key)


def test_a_long_run_with_the_key_inside_every_payload() -> None:
    """Thousands of records (many doublings), each payload holding the key's byte where a record could start."""
    payloads = [bytes([0x12, i % 256, 0x12]) * (i % 50) for i in range(5000)]
    data = b"".join(b"\x12" + encode_varint(len(p)) + p for p in payloads) + b"\x22\x00"
    starts, stops, end = bulk.record_run(data, 0, len(data), 0x12)
    assert [data[a:b] for a, b in zip(starts.tolist(), stops.tolist(), strict=True)] == payloads
    assert end == len(data) - 2
