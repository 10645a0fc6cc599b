"""The Python API: profile a block of code from inside the program.

    import gpuflame

    with gpuflame.profile("step.pb.gz"):
        train_step()

    gpuflame.start("serve.pb.gz", backend="torch")
    ...
    gpuflame.stop()          # writes the file; returns its path

    gpuflame.start("step.pb.gz")
    ...
    profile = gpuflame.stop(write=False)   # no file: the Profile itself
                                           # (step.pb.gz is written only if the process exits first)

Unlike ``gpuflame run``, the API profiles this process only (not its
children). Like it, it never raises into the program: a failure is one line
on stderr and a profile that says what it lost. A ``start()`` while a
profile is running is a warning and changes nothing: the running profile
goes on, and only the ``stop()`` (or ``with`` block) that started it ends it.
"""

from __future__ import annotations

import contextlib
import os
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Literal, overload

from gpuflame.capture.autostart import watch
from gpuflame.capture.session import Session
from gpuflame.capture.settings import BACKENDS, Settings
from gpuflame.model import Profile

_lock = threading.Lock()
_active: Session | None = None


def start(output: str | os.PathLike[str] = "gpuflame.pb.gz", backend: str = "auto", interval: float = 0.0) -> Session:
    """Start recording this process into *output*; the backend starts when its framework is imported.

    Returns the session (the running one, with a warning, when a profile is
    running already); raises ValueError for a backend not in ``BACKENDS``.
    """
    return _start(output, backend, interval)[0]


def _start(output: str | os.PathLike[str], backend: str, interval: float) -> tuple[Session, bool]:
    """The session that records now, and whether this call started it."""
    global _active
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
    with _lock:
        if _active is not None:
            warnings.warn(
                f"gpuflame is already profiling this process into {_active.path}; this start() is ignored "
                "and that profile goes on until its own stop()",
                RuntimeWarning,
                stacklevel=3,
            )
            return _active, False
        path = Path(output).resolve()
        # no session folder: the API writes one file, and notes of what was lost go into it
        settings = Settings(backend=backend, interval=interval, follow=False)
        session = Session(settings, path=path)
        session.install_exit_hooks()
        watch(session, backend)
        _active = session
        return session, True


@overload
def stop(*, write: Literal[True] = ...) -> Path | None: ...


@overload
def stop(*, write: Literal[False]) -> Profile | None: ...


def stop(*, write: bool = True) -> Path | Profile | None:
    """Stop recording and write the profile; its path, or None if nothing was written.

    ``write=False`` writes no file and returns the :class:`~gpuflame.Profile`
    itself (what the file would hold, notes of what was lost included), or
    None when nothing was recorded or nothing is running: for code that reads
    the numbers at once, as the pytest plugin and the notebook magic do,
    without paying for encoding a file and reading it back. Never raises.
    """
    global _active
    with _lock:
        session, _active = _active, None
    if session is None:
        return None
    session.finish(write=write)
    if not write:
        return session.result
    return session.path if session.path.exists() else None


@contextlib.contextmanager
def profile(
    output: str | os.PathLike[str] = "gpuflame.pb.gz", backend: str = "auto", interval: float = 0.0
) -> Iterator[Session]:
    """Profile the ``with`` block; the file is written when the block ends, even by an exception.

    Inside a running profile the block is part of that one (with a warning).
    """
    session, started = _start(output, backend, interval)
    try:
        yield session
    finally:
        if started:
            stop()
