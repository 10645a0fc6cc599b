"""Start profiling in a process from the environment (``gpuflame run``, the webhook).

Called by the bootstrap ``sitecustomize`` before the workload's first line.
Nothing framework-specific is imported here: each backend starts right
after the workload imports its framework.
"""

from __future__ import annotations

import os
import weakref
from dataclasses import replace
from types import ModuleType

from gpuflame.capture import backends
from gpuflame.capture.post_import import when_imported
from gpuflame.capture.session import FRAMEWORKS, Session
from gpuflame.capture.settings import Settings

_session: Session | None = None
DEFAULT_PUSH_INTERVAL = 15.0  # seconds between pushes when Pyroscope is set and no interval is

BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "inject", "bootstrap")


def current_session() -> Session | None:
    return _session


def start_from_env() -> Session | None:
    """Start the session the environment asks for; None when profiling is off."""
    global _session
    settings = Settings.from_env()
    if not settings.enabled or _session is not None:
        return _session
    if settings.pyroscope_url and settings.interval <= 0:
        settings = replace(settings, interval=DEFAULT_PUSH_INTERVAL)
    _make_session_dir(settings.session_dir)
    session = Session(settings)
    session.install_exit_hooks()
    if settings.pyroscope_url:
        # imported only when asked: ssl and http.client cost start-up time
        from gpuflame.ship.continuous import attach

        attach(session)
    watch(session, settings.backend)
    if not settings.follow:
        stop_following()
    _session = session
    return session


def _make_session_dir(path: str) -> None:
    """The webhook names a per-container folder in a shared volume; make it on first start."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        pass  # the session reports the failed write, with the reason, when it saves


def watch(session: Session, backend: str) -> None:
    """Start the backend(s) once the workload imports their framework.

    The import hook holds the session weakly: a finished API session whose
    framework is never imported must not stay alive for the process's life.
    """
    ref = weakref.ref(session)
    if backend in FRAMEWORKS["torch"]:
        when_imported("torch", lambda torch: _start_torch(ref, backend, torch))
    if backend in FRAMEWORKS["jax"]:
        when_imported("jax", lambda jax: _add(ref, "jax"))


def _start_torch(ref: weakref.ref[Session], backend: str, torch: ModuleType) -> None:
    if backend == "auto":
        backend = "torch-cuda" if backends.cuda_available(torch) else "torch"
    _add(ref, backend)


def _add(ref: weakref.ref[Session], name: str) -> None:
    session = ref()
    if session is None or session.finished:
        return
    try:
        recorder = backends.create(name, session)
    except Exception as exc:
        session.report(f"the {name} backend is not available ({exc}); nothing is recorded by it")
        return
    session.add(recorder)


def stop_following() -> None:
    """Children of this process start without the profiler (``--no-follow``)."""
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != BOOTSTRAP_DIR]
    if parts:
        os.environ["PYTHONPATH"] = os.pathsep.join(parts)
    else:
        os.environ.pop("PYTHONPATH", None)
    os.environ.pop("GPUFLAME_ENABLED", None)
    os.environ.pop("GPUFLAME_SESSION_DIR", None)


