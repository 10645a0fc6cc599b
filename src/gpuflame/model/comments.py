"""Metadata that rides in pprof ``comment`` lines: one helper to take it back out.

pprof has no fields for a timeline, what a peak is or a phase table, so each
is stored as ONE comment line starting with its own prefix (model/timeline.py,
model/peak.py, model/phases.py). A reader takes those lines back out of the
comments; a damaged one is replaced by a plain note, never an exception, so
a file always loads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def split_comments(
    comments: Sequence[str],
    prefix: str,
    parse: Callable[[str], T],
    damaged_note: str,
    combine: Callable[[T, T], T] | None = None,
) -> tuple[T | None, list[str]]:
    """What the comments starting with *prefix* hold (parsed), and the other comments in order.

    *parse* raises ValueError on a damaged line, which becomes *damaged_note*
    (once). Several such lines are combined with *combine* (earlier, later),
    or the last one wins.
    """
    found: T | None = None
    rest: list[str] = []
    for comment in comments:
        if not comment.startswith(prefix):
            rest.append(comment)
            continue
        try:
            value = parse(comment)
        except ValueError:
            if damaged_note not in rest:
                rest.append(damaged_note)
            continue
        found = value if found is None or combine is None else combine(found, value)
    return found, rest
