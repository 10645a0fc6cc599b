"""A pprof file's Function and Location tables as columns, parsed by the ``protobuf`` runtime a chunk at a time.

The runtime's reading view keeps each Function and Location as its bytes
(:mod:`gpuflame.formats.pprof_proto`): message objects of a million of each,
and of their Lines, cost 300 MB and seconds of Python to read back. Here a
chunk of a table's entries is joined, each followed by a separator that
writes every field once with a sentinel value, and the runtime parses the
whole as one message of repeated fields (``FunctionColumns``,
``LocationColumns``, ``LineColumns``): it appends each field's values of
every entry in order, so the entries' values lie apart by the sentinels. An
entry's value is the last before its sentinel (protobuf's rule for a field
written twice), 0 where it wrote none (proto3's default).

That reading equals pprof's messages' where each entry is a well-formed
message (else the join could parse across a boundary) and no field is
written length-delimited (pprof's messages skip such a scalar, the columns
would read it as packed values). The runtime checks both on each chunk
(``Tables``, ``LengthDelimited``); a value equal to a sentinel shows as a
miscount. Anything else is read through pprof's messages
(:func:`gpuflame.formats.pprof_tables.tables_of`), the same answer, the
same errors. Tables under :data:`gpuflame.formats.pprof_tables.BULK_MIN`
entries are read that way too: numpy is imported for large ones only.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import compress
from typing import TYPE_CHECKING, Any

from gpuflame.errors import ProfileFormatError
from gpuflame.formats import pprof_tables
from gpuflame.formats.pprof_tables import Tables, tables_of

if TYPE_CHECKING:
    import numpy as np

# Entries parsed at once: bounds the runtime's objects and the joined bytes (a few MB each).
CHUNK = 1 << 16
_U64_SENTINEL = (1 << 64) - 1  # uint64 fields' sentinel; int64 fields take -1 (the same ten bytes)
_MALFORMED = "malformed pprof: the data is not a protobuf Profile message (cut short or corrupt)"


def read_tables(functions: Sequence[bytes], locations: Sequence[bytes]) -> Tables:
    """Every Function and Location (each its bytes) as :class:`Tables`: columns where they can be, else messages."""
    from google.protobuf.message import DecodeError

    from gpuflame.formats.pprof_proto import split_profile_pb2 as view

    try:
        found = None
        if max(len(functions), len(locations)) >= pprof_tables.BULK_MIN:  # read at call time: tests lower it
            found = _columns(view, functions, locations)
        if found is not None:
            return found
        tables = view.Tables.FromString(view.SplitProfile(function=functions, location=locations).SerializeToString())
    except DecodeError:
        raise ProfileFormatError(_MALFORMED) from None
    return tables_of(tables.function, tables.location)


def _columns(view: Any, functions: Sequence[bytes], locations: Sequence[bytes]) -> Tables | None:
    """Both tables as columns, chunk by chunk; None where one entry needs pprof's messages."""

    function_parts: list[list[np.ndarray]] = [[] for _ in range(5)]
    location_parts: list[list[np.ndarray]] = [[] for _ in range(6)]
    for start in range(0, max(len(functions), len(locations)), CHUNK):
        function_chunk = list(functions[start : start + CHUNK])
        location_chunk = list(locations[start : start + CHUNK])
        view.Tables.FromString(  # each entry a well-formed message, or DecodeError
            view.SplitProfile(function=function_chunk, location=location_chunk).SerializeToString()
        )
        found = _function_columns(view, function_chunk)
        lines = _location_columns(view, location_chunk)
        if found is None or lines is None:
            return None
        for parts, column in zip([*function_parts, *location_parts], [*found, *lines], strict=True):
            parts.append(column)
    function_ids, names, system_names, filenames, start_lines = map(_joined, function_parts)
    location_ids, mapping_ids, addresses, counts, line_functions, line_numbers = map(_joined, location_parts)
    return Tables(
        function_ids,
        names,
        system_names,
        filenames,
        start_lines,
        location_ids,
        mapping_ids,
        addresses,
        counts,
        line_functions,
        line_numbers,
    )


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    import numpy as np

    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _function_columns(view: Any, entries: list[bytes]) -> list[np.ndarray] | None:
    """id, name, system_name, filename, start_line of each Function."""
    import numpy as np

    separator = view.FunctionColumns(
        id=[_U64_SENTINEL], name=[-1], system_name=[-1], filename=[-1], start_line=[-1]
    ).SerializeToString()
    parsed = _parse_joined(view, view.FunctionColumns, separator, entries, 5)
    if parsed is None:
        return None
    n = len(entries)
    columns = [_last_each(parsed.id, np.uint64, n)]
    columns += [_last_each(c, np.int64, n) for c in (parsed.name, parsed.system_name, parsed.filename)]
    columns.append(_last_each(parsed.start_line, np.int64, n))
    return None if any(c is None for c in columns) else columns  # type: ignore[return-value]


