"""Writing the protobuf wire format by hand, standard library only: what the profiled process needs.

The profiled process writes pprof (:mod:`gpuflame.formats.pprof`) and pushes
it to Pyroscope (:mod:`gpuflame.ship.pyroscope`) without the ``protobuf``
package, which it must not import (ARCHITECTURE.md); a few field writers are
all that takes. Reading goes through the ``protobuf`` runtime
(:mod:`gpuflame.formats.pprof_read`), on the launcher side.

Wire types used: 0 varint and 2 length-delimited. int64 values are two's
complement in 64 bits, so a negative value is a 10-byte varint.
"""

from __future__ import annotations

from gpuflame.printable import encodable

VARINT = 0
LEN = 2

_U64 = (1 << 64) - 1
_I64_SIGN = 1 << 63


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
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: a path Python decoded with surrogateescape (not UTF-8 on disk)
        data = encodable(text).encode("utf-8")
    return field_bytes(field, data)


def field_packed(field: int, values: list[int] | tuple[int, ...], cache: VarintCache | None = None) -> bytes:
    """Packed repeated varints; omitted when empty (as protobuf does)."""
    if not values:
        return b""
    enc = cache if cache is not None else VarintCache()
    return field_bytes(field, b"".join(map(enc.__getitem__, values)))
