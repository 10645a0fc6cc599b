"""The sub-messages of one protobuf message, left where they lie in its bytes.

Splitting a million-frame pprof into its five million Samples, Locations,
Functions and strings as ``bytes`` copied 225 MB a second time and made an
object each. A :class:`Regions` keeps each one as a ``(start, stop)`` in the
message's bytes instead: the readers in bulk take those spans as arrays
(:mod:`gpuflame.formats.protobuf_bulk`), and the message-by-message readers
slice one at a time, as they read.

Standard library only: small profiles, and the profiled process's own, are
split without numpy.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from typing import overload

# array typecodes for the spans: 4 bytes each while every offset fits
_NARROW, _WIDE = "I", "Q"


def _code(size: int) -> str:
    return _NARROW if size < 2**32 and array(_NARROW).itemsize == 4 else _WIDE


class Regions(Sequence[bytes]):
    """Spans of *data*, in order and apart: field values of one message, read as ``bytes`` on demand."""

    def __init__(self, data: bytes, starts: array[int] | None = None, stops: array[int] | None = None) -> None:
        self.data = data
        code = _code(len(data))
        self.starts: array[int] = array(code) if starts is None else starts
        self.stops: array[int] = array(code) if stops is None else stops

    def append(self, start: int, stop: int) -> None:
        self.starts.append(start)
        self.stops.append(stop)

    def extend(self, starts: object, stops: object) -> None:
        """Many spans at once: *starts* and *stops* as buffers of this object's typecode (numpy arrays)."""
        self.starts.frombytes(starts)  # type: ignore[arg-type]
        self.stops.frombytes(stops)  # type: ignore[arg-type]

    @property
    def typecode(self) -> str:
        return self.starts.typecode

    def clear(self) -> None:
        """Let the spans and the bytes go (a reader done with this table)."""
        self.data = b""
        self.starts = array(self.starts.typecode)
        self.stops = array(self.stops.typecode)

    def __len__(self) -> int:
        return len(self.starts)

    @overload
    def __getitem__(self, index: int) -> bytes: ...

    @overload
    def __getitem__(self, index: slice) -> Regions: ...

    def __getitem__(self, index: int | slice) -> bytes | Regions:
        if isinstance(index, slice):
            return Regions(self.data, self.starts[index], self.stops[index])
        return self.data[self.starts[index] : self.stops[index]]

    def __iter__(self) -> Iterator[bytes]:
        return map(self.data.__getitem__, map(slice, self.starts, self.stops))
