"""gzip as every reader of formats/ opens it: bounded by the limits, with plain-worded errors.

Below the readers (pprof, PyTorch snapshots) and the front door
(:mod:`gpuflame.formats.load_save`), so none of them imports another for it.
"""

from __future__ import annotations

import zlib

from gpuflame import limits
from gpuflame.errors import ProfileFormatError

GZIP_MAGIC = b"\x1f\x8b"
# gzip data is inflated this many bytes at a time
INFLATE_STEP = 64 << 20


def gunzip_head(data: bytes) -> bytes:
    """The first bytes of gzip *data*, inflated: enough to tell the format inside."""
    try:
        return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(data[:65536], 16)
    except zlib.error as exc:
        raise ProfileFormatError(f"corrupt gzip data ({exc})") from None


def gunzip(data: bytes) -> bytes:
    """Decompress every gzip member, with a plain-worded error for truncated or corrupt data.

    Inflated in steps of :data:`INFLATE_STEP` that stop at
    :data:`gpuflame.limits.INFLATED_BYTES`, so a bomb costs the limit, not
    the machine (a 306 KB file once asked for 18.6 GB); in steps, because one
    call joins its output at the end, twice the limit at once (2.1 GB of a
    bomb for the 1 GiB limit).
    """
    cap = limits.INFLATED_BYTES.value()
    out: list[bytes] = []
    size = 0
    while data:
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        while not inflater.eof:
            try:
                chunk = inflater.decompress(data, min(INFLATE_STEP, cap - size + 1))
            except zlib.error as exc:
                raise ProfileFormatError(f"corrupt gzip data ({exc})") from None
            size += len(chunk)
            if size > cap:
                raise limits.INFLATED_BYTES.exceeded("the decompressed data")
            out.append(chunk)
            data = inflater.unconsumed_tail
            if not chunk and not data:
                raise ProfileFormatError("the gzip data is truncated (the file was cut short)")
        data = inflater.unused_data.lstrip(b"\0")  # gzip allows zero padding between members
    return out[0] if len(out) == 1 else b"".join(out)
