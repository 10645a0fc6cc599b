"""Start profiling in a process from the environment (``gpuflame run``, the webhook).

Called by the bootstrap ``sitecustomize`` before the workload's first line.
Nothing framework-specific is imported here: each backend starts right
after the workload imports its framework.
"""

from __future__ import annotations

import os
import weakref
from dataclasses import replace

from gpuflame.boundary import backends
from gpuflame.boundary.contract import stop_following
from gpuflame.boundary.settings import Settings
from gpuflame.capture import children, recorders
from gpuflame.capture.post_import import when_imported
from gpuflame.capture.session import Session
from gpuflame.defaults import PUSH_INTERVAL_S

_session: Session | None = None


def current_session() -> Session | None:
    return _session


def start_from_env() -> Session | None:
    """Start the session the environment asks for; None when profiling is off."""
    global _session
    settings = Settings.from_env()
    if not settings.enabled or _session is not None:
        return _session
    if settings.pyroscope_url and settings.interval <= 0:
        settings = replace(settings, interval=PUSH_INTERVAL_S)
    _make_session_dir(settings.session_dir)
    session = Session(settings)
    session.install_exit_hooks()
    if settings.pyroscope_url:
        # imported only when asked: ssl and http.client cost start-up time
        from gpuflame.capture.continuous import attach

        attach(session)
    watch(session, settings.backend)
    if not settings.follow:
        stop_following()
    elif settings.session_dir:
        ref = weakref.ref(session)
        when_imported("subprocess", lambda module: children.watch(module, lambda message: _report(ref, message)))
    _session = session
    return session


def _make_session_dir(path: str) -> None:
    """The webhook names a per-container folder in a shared volume; make it on first start, private (700)."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError:
        pass  # the session reports the failed write, with the reason, when it saves


def watch(session: Session, backend: str) -> None:
    """Start the backend(s) once the workload imports their framework (boundary/backends.py picks which).

    The import hook holds the session weakly: a finished API session whose
    framework is never imported must not stay alive for the process's life.
    """
    ref = weakref.ref(session)
    for framework in backends.frameworks(backend):
        when_imported(framework, lambda module: _add(ref, backends.for_framework(backend, module)))


def _report(ref: weakref.ref[Session], message: str) -> None:
    session = ref()
    if session is not None:
        session.report(message)


def _add(ref: weakref.ref[Session], name: str) -> None:
    session = ref()
    if session is None or session.finished:
        return
    try:
        recorder = recorders.create(name, session)
    except Exception as exc:
        session.report(f"the {name} backend is not available ({exc}); nothing is recorded by it")
        return
    session.add(recorder)
