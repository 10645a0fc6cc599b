"""Frames from (code object, byte offset) pairs: how the live torch backends name what they record.

Recording keeps only code objects and instruction offsets (cheap, exact);
names (``co_qualname`` in the AKS guide's spelling), the line running and the
line the function starts at (``co_firstlineno``) are worked out here, once
per distinct pair and process, when a profile is built: a code object never
changes, so a host that records many short windows (a pytest test each)
does not name its 50-deep stacks again every time.
"""

from __future__ import annotations

import os
import sys
import weakref
from collections.abc import Callable, Iterable
from types import CodeType

from gpuflame.model.profile import Frame
from gpuflame.symbols.names import display_name

GPUFLAME_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep

# torch files whose frames at the leaf are dispatch plumbing, not callers
_PLUMBING = (
    "utils/_python_dispatch.py",
    "_ops.py",
    "_compile.py",
    "_dynamo/eval_frame.py",
    "_dynamo/external_utils.py",
)


# id(code) -> (the code, weakly; offset -> Frame): one per process, an entry leaves with its code object
_RESOLVED: dict[int, tuple[weakref.ref[CodeType], dict[int, Frame | None]]] = {}
_UNNAMED = Frame("")  # not looked up yet (None is a frame dropped)


class CodeFrames:
    """(code, offset) -> Frame, cached for the process; gpuflame's own frames resolve to None (dropped)."""

    def __init__(self) -> None:
        self._torch_dir = torch_dir()

    def frame(self, code: CodeType | None, lasti: int) -> Frame | None:
        if code is None:
            return None
        entry = _RESOLVED.get(id(code))
        if entry is None or entry[0]() is not code:  # new, or an id reused by a newer code object
            entry = (weakref.ref(code, _forget(id(code))), {})
            _RESOLVED[id(code)] = entry
        frames = entry[1]
        if lasti in frames:
            return frames[lasti]
        frame: Frame | None = None
        if not code.co_filename.startswith(GPUFLAME_DIR):
            frame = Frame(code_name(code), code.co_filename, line_of(code, lasti), start_line=code.co_firstlineno)
        frames[lasti] = frame
        return frame

    def python_frames(self, stack: Iterable[tuple[CodeType | None, int]]) -> list[Frame]:
        """The named frames of a stack's Python (code, offset) pairs, leaf first; native pairs (no code) skipped.

        :meth:`frame` inlined for the frames named already: a stack is 50 deep under pytest.
        """
        out: list[Frame] = []
        resolved = _RESOLVED
        for code, lasti in stack:
            if code is None:
                continue
            entry = resolved.get(id(code))
            frame = entry[1].get(lasti, _UNNAMED) if entry is not None and entry[0]() is code else _UNNAMED
            if frame is _UNNAMED:
                frame = self.frame(code, lasti)
            if frame is not None:
                out.append(frame)
        return out

    def strip_plumbing(self, frames: list[Frame]) -> list[Frame]:
        """Drop torch's dispatch plumbing at the leaf: the caller is the user's code above it."""
        start = 0
        root = self._torch_dir
        while start < len(frames) - 1:
            file = frames[start].file
            if not (root and file.startswith(root) and file[len(root) :] in _PLUMBING):
                break
            start += 1
        return frames[start:]


def _forget(key: int) -> Callable[[weakref.ref[CodeType]], None]:
    """Drop the entry of a code object that is gone (unless a newer one took its id already)."""

    def forget(ref: weakref.ref[CodeType]) -> None:
        entry = _RESOLVED.get(key)
        if entry is not None and entry[0] is ref:
            _RESOLVED.pop(key, None)

    return forget


def torch_dir() -> str:
    torch = sys.modules.get("torch")
    path = getattr(torch, "__file__", None)
    return os.path.dirname(path) + os.sep if path else ""


def code_name(code: CodeType) -> str:
    """The AKS guide's name for a code object: ``LlamaMLP > forward``."""
    qualname = getattr(code, "co_qualname", None)
    if qualname:
        return display_name(qualname)
    from gpuflame.symbols.qualnames import display  # Python 3.10: recover from the source

    return display(code.co_filename, code.co_firstlineno, code.co_name)


def line_of(code: CodeType, lasti: int) -> int:
    """The source line of byte offset *lasti* in *code*."""
    try:
        for start, end, line in code.co_lines():
            if start <= lasti < end and line is not None:
                return line
    except (AttributeError, ValueError):
        pass
    return code.co_firstlineno
