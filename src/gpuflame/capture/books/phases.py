"""The running phase of this process (``gpuflame.phase``), and who is told when it changes.

Runs inside the profiled program on every phase change: standard library
only, a few attribute stores. Phase names are interned to small ids (0 is
:data:`~gpuflame.model.phases.NONE`, the time before any mark) because the
recorders book them per allocation: the C++ hook as a marker frame of the
site, the dispatch recorder as an event in its queue, torch-cuda as a
timestamp to replay its trace against.

Without a recording, a change only moves the current id (so a recording
started later inside ``with gpuflame.phase("train")`` knows it is in
``train``): nothing is kept, nobody is told, nothing can fail.

While ``torch.compile`` traces the caller a mark does nothing: the compiled
graph runs as one call in the phase around it, and the mark's lock and
listeners would break the graph (the code then runs uncompiled) or fail it
under ``fullgraph=True``.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType

from gpuflame.model.phases import MAX_PHASES, MORE, NONE, check_name

Listener = Callable[[int, int], None]  # (phase id, epoch ns)

_lock = threading.Lock()
_names: list[str] = [NONE]
_ids: dict[str, int] = {NONE: 0}
_current = 0
_listeners: list[Listener] = []
_open: list[phase] = []  # the with blocks not yet ended, in the order they began (threads share them)
_clock = time.time_ns  # the moment a phase begins (tests of replayed traces set their own)


def intern(name: str) -> int:
    """The id of *name*; past :data:`MAX_PHASES` names, the id of :data:`MORE` (one bucket for the rest)."""
    found = _ids.get(name)
    if found is not None:
        return found
    with _lock:
        found = _ids.get(name)
        if found is None:
            if len(_names) >= MAX_PHASES:
                name = MORE
                found = _ids.get(MORE)
                if found is not None:
                    return found
            found = _ids[name] = len(_names)
            _names.append(name)
        return found


def name_of(phase_id: int) -> str:
    return _names[phase_id] if 0 <= phase_id < len(_names) else NONE


def current() -> int:
    return _current


def _traced() -> bool:
    """True while torch.compile traces the caller (it reads ``is_compiling()`` as True there, False at run time)."""
    compiler = sys.modules.get("torch.compiler")
    return compiler is not None and bool(compiler.is_compiling())


def switch(phase_id: int) -> int:
    """Make *phase_id* the running phase; the one before. Listeners are told only of a change."""
    global _current
    previous = _current
    if phase_id == previous:
        return previous
    _current = phase_id
    if _listeners:
        now = _clock()
        for listener in list(_listeners):
            try:
                listener(phase_id, now)
            except Exception:  # noqa: BLE001 - a recorder's failure never reaches the program
                pass
    return previous


def listen(listener: Listener) -> None:
    with _lock:
        if listener not in _listeners:
            _listeners.append(listener)


def unlisten(listener: Listener) -> None:
    with _lock:
        if listener in _listeners:
            _listeners.remove(listener)


class phase:  # noqa: N801 - used as a function: gpuflame.phase("train")
    """Mark a phase of the program: ``gpuflame.phase("serve")`` or ``with gpuflame.phase("train"): ...``.

    The phase starts at the call and runs until the next mark; as a context
    manager it ends at the block's end, where the phase around it (if any)
    runs again, so ``with`` blocks nest. Every sample then carries a label
    ``phase`` (the phase its memory was allocated in), and ``gpuflame
    report`` shows each phase's own peak. A phase is the whole process's
    (every thread's), as a program's phases are: a block that ends while
    a block begun later (another thread's) still runs leaves that one's
    phase running. Without a recording it does nothing, and inside code
    torch.compile traces it does nothing either (the compiled call runs in
    the phase around it); a bad name (empty, over 64 characters) raises
    ValueError.
    """

    __slots__ = ("name", "_previous")

    def __init__(self, name: str) -> None:
        self.name = check_name(name)
        self._previous = None if _traced() else switch(intern(name))

    def __enter__(self) -> phase:
        if self._previous is not None:
            with _lock:
                _open.append(self)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._previous is None:
            return
        with _lock:
            at = next((i for i, b in enumerate(_open) if b is self), None)
            if at is not None:
                del _open[at]
                if at < len(_open):  # a block begun since (another thread's) still runs: its phase stays,
                    _open[at]._previous = self._previous  # and its end hands back what ran before this one
                    return
        switch(self._previous)

    def __repr__(self) -> str:
        return f"gpuflame.phase({self.name!r})"
