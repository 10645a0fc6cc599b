"""A decorated function's ``def`` line, from the first line of its decorators.

CPython's ``co_firstlineno`` (and so every recorder's ``start_line``) is the
line of a function's first decorator: ``@torch.no_grad()`` above
``def generate``. A bar should name the ``def``. The code object does not
hold that line, so it is read from the source where the file is here: one
pass per file, by lines (no parse), and cached for the process. A file that
is missing, too large or not text leaves the line as recorded.
"""

from __future__ import annotations

import os
from functools import lru_cache

MAX_SOURCE_BYTES = 8 << 20  # a larger "source" is not one a person wrote: leave its lines alone
_DEFINES = ("def ", "async def ", "class ")


def def_line(file: str, first_line: int) -> int:
    """The ``def`` line of the function whose ``co_firstlineno`` is *first_line* in *file*; else *first_line*."""
    if first_line <= 0:
        return first_line
    return decorator_lines(file).get(first_line, first_line)


def decorator_lines(file: str) -> dict[int, int]:
    """First decorator line -> ``def`` line for *file* (empty where it is not a source file here).

    For callers that look up many lines of one file at once.
    """
    if not file or file.startswith("<"):
        return {}
    return _decorated(file)


@lru_cache(maxsize=4096)
def _decorated(file: str) -> dict[int, int]:
    """First decorator line -> ``def``/``class`` line, for every decorated definition of *file*."""
    try:
        if not os.path.isfile(file) or os.path.getsize(file) > MAX_SOURCE_BYTES:
            return {}
        with open(file, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return {}
    out: dict[int, int] = {}
    first = 0  # the first decorator line of the definition being read, 0 outside one
    for number, line in enumerate(lines, start=1):
        text = line.lstrip()
        if text.startswith("@") and not first:
            first = number
        elif first and text.startswith(_DEFINES):
            out[first] = number
            first = 0
    return out
