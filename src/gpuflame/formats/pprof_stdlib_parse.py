"""pprof parsed with the standard library into objects shaped like the ``protobuf`` runtime's: the profiled process's.

The JAX recorder reads JAX's own device-memory profile (pprof, a few
hundred samples) inside the profiled process, which imports only the
standard library (ARCHITECTURE.md). This parser gives what the runtime's
``SplitProfile`` and ``Sample`` give (:mod:`gpuflame.formats.pprof_proto`),
field for field, so :mod:`gpuflame.formats.pprof_read` builds the same
profile from either; ``tests/unit/formats/test_pprof_stdlib_parse.py``
holds it to the runtime's answer on real and mutated files. The launcher
reads every file through the runtime. Like the runtime, a field of an
unexpected wire type is skipped as unknown; data cut short, a varint past
10 bytes, field number 0, a group or wire type 6 or 7 is an error.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from gpuflame.errors import ProfileFormatError

_U64 = (1 << 64) - 1


class Parsed:
    """A message's fields as attributes (the runtime's names); *present* holds the scalars written."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)
        self.present: set[str] = set()

    def HasField(self, name: str) -> bool:  # noqa: N802 - the runtime's name
        return name in self.present


# message -> field number -> (name, kind, repeated); kind: "int" (int64), "uint", "bytes", or a sub-message's
Fields = dict[int, tuple[str, Any, bool]]
_VALUE_TYPE: Fields = {1: ("type", "int", False), 2: ("unit", "int", False)}
_MAPPING: Fields = {1: ("id", "uint", False), 5: ("filename", "int", False)}
_LINE: Fields = {1: ("function_id", "uint", False), 2: ("line", "int", False)}
_LOCATION: Fields = {1: ("id", "uint", False), 2: ("mapping_id", "uint", False), 3: ("address", "uint", False)}
_LOCATION[4] = ("line", _LINE, True)
_FUNCTION: Fields = {1: ("id", "uint", False), 2: ("name", "int", False), 3: ("system_name", "int", False)}
_FUNCTION |= {4: ("filename", "int", False), 5: ("start_line", "int", False)}
_PROFILE: Fields = {
    1: ("sample_type", _VALUE_TYPE, True),
    2: ("sample", "bytes", True),
    3: ("mapping", _MAPPING, True),
    4: ("location", _LOCATION, True),
    5: ("function", _FUNCTION, True),
    6: ("string_table", "bytes", True),
    9: ("time_nanos", "int", False),
    10: ("duration_nanos", "int", False),
    13: ("comment", "int", True),
    14: ("default_sample_type", "int", False),
    1000: ("gpuflame_data", "bytes", True),
}
_LABEL: Fields = {1: ("key", "int", False), 2: ("str", "int", False), 3: ("num", "int", False)}
_LABEL[4] = ("num_unit", "int", False)
_SAMPLE: Fields = {1: ("location_id", "uint", True), 2: ("value", "int", True), 3: ("label", _LABEL, True)}


def parse_profile(data: bytes) -> Parsed:
    """A pprof Profile as the runtime's ``SplitProfile`` reads it: samples and strings left as bytes."""
    return _message(data, _PROFILE)


def parse_sample(data: bytes) -> Parsed:
    """One Sample's bytes as the runtime's ``split_profile_pb2.Sample`` reads them."""
    return _message(data, _SAMPLE)


def _message(data: bytes, fields: Fields) -> Parsed:
    out = Parsed(**{name: [] if repeated else 0 for name, _, repeated in fields.values()})
    for number, wire, value in _fields(data):
        known = fields.get(number)
        if known is None:
            continue
        name, kind, repeated = known
        if isinstance(kind, dict):
            if wire == 2:
                getattr(out, name).append(_message(value, kind))
            continue
        if kind == "bytes":
            if wire == 2:
                getattr(out, name).append(value)
            continue
        if wire == 2 and repeated:  # packed
            values = [_int(v, kind) for v in _packed(value)]
        elif wire == 0:
            values = [_int(value, kind)]
        else:
            continue
        if repeated:
            getattr(out, name).extend(values)
        elif values:
            setattr(out, name, values[-1])
            out.present.add(name)
    return out


def _int(value: int, kind: str) -> int:
    return value - (1 << 64) if kind == "int" and value >> 63 else value


def _malformed(what: str) -> ProfileFormatError:
    return ProfileFormatError(f"malformed pprof: {what}")


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise _malformed("a varint is cut short")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result & _U64, pos
        shift += 7
        if shift >= 70:
            raise _malformed("a varint is longer than 10 bytes")


def _fields(data: bytes) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value) of each field: an int, or the bytes of a length-delimited one."""
    pos = 0
    value: Any
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise _malformed("field number 0")
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 2:
            size, pos = _varint(data, pos)
            if pos + size > len(data):
                raise _malformed(f"field {number} runs past the end of the data")
            value, pos = data[pos : pos + size], pos + size
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            if pos + width > len(data):
                raise _malformed(f"field {number} runs past the end of the data")
            value, pos = None, pos + width
        else:
            raise _malformed(f"field {number} has wire type {wire} (groups and 6, 7 are not read)")
        yield number, wire, value


def _packed(data: bytes) -> Iterator[int]:
    pos = 0
    while pos < len(data):
        value, pos = _varint(data, pos)
        yield value
