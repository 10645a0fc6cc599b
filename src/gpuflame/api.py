"""The Python API: profile a block of code from inside the program.

    import gpuflame

    with gpuflame.profile("step.pb.gz"):
        train_step()

    gpuflame.start("serve.pb.gz", backend="torch")
    ...
    gpuflame.stop()          # writes the file; returns its path

Unlike ``gpuflame run``, the API profiles this process only (not its
children). Like it, it never raises into the program: a failure is one line
on stderr and a profile that says what it lost.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

from gpuflame.capture.autostart import watch
from gpuflame.capture.session import Session
from gpuflame.capture.settings import BACKENDS, Settings

_lock = threading.Lock()
_active: Session | None = None


def start(output: str | os.PathLike[str] = "gpuflame.pb.gz", backend: str = "auto", interval: float = 0.0) -> Session:
    """Start recording this process; the backend starts when its framework is imported."""
    global _active
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
    with _lock:
        if _active is not None:
            raise RuntimeError("gpuflame is already profiling this process; call gpuflame.stop() first")
        path = Path(output).resolve()
        settings = Settings(session_dir=str(path.parent), backend=backend, interval=interval, follow=False)
        session = Session(settings, path=path)
        session.install_exit_hooks()
        watch(session, backend)
        _active = session
        return session


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
    """Profile the ``with`` block; the file is written when the block ends, even by an exception."""
    session = start(output, backend, interval)
    try:
        yield session
    finally:
        stop()
