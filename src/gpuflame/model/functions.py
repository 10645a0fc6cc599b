"""A bar is a function: which frames are one function, and the frame that stands for it.

Frames that differ only in their line (a function allocating at two lines,
or calling on from two lines) are one bar, as in Grafana and pprof's
default; the flame tree, the viewer and the exports all ask here.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection
from functools import partial
from operator import itemgetter, ne

from gpuflame.model.profile import PYTHON, Frame, Profile
from gpuflame.symbols.def_lines import def_line

# How every note about missing definition lines starts (one note per profile).
DEF_LINES_UNKNOWN = "definition lines unknown"


def function_key(frame: Frame) -> tuple[str, str, str]:
    """What makes two frames the same function: everything but the line."""
    return (frame.name, frame.file, frame.kind)


def function_frames(frames: list[Frame]) -> list[Frame]:
    """For each frame, the frame that stands for its function: a function bar.

    Its line is where the function is defined (``start_line``, the ``def``),
    not a line it ran: a bar holds every line of the function, so the first
    line seen would name a line that may hold none of its bytes. Where no
    frame of the function knows its definition, the line is 0 (the bar
    shows the file only).
    """
    keys = list(map(_KEY, frames))
    starts = list(map(_START, frames))
    start = dict(zip(keys, starts, strict=True))  # each function's last start_line...
    if any(map(ne, map(start.__getitem__, keys), starts)):  # ...its greatest where they differ (rare)
        for key, line in zip(keys, starts, strict=True):
            start[key] = max(start[key], line)
    lines = [
        def_line(key[1], line) if line > 0 and key[2] == PYTHON else line  # the def, not a decorator
        for key, line in start.items()
    ]
    names, files, kinds = (map(itemgetter(i), start) for i in range(3))  # zip(*start) takes a million arguments
    # Frame(...) runs Python code per frame; tuple.__new__ builds the same NamedTuple in C
    bars = map(partial(tuple.__new__, Frame), zip(names, files, lines, kinds, lines, strict=True))
    out = dict(zip(start, bars, strict=True))
    return list(map(out.__getitem__, keys))


# function_key and start_line as C calls: a million-frame page asks for a million of each
_KEY = itemgetter(0, 1, 3)
_START = itemgetter(4)


def def_lines_note(files: Collection[str]) -> str:
    """The note for functions of *files* (distinct) whose ``def`` line is unknown: their bars show the file only.

    It names the first three in sorted order: not a sort of them all (a
    generated million-frame profile has 381k files, 0.5 s of sorting).
    """
    shown = ", ".join(heapq.nsmallest(3, files)) + (f" and {len(files) - 3} more files" if len(files) > 3 else "")
    return (
        f"{DEF_LINES_UNKNOWN} for functions of {shown} (the profile records only the lines that ran): "
        "their bars show the file without a line; --lines and explain show the lines they ran"
    )


def missing_def_lines_note(profile: Profile) -> str | None:
    """A note when Python functions of *profile* have no ``def`` line and no note says so yet."""
    if any(c.startswith(DEF_LINES_UNKNOWN) for c in profile.comments):
        return None
    files = {f.file for f in profile.frames if f.kind == PYTHON and f.file and not f.start_line}
    return def_lines_note(files) if files else None
