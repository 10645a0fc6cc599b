"""The front door of formats/: ``load`` any profile (sniffed from the bytes); ``save`` pprof, folded, speedscope.

The flame-tree JSON and the SVG picture are renderings of the analysis, not
interchange formats: ``gpuflame.render.writers`` writes every output format,
these three through here.
"""

from __future__ import annotations

import os
from typing import Any

from gpuflame import limits
from gpuflame.errors import ProfileFormatError
from gpuflame.files import STDIO, read_bytes, write_output
from gpuflame.formats.gzip_io import GZIP_MAGIC, gunzip_head
from gpuflame.model.profile import Profile

# The interchange formats written here (render/writers.py adds the renderings).
FORMATS = ("pprof", "folded", "speedscope")

# The bytes a pprof Profile message can start with: the tag of one of its fields 1-14.
PPROF_FIRST_BYTES = frozenset(b"\x0a\x12\x1a\x22\x2a\x32\x38\x3a\x40\x42\x48\x50\x5a\x60\x68\x6a\x70\x08")
NOT_A_PROFILE = (
    "not a profile gpuflame can read "
    "(expected gzip pprof, folded stacks, speedscope JSON, or a PyTorch memory snapshot pickle)"
)


def detect(data: bytes) -> str:
    """``pprof``, ``torch-snapshot``, ``folded`` or ``json`` (speedscope); raises if none fits."""
    if not data:
        raise ProfileFormatError("the file is empty")
    head = data[:2]
    if head == GZIP_MAGIC:
        inner = gunzip_head(data)
        if inner[:1] == b"\x80" or _old_pickle_head(inner):
            return "torch-snapshot"
        if inner[:1] and inner[0] not in PPROF_FIRST_BYTES:
            raise ProfileFormatError(f"{NOT_A_PROFILE}; this is gzip data of something else")
        return "pprof"
    if data[:1] == b"\x80" or (_old_pickle_head(data) and data.rstrip().endswith(b".")):
        return "torch-snapshot"
    stripped = data.lstrip()[:1]
    if stripped == b"{":
        return "json"
    if _looks_like_text(data[:4096]):
        return "folded"
    if data[0] in PPROF_FIRST_BYTES:
        return "pprof"
    raise ProfileFormatError(NOT_A_PROFILE)


def _old_pickle_head(data: bytes) -> bool:
    """A protocol 0 or 1 pickle of a dict or list (no PROTO opcode): ``(d``, ``(l``, ``}``, ``]``.

    Folded text never starts so: ``(`` and ``}`` would begin a frame name
    only in a hand-made file, and then the whole text must also end in the
    pickle's STOP (``.``, maybe followed by a line break an editor added),
    which a folded line (ending in its count) cannot.
    """
    return data[:2] in (b"(d", b"(l") or data[:1] in (b"}", b"]")


def _looks_like_text(chunk: bytes) -> bool:
    try:
        text = chunk.decode("utf-8")
    except UnicodeDecodeError:
        # a multi-byte character cut at the chunk's end is still text
        try:
            text = chunk[:-3].decode("utf-8")
        except UnicodeDecodeError:
            return False
    return all(c.isprintable() or c in "\t\r\n" for c in text)


def loads(data: bytes, source: str = "<bytes>", **snapshot_options: Any) -> Profile:
    """Parse a profile in any supported format from bytes.

    *snapshot_options* go to :func:`gpuflame.formats.torch_snapshot.decode`
    (``native``, ``resolver``) when the data is a PyTorch snapshot.
    """
    fmt = ""
    try:
        fmt = detect(data)
        if fmt == "pprof":
            from gpuflame.formats import pprof

            return pprof.decode(data)
        if fmt == "torch-snapshot":
            from gpuflame.formats import torch_snapshot

            return torch_snapshot.decode(data, **snapshot_options)
        if fmt == "folded":
            from gpuflame.formats import folded

            return folded.decode(data.decode("utf-8", errors="replace"))
        from gpuflame.formats import speedscope

        return speedscope.decode(data)
    except ProfileFormatError as exc:
        raise ProfileFormatError(f"{source}: {_name_hint(source, data, fmt)}{exc}") from None
    except MemoryError:  # the limits keep a file within reach of a machine, not of every machine
        raise ProfileFormatError(
            f"{source}: out of memory while reading (the limits of gpuflame.limits were not reached; "
            "lower one, e.g. GPUFLAME_MAX_INFLATED_BYTES, to be told which part is too large)"
        ) from None
    except RecursionError:
        raise ProfileFormatError(f"{source}: the data nests too deeply to read") from None


def _name_hint(source: str, data: bytes, fmt: str) -> str:
    """Why ``run.pb.gz`` failed as text: its name promised gzip, its bytes are not (else the error is a riddle)."""
    if not source.lower().endswith(".gz") or data[:2] == GZIP_MAGIC:
        return ""
    read_as = _READ_AS.get(fmt)
    return f"its name ends in .gz but it is not gzip data{f', so it was read as {read_as}' if read_as else ''}; "


# What detect() names each format in words, for _name_hint.
_READ_AS = {"folded": "folded stacks", "json": "speedscope JSON", "pprof": "raw pprof"}


def load(path: str | os.PathLike[str], **snapshot_options: Any) -> Profile:
    """Read a profile file of any supported format, ``-`` for stdin (*snapshot_options*: see :func:`loads`)."""
    source = "<stdin>" if os.fspath(path) == STDIO else str(path)
    return loads(read_bytes(path, limits.INFLATED_BYTES), source=source, **snapshot_options)


def save(profile: Profile, path: str | os.PathLike[str], fmt: str = "pprof", type_name: str | None = None) -> None:
    """Write *profile* atomically (``-``: to standard output); text formats carry one sample type (*type_name*)."""
    write_output(path, dumps(profile, fmt, type_name))


def dumps(profile: Profile, fmt: str = "pprof", type_name: str | None = None) -> bytes:
    """*profile* as pprof (every sample type), folded or speedscope (one: *type_name*, else the default)."""
    if fmt == "pprof":
        from gpuflame.formats import pprof

        return pprof.encode(profile)
    index = profile.pick_type(type_name)
    if fmt == "folded":
        from gpuflame.formats import folded

        return folded.encode(profile, index).encode("utf-8")
    if fmt == "speedscope":
        from gpuflame.formats import speedscope

        return speedscope.encode(profile, index).encode("utf-8")
    raise ValueError(
        f"unknown format {fmt!r} (formats writes {', '.join(FORMATS)}; "
        "the JSON flame tree and SVG are in gpuflame.render.writers)"
    )
