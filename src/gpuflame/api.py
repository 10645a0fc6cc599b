"""The Python API: profile a block of code from inside the program.

    import gpuflame

    with gpuflame.profile("step.pb.gz"):
        train_step()

    gpuflame.start("serve.pb.gz", backend="torch")
    ...
    gpuflame.stop()          # writes the file; returns its path

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

from gpuflame.capture.autostart import watch
from gpuflame.capture.session import Session
from gpuflame.capture.settings import BACKENDS, Settings

_lock = threading.Lock()
_active: Session | None = None


def start(output: str | os.PathLike[str] = "gpuflame.pb.gz", backend: str = "auto", interval: float = 0.0) -> Session:
    """Start recording this process; the backend starts when its framework is imported."""
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


def stop() -> Path | None:
    """Stop recording and write the profile; its path, or None if nothing was written."""
    global _active
    with _lock:
        session, _active = _active, None
    if session is None:
        return None
    session.finish()
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
