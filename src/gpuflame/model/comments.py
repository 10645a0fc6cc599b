"""Data that rides in pprof ``comment`` lines, and taking it back out.

pprof has no field for a timeline, a peak description or an event history,
so each is stored as one comment that starts with its own prefix
(``gpuflame-timeline-v1:``, ...). The reader takes them back out with
:func:`split_comments`, so users never see them in ``report``; a damaged
one is replaced by a plain note (a file must always load).
"""

from __future__ import annotations

import base64
import binascii
import json
import zlib
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


def split_comments(
    comments: Sequence[str], prefix: str, parse: Callable[[str], T], damaged_note: str
) -> tuple[list[T], list[str]]:
    """What :func:`parse` made of each comment starting with *prefix*, and the other comments, in order.

    *parse* raises ValueError for a damaged comment: it is left out and
    *damaged_note* (once) takes its place among the other comments.
    """
    found: list[T] = []
    rest: list[str] = []
    for comment in comments:
        if not comment.startswith(prefix):
            rest.append(comment)
            continue
        try:
            found.append(parse(comment))
        except ValueError:
            if damaged_note not in rest:
                rest.append(damaged_note)
    return found, rest


def pack_json(prefix: str, payload: Any, level: int = 9) -> str:
    """*payload* as one comment line: *prefix*, then base64 of zlib'd compact JSON."""
    text = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return prefix + base64.b64encode(zlib.compress(text, level)).decode("ascii")


def unpack_json(comment: str, prefix: str, what: str, max_bytes: int) -> Any:
    """The JSON a :func:`pack_json` line holds; ValueError naming *what* when it is damaged or inflates past
    *max_bytes* (a file is untrusted input: a small comment must not become gigabytes)."""
    if not comment.startswith(prefix):
        raise ValueError(f"not a {what} comment")
    try:
        packed = base64.b64decode(comment[len(prefix):].encode("ascii"), validate=True)
        inflater = zlib.decompressobj()
        text = inflater.decompress(packed, max_bytes)
        if inflater.unconsumed_tail or not inflater.eof:
            raise ValueError(f"{what} too large or truncated")
        return json.loads(text)
    except (binascii.Error, zlib.error, UnicodeError, RecursionError, json.JSONDecodeError) as exc:
        raise ValueError(f"damaged {what}: {exc}") from None