def _location_columns(view: Any, entries: list[bytes]) -> list[np.ndarray] | None:
    """id, mapping_id, address, the count of Lines of each Location, and each Line's function_id and line."""
    import numpy as np

    line_separator = b"\xff"  # never a Line: every message of one byte is cut short (the checks above)
    separator = view.LocationColumns(
        id=[_U64_SENTINEL], mapping_id=[_U64_SENTINEL], address=[_U64_SENTINEL], line=[line_separator]
    ).SerializeToString()
    parsed = _parse_joined(view, view.LocationColumns, separator, entries, 3)
    if parsed is None:
        return None
    n = len(entries)
    columns = [_last_each(c, np.uint64, n) for c in (parsed.id, parsed.mapping_id, parsed.address)]
    lines = list(parsed.line)
    del parsed
    sizes = np.array(list(map(len, lines)), dtype=np.int64)
    ends = np.flatnonzero(sizes == len(line_separator))
    if len(ends) != n or any(c is None for c in columns):
        return None
    counts = np.diff(ends, prepend=-1) - 1
    line_columns = _line_columns(view, list(compress(lines, (sizes != len(line_separator)).tolist())))
    if line_columns is None:
        return None
    return [*columns, counts, *line_columns]  # type: ignore[list-item]


def _line_columns(view: Any, entries: list[bytes]) -> list[np.ndarray] | None:
    """function_id and line of each Line."""
    import numpy as np

    separator = view.LineColumns(function_id=[_U64_SENTINEL], line=[-1]).SerializeToString()
    parsed = _parse_joined(view, view.LineColumns, separator, entries, 2)
    if parsed is None:
        return None
    columns = [_last_each(parsed.function_id, np.uint64, len(entries)), _last_each(parsed.line, np.int64, len(entries))]
    return None if any(c is None for c in columns) else columns  # type: ignore[return-value]


def _parse_joined(view: Any, message: Any, separator: bytes, entries: list[bytes], fields: int) -> Any:
    """*entries* parsed as one *message* of repeated fields, each entry followed by *separator*; None where an
    entry writes one of fields 1..*fields* length-delimited (:func:`_length_delimited`). The joined bytes go
    when this returns."""
    if _length_delimited(view, entries, fields):
        return None
    return message.FromString(separator.join(entries) + separator if entries else b"")


def _length_delimited(view: Any, entries: list[bytes], fields: int) -> bool:
    """Whether an entry writes one of fields 1..*fields* length-delimited (which the columns would misread).

    The entries are parsed joined, without the separators: half the fields, each of them unknown here.
    """
    parsed = view.LengthDelimited.FromString(b"".join(entries))
    found = (parsed.field1, parsed.field2, parsed.field3, parsed.field4, parsed.field5)
    return any(len(f) for f in found[:fields])


def _last_each(values: Any, dtype: type, n: int) -> np.ndarray | None:
    """Each of *n* entries' value of one field: the last it wrote before its sentinel, else 0.

    None where the sentinels do not number *n* (an entry wrote the sentinel's value itself).
    """
    import numpy as np

    column: np.ndarray = np.array(values, dtype=dtype)
    sentinel = dtype(_U64_SENTINEL) if dtype is np.uint64 else dtype(-1)
    ends = np.flatnonzero(column == sentinel)
    if len(ends) != n:
        return None
    out: np.ndarray = np.zeros(n, dtype=dtype)
    starts = np.empty(n, dtype=np.int64)
    starts[:1] = 0
    starts[1:] = ends[:-1] + 1
    written = ends > starts
    out[written] = column[ends[written] - 1]
    return out
