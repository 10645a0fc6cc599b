"""Python stacks for the dispatch recorder: cheap keys while recording, frames when a profile is built.

Stacks cost O(1) per operation in the common case: see :class:`Stacks`.
"""

from __future__ import annotations

import sys
import threading
from types import CodeType, FrameType
from typing import Any

from gpuflame.capture.code_frames import CodeFrames
from gpuflame.model.profile import Frame


class _Tag(int):
    """Marks a running frame with the node of the stack above it (see :class:`Stacks`).

    Stored in ``frame.f_trace``, which CPython only calls while a tracer
    (``sys.settrace``) is active; tags are written only when none is, and a
    tag that does get called (a tracer installed later) does nothing. An int
    subclass: made without running Python code, and usable as the node.
    """

    __slots__ = ()

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        return None


_GENERATOR_FLAGS = 0x20 | 0x80 | 0x100 | 0x200  # generator, coroutine, iterable coroutine, async generator


class Stacks:
    """Python stacks as a tree of nodes ``(parent node, id(code), f_lasti)``; a stack is its leaf node.

    Walking a deep stack for every allocation would cost more than the
    allocation. But a running frame's callers never change while it runs, so
    the first walk through a frame leaves a tag on it (``f_trace``) holding
    the node of everything above it; later walks stop at the first tagged
    frame, which is usually the leaf itself. Generator and coroutine frames
    change callers between resumptions and are never tagged.

    Code objects of every node are kept alive so their ids stay unique.
    Names (``co_qualname``) and lines (``co_lines()``) are resolved only when
    a profile is built, once per distinct (code, offset).
    """

    def __init__(self) -> None:
        self.nodes: list[tuple[int, int, int]] = []
        self.node_of: dict[tuple[int, int, int], int] = {}
        self.codes: dict[int, CodeType] = {}
        self.lock = threading.Lock()
        self._frames = CodeFrames()

        class Tag(_Tag):
            __slots__ = ()

        self.Tag = Tag  # one class per instance: tags of an earlier recorder are not ours

    def above(self, f: FrameType) -> int:
        """The node of *f*'s callers, tagging the untagged frames on the way.

        Called for every frame's first allocation, so written flat.
        """
        chain: list[FrameType] = []
        g: FrameType | None = f
        node = -1
        Tag = self.Tag
        while g is not None:
            tag = g.f_trace
            if type(tag) is Tag:  # g's callers are known; add g itself
                node = self.node((tag, id(g.f_code), g.f_lasti), g.f_code)
                break
            chain.append(g)
            g = g.f_back
        may_tag = sys.gettrace() is None
        node_of = self.node_of
        for g in reversed(chain):
            code = g.f_code
            # generators and coroutines change callers between resumptions: never tagged
            if may_tag and not code.co_flags & _GENERATOR_FLAGS:
                old = g.f_trace
                if old is None or isinstance(old, _Tag):
                    g.f_trace = Tag(node)
            if g is f:
                break
            key = (node, id(code), g.f_lasti)
            found = node_of.get(key)
            node = found if found is not None else self.node(key, code)
        return node

    def node(self, key: tuple[int, int, int], code: CodeType) -> int:
        """The node ``(parent, id(code), f_lasti)``, made on first sight."""
        found = self.node_of.get(key)
        if found is not None:
            return found
        with self.lock:
            node = self.node_of.get(key)
            if node is None:
                self.codes.setdefault(key[1], code)
                node = self.node_of[key] = len(self.nodes)
                self.nodes.append(key)
            return node

    def frames(self, node: int) -> list[Frame]:
        """The stack's frames, leaf first, without gpuflame's own frames or leaf plumbing."""
        out: list[Frame] = []
        nodes = self.nodes
        codes = self.codes
        while node >= 0:
            parent, code_id, lasti = nodes[node]
            frame = self._frames.frame(codes.get(code_id), lasti)
            if frame is not None:
                out.append(frame)
            node = parent
        return self._frames.strip_plumbing(out)
