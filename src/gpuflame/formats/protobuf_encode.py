"""The protobuf wire format, hand-written: just enough for pprof.

gpuflame ships no protobuf runtime, so reading and writing ``profile.proto``
messages is done here on plain ``bytes``. Decoding is defensive: any input,
however corrupt, either decodes or raises :class:`ProfileFormatError` with a
plain message; nothing else escapes.

Wire types: 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32. Groups (3, 4)
are long deprecated and refused. int64 values are two's complement in 64 bits,
so a negative value is a 10-byte varint (see :func:`to_int64`).

Packed repeated varints (pprof's ``location_id`` and ``value``) are the bulk of
a profile, so they are split with one regular expression (a varint is any
run of bytes >= 0x80 closed by one byte < 0x80) and decoded through a memo
dict, which keeps the per-value work in C.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

from gpuflame.errors import ProfileFormatError

VARINT = 0
FIXED64 = 1
LEN = 2
FIXED32 = 5

_U64 = (1 << 64) - 1
_I64_SIGN = 1 << 63

FieldValue = int | bytes

# -- encoding ---------------------------------------------------------------


def encode_varint(value: int) -> bytes:
    """Varint bytes of an unsigned (or, as int64, negative) integer."""
    if value < 0:
        if value < -_I64_SIGN:
            raise ValueError(f"{value} does not fit in int64")
        value &= _U64
    elif value > _U64:
        raise ValueError(f"{value} does not fit in uint64")
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


class VarintCache(dict):
    """``int -> varint bytes``, computed once per distinct value.

    Profiles repeat the same ids and sizes over and over, so a dict lookup
    (C) replaces most calls to :func:`encode_varint` (Python).
    """

    def __missing__(self, value: int) -> bytes:
        encoded = self[value] = encode_varint(value)
        return encoded


def tag(field: int, wire_type: int) -> bytes:
    """The key that precedes a field on the wire."""
    return encode_varint((field << 3) | wire_type)


def field_varint(field: int, value: int) -> bytes:
    """A varint field; zero is the default and is omitted, as protobuf does."""
    if not value:
        return b""
    return tag(field, VARINT) + encode_varint(value)


def field_bytes(field: int, payload: bytes) -> bytes:
    """A length-delimited field (string, bytes, sub-message, packed values)."""
    return tag(field, LEN) + encode_varint(len(payload)) + payload


def field_string(field: int, text: str) -> bytes:
    return field_bytes(field, text.encode("utf-8"))


def field_packed(field: int, values: list[int] | tuple[int, ...], cache: VarintCache | None = None) -> bytes:
    """Packed repeated varints; omitted when empty (as protobuf does)."""
    if not values:
        return b""
    enc = cache if cache is not None else VarintCache()
    return field_bytes(field, b"".join(map(enc.__getitem__, values)))


# -- decoding ---------------------------------------------------------------


def _truncated(what: str) -> ProfileFormatError:
    return ProfileFormatError(f"truncated protobuf: {what} runs past the end of the data")


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """The varint at *pos* and the position after it (low 64 bits kept)."""
    result = 0
    shift = 0
    end = len(data)
    while True:
        if pos >= end:
            raise _truncated("a varint")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result & _U64, pos
        shift += 7
        if shift >= 70:
            raise ProfileFormatError("malformed protobuf: a varint is longer than 10 bytes")


def to_int64(value: int) -> int:
    """Reinterpret a decoded varint as a signed int64."""
    return value - (1 << 64) if value & _I64_SIGN else value


def iter_fields(data: bytes) -> Iterator[tuple[int, int, FieldValue]]:
    """``(field number, wire type, value)`` for each field of one message.

    The value is an int for varint and fixed fields and the raw bytes for
    length-delimited ones (strings, sub-messages, packed values).
    """
    pos = 0
    end = len(data)
    while pos < end:
        key, pos = read_varint(data, pos)
        field = key >> 3
        wire = key & 7
        if field == 0:
            raise ProfileFormatError("malformed protobuf: field number 0")
        if wire == VARINT:
            value, pos = read_varint(data, pos)
            yield field, wire, value
        elif wire == LEN:
            size, pos = read_varint(data, pos)
            stop = pos + size
            if stop > end:
                raise _truncated(f"field {field}")
            yield field, wire, data[pos:stop]
            pos = stop
        elif wire == FIXED64 or wire == FIXED32:
            width = 8 if wire == FIXED64 else 4
            if pos + width > end:
                raise _truncated(f"field {field}")
            yield field, wire, int.from_bytes(data[pos : pos + width], "little")
            pos += width
        elif wire in (3, 4):
            raise ProfileFormatError(f"unsupported protobuf: field {field} uses groups (wire type {wire})")
        else:
            raise ProfileFormatError(f"malformed protobuf: field {field} has invalid wire type {wire}")


def decode_varint_bytes(chunk: bytes) -> int:
    """One complete varint given as its own bytes (as split by :data:`VARINT_RUN`)."""
    if len(chunk) > 10:
        raise ProfileFormatError("malformed protobuf: a varint is longer than 10 bytes")
    result = 0
    for shift, b in zip(range(0, 70, 7), chunk, strict=False):
        result |= (b & 0x7F) << shift
    return result & _U64


# A varint: continuation bytes (high bit set), then one final byte.
VARINT_RUN = re.compile(rb"[\x80-\xff]*[\x00-\x7f]")


class VarintMemo(dict):
    """``varint bytes -> value`` (or ``-> convert(value)``), computed once per distinct key.

    Keys may also be plain ints (a one-byte varint read by iterating bytes):
    those are values already and only go through *convert*.
    """

    def __init__(self, convert: Callable[[int], object] | None = None) -> None:
        super().__init__()
        self._convert = convert

    def __missing__(self, key: bytes | int) -> object:
        value = key if isinstance(key, int) else decode_varint_bytes(key)
        out = self._convert(value) if self._convert is not None else value
        self[key] = out
        return out


def split_packed(chunk: bytes, field: int) -> bytes | list[bytes]:
    """The varints of a packed field, ready for a :class:`VarintMemo`.

    When every byte is below 0x80 (small ids, small values) each byte is one
    varint and *chunk* itself is returned: iterating it yields the ints.
    Otherwise the varints' byte strings are returned.
    """
    if chunk.isascii():
        return chunk
    if chunk[-1] >= 0x80:
        raise _truncated(f"the last value of packed field {field}")
    return VARINT_RUN.findall(chunk)


def unpack_varints(chunk: bytes, field: int, memo: VarintMemo) -> list[object]:
    """Decode a packed repeated varint field through *memo*."""
    return list(map(memo.__getitem__, split_packed(chunk, field)))


def read_string(data: bytes) -> str:
    """A protobuf string; invalid UTF-8 is replaced rather than refused."""
    return data.decode("utf-8", errors="replace")
