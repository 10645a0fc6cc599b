"""Continuous mode: every snapshot of a profiled process goes to Pyroscope.

:func:`attach` hooks a :class:`~gpuflame.capture.session.Session`: each
``write()`` (every interval, at a CUDA OOM, at exit and on SIGTERM) submits its
since-start snapshot; the pusher's thread turns it into the interval's profile
(:mod:`gpuflame.ship.window`) and pushes it. At the session's end the queue is
flushed within ``settings.pyroscope_flush`` seconds.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from gpuflame.ship.pusher import Pusher
from gpuflame.ship.pyroscope import Credentials, PyroscopeClient, base_labels, service_name
from gpuflame.ship.window import IntervalWindow

if TYPE_CHECKING:
    from gpuflame.boundary.settings import Settings
    from gpuflame.capture.session import Session
    from gpuflame.model import Profile


class ContinuousPush:
    """One pusher per process: a fork child gets its own (threads do not survive fork)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        credentials = Credentials.from_env(
            user=settings.pyroscope_user,
            token_file=settings.pyroscope_token_file,
            password_file=settings.pyroscope_password_file,
        )
        self.client = PyroscopeClient(
            settings.pyroscope_url,
            credentials=credentials,
            tenant=settings.tenant or None,
            ca_file=settings.pyroscope_ca or None,
            timeout=settings.pyroscope_timeout,
        )
        self.labels = base_labels(service_name(settings.service_name))
        self._pid = 0
        self._pusher: Pusher | None = None

    def pusher(self) -> Pusher:
        if self._pusher is None or self._pid != os.getpid():
            window = IntervalWindow()
            self._pid = os.getpid()
            self._pusher = Pusher(
                lambda profile: self.client.push(profile, self.labels),
                prepare=window.next,
                name=f"pyroscope push (pid {self._pid})",
            )
        return self._pusher

    def submit(self, profile: Profile) -> None:
        self.pusher().submit(profile)

    def close(self) -> None:
        if self._pusher is not None and self._pid == os.getpid():
            self._pusher.close(self.settings.pyroscope_flush)


def attach(session: Session) -> ContinuousPush | None:
    """Push the session's snapshots when its settings name a Pyroscope; failures are reported, never raised."""
    if not session.settings.pyroscope_url:
        return None
    try:
        push = ContinuousPush(session.settings)
    except Exception as exc:  # noqa: BLE001 - the workload runs regardless
        session.report(f"pushing to Pyroscope is off: {exc}")
        return None
    session.on_snapshot.append(push.submit)
    session.on_finish.append(push.close)
    return push
