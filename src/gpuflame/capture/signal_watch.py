"""A SIGTERM that lands on another thread must still reach the main thread's handler.

gpuflame handles SIGTERM in Python (to write the profile before the process
dies), and CPython runs Python handlers only in the main thread, between
bytecodes. The kernel may hand a process-directed signal to any thread that
does not block it: torch starts a native thread at import, and when that
thread takes the SIGTERM while the main thread sleeps in a lock (a pool
worker waiting on its task queue, whose lock the parent holds while it
terminates the pool), the handler waits for a main thread that never wakes.
Without gpuflame the default action would have killed the process; with it
the program hung (seen in about one ``with Pool(): ...`` run in ten).

CPython writes each handled signal's number to the "wakeup fd". A small
thread reads it; when a SIGTERM's handler has not run within
:data:`GRACE_S`, it sends the main thread a no-op *nudge* signal of its own.
That interrupts the main thread's wait (EINTR), CPython then runs every
pending handler, the SIGTERM one included, and retries the wait (PEP 475).
The nudge is a real-time signal nobody handles (checked), so a stray one is
harmless. Where the program has its own wakeup fd (asyncio's signal
handlers) gpuflame leaves it alone and does without.
"""

from __future__ import annotations

import os
import select
import signal
import threading
from types import FrameType

GRACE_S = 0.5  # how long the main thread has to run a SIGTERM handler before it is nudged


def _no_op(signum: int, frame: FrameType | None) -> None:
    """The nudge's handler: its only job is to interrupt the main thread's wait."""


def _free_nudge() -> int | None:
    """A real-time signal with no handler of anyone's; None where there is none."""
    if not hasattr(signal, "SIGRTMAX"):
        return None
    for sig in range(signal.SIGRTMAX - 1, signal.SIGRTMAX - 8, -1):
        try:
            if signal.getsignal(sig) == signal.SIG_DFL:
                return sig
        except (ValueError, OSError):
            continue
    return None


class SignalWatch:
    """Reads the wakeup fd; nudges the main thread when a SIGTERM's handler is late."""

    def __init__(self) -> None:
        self._seen = 0  # SIGTERMs CPython's C handler took (one byte each on the wakeup fd)
        self._handled = 0  # of those, how many the main thread's Python handler has run
        self._changed = threading.Condition()
        self._pipe: tuple[int, int] | None = None
        self.nudge: int | None = None

    def start(self) -> bool:
        """Start watching; from the main thread only. False when this process cannot be watched."""
        nudge = _free_nudge()
        if nudge is None or not hasattr(signal, "pthread_kill"):
            return False
        r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        except (ValueError, OSError):
            old = None
        if old != -1:  # the program's own wakeup fd (or none could be set): keep out of its way
            if old is not None:
                signal.set_wakeup_fd(old)
            os.close(r)
            os.close(w)
            return False
        signal.signal(nudge, _no_op)
        self._pipe, self.nudge = (r, w), nudge
        main = threading.main_thread().ident
        threading.Thread(target=self._watch, args=(r, main), name="gpuflame-signal-watch", daemon=True).start()
        return True

    def restart_in_child(self) -> None:
        """After a fork: the parent's pipe and thread are not this process's; watch anew."""
        if self._pipe is None:
            return
        for fd in self._pipe:
            try:
                os.close(fd)
            except OSError:
                pass
        self._pipe = None
        try:
            signal.set_wakeup_fd(-1)
        except (ValueError, OSError):
            return
        self._seen = self._handled = 0
        self._changed = threading.Condition()
        self.start()

    def reclaim(self) -> None:
        """Make the watch's pipe the wakeup fd again where something cleared it since :meth:`start`.

        multiprocessing's forkserver child clears the wakeup fd it inherited
        (``set_wakeup_fd(-1)``) after the fork hooks ran, just before it runs
        its task: the watch then never heard of a SIGTERM, and a pool worker
        whose SIGTERM torch's thread took hung (about one run in eight).
        From the main thread; a wakeup fd the program set meanwhile is left alone.
        """
        if self._pipe is None or threading.current_thread() is not threading.main_thread():
            return
        ours = self._pipe[1]
        try:
            old = signal.set_wakeup_fd(ours, warn_on_full_buffer=False)
        except (ValueError, OSError):
            return
        if old not in (-1, ours):  # the program's own: give it back
            signal.set_wakeup_fd(old)

    def handled(self) -> None:
        """The main thread ran the SIGTERM handler (called first thing in it)."""
        with self._changed:
            self._handled += 1
            self._changed.notify_all()

    def _watch(self, r: int, main: int | None) -> None:
        poller = select.poll()
        poller.register(r, select.POLLIN)
        while True:
            try:
                poller.poll()
                data = os.read(r, 512)
            except BlockingIOError:
                continue
            except OSError:
                return  # the pipe was closed (a fork child watches with its own)
            if not data:
                return
            terms = data.count(signal.SIGTERM)
            if terms:
                with self._changed:
                    self._seen += terms
                self._nudge_if_late(main)

    def _nudge_if_late(self, main: int | None) -> None:
        with self._changed:
            if self._changed.wait_for(lambda: self._handled >= self._seen, timeout=GRACE_S):
                return
        if main is not None and self.nudge is not None:
            try:
                signal.pthread_kill(main, self.nudge)
            except (ValueError, OSError):
                pass
