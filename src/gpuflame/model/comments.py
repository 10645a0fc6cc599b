"""gpuflame's data entries in pprof, and taking them back out.

pprof has no field for a timeline, a peak description or an event history,
so each is stored as one text that starts with its own prefix
(``gpuflame-timeline-v1:``, ...): in gpuflame's own field of Profile
(:data:`gpuflame.formats.pprof_fields.P_GPUFLAME_DATA`), and in files
written before that field, as a comment. The reader takes them back out of
both with :func:`split_comments`, so users never see them in ``report``; a
damaged one is replaced by a plain note (a file must always load).
"""

from __future__ import annotations

import base64
import binascii
import json
import zlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from gpuflame import limits
from gpuflame.printable import encodable

T = TypeVar("T")


def split_comments(
    comments: Sequence[str], prefix: str, parse: Callable[[str], T], damaged_note: str
) -> tuple[list[T], list[str]]:
    """What :func:`parse` made of each comment starting with *prefix*, and the other comments, in order.

    *parse* raises ValueError for a damaged comment: it is left out and
    *damaged_note* (once) takes its place among the other comments. A
    comment repeated word for word is parsed once: a file that names one
    large comment many times costs what one does.
    """
    found: list[T] = []
    rest: list[str] = []
    seen: set[str] = set()
    for comment in comments:
        if not comment.startswith(prefix):
            rest.append(comment)
            continue
        if comment in seen:
            continue
        seen.add(comment)
        try:
            found.append(parse(comment))
        except ValueError:
            if damaged_note not in rest:
                rest.append(damaged_note)
    return found, rest


class InflateBudget:
    """What all the packed comments of one file may still inflate to: bytes, and JSON values in them."""

    def __init__(self) -> None:
        self.left = limits.COMMENT_DATA_BYTES.value()
        self.values_left = limits.COMMENT_DATA_VALUES.value()


# every byte but the four that start or separate JSON values: what translate() deletes to count them
_NOT_SEPARATORS = bytes(sorted(set(range(256)) - set(b",:[{")))


def pack_json(prefix: str, payload: Any, level: int = 9) -> str:
    """*payload* as one comment line: *prefix*, then base64 of zlib'd compact JSON."""
    return pack_json_text(prefix, [compact_json(payload)], level)


def compact_json(value: Any) -> str:
    """*value* as the compact JSON every packed comment holds."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def pack_json_text(prefix: str, pieces: Iterable[str | bytes], level: int = 9) -> str:
    """Like :func:`pack_json`, for JSON text made in *pieces* (str, or bytes of UTF-8): compressed
    as they come, so a large payload (a full event history) never exists as one text, nor as
    Python lists."""
    packer = zlib.compressobj(level)
    packed = [packer.compress(piece if isinstance(piece, bytes) else _utf8(piece)) for piece in pieces]
    packed.append(packer.flush())
    return prefix + base64.b64encode(b"".join(packed)).decode("ascii")


def _utf8(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: a path Python decoded with surrogateescape (not UTF-8 on disk)
        return encodable(text).encode("utf-8")


def unpack_json(comment: str, prefix: str, what: str, budget: InflateBudget | None = None) -> Any:
    """The JSON a :func:`pack_json` line holds; ValueError naming *what* when it is damaged.

    A file is untrusted input: a small comment must not become gigabytes, so
    inflating stops at what *budget* has left (a fresh one when None), the
    values are counted before they are parsed, and going past either is an
    error that names the limit.
    """
    if not comment.startswith(prefix):
        raise ValueError(f"not a {what} comment")
    budget = budget or InflateBudget()
    try:
        packed = base64.b64decode(comment[len(prefix) :].encode("ascii"), validate=True)
        inflater = zlib.decompressobj()
        text = inflater.decompress(packed, budget.left + 1)
        budget.left -= len(text)
        if budget.left < 0:
            raise limits.COMMENT_DATA_BYTES.exceeded(f"the data of the {what} comment")
        if inflater.unconsumed_tail or not inflater.eof:
            raise ValueError(f"damaged {what}: truncated")
        # an upper bound on the values json.loads would build, counted in one C pass (~1% of parsing)
        budget.values_left -= len(text.translate(None, _NOT_SEPARATORS))
        if budget.values_left < 0:
            raise limits.COMMENT_DATA_VALUES.exceeded(f"the values in the {what} comment")
        return json.loads(text)
    except (binascii.Error, zlib.error, UnicodeError, RecursionError, json.JSONDecodeError) as exc:
        raise ValueError(f"damaged {what}: {exc}") from None
