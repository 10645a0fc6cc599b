"""Data that rides in pprof ``comment`` lines, and taking it back out.

pprof has no field for a timeline, a peak description or an event history,
so each is stored as one comment that starts with its own prefix
(``gpuflame-timeline-v1:``, ...). The reader takes them back out with
:func:`split_comments`, so users never see them in ``report``; a damaged
one is replaced by a plain note (a file must always load).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

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
