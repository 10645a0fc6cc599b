"""The process's exit paths, hooked once: atexit, SIGTERM, fork and exec, forwarded to the running sessions.

One object per process, installed with the first session, so that profiling
a block of code six times leaves one atexit entry, one SIGTERM handler and
one fork hook, and no finished session kept alive by any of them. Modules
that reset their own state in a fork child hand that step to
:meth:`ExitHooks.at_fork_child` instead of registering their own.

``exec`` ends the process image too: ``os.execv``/``os.execve`` (which
every ``os.exec*`` and ``pty`` go through) are wrapped so that a process
that recorded since its start writes first, and a fork child that only
runs another program is not taken for a lost process.

A signal that arrives while the profile is being written at exit (a pool's
``terminate()`` SIGTERMs workers that are in their exit finalizer) must not
cut the write short: :func:`signals_held` holds it until the session is
done, then lets it act as it would have, so the exit status stays the one
the signal makes.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any, Protocol

from gpuflame.capture.signal_watch import SignalWatch

try:  # signal's own C functions, without its enum wrapping (3 us a call): a host stops a profile per test
    import _signal as _raw_signal
except ImportError:  # pragma: no cover - not CPython
    _raw_signal = signal


class Session(Protocol):
    """What the hooks call on a running session (``capture/session.py``'s, which attaches itself)."""

    @property
    def finished(self) -> bool: ...
    def finish(self, write: bool = True) -> None: ...
    def write(self) -> bool: ...
    def after_fork(self, to_exec: bool = False) -> None: ...
    def before_exec(self) -> None: ...
    def report(self, message: str, say: bool = True) -> None: ...


HELD_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP") if hasattr(signal, name))
_exiting = False  # set once the exit hooks run: the process is leaving


class ExitHooks:
    """atexit, SIGTERM and fork hooks that forward to the running sessions (``gpuflame run``'s, the API's)."""

    def __init__(self) -> None:
        self.sessions: list[Session] = []  # running ones; a session leaves when it finishes
        self._installed = False
        self._sigterm_installed = False
        self._previous_sigterm: Any = None
        self._signal_watch = SignalWatch()
        self._fork_hooked = False
        self._fork_resets: list[Callable[[], None]] = []  # modules' own state, reset in every fork child

    def attach(self, session: Session) -> None:
        """Write *session* at the process's exit (and on SIGTERM, and in fork children)."""
        self._install()
        self.sessions.append(session)

    def detach(self, session: Session) -> None:
        """*session* is finished: the hooks no longer hold it."""
        if session in self.sessions:
            self.sessions.remove(session)

    def at_fork_child(self, reset: Callable[[], None]) -> None:
        """Run *reset* in every fork child, after the sessions: a module's locks, its running recorder.

        Modules hand their fork step here instead of registering their own,
        so that a fork child runs each step once, in a known order.
        """
        self._fork_resets.append(reset)
        self._hook_fork()

    def to_front(self) -> None:
        """Run before the exit handlers registered so far (JAX frees its buffers in one).

        atexit runs the latest registration first; a framework imported after
        us registered its own handlers since.
        """
        atexit.unregister(self.at_exit)
        atexit.register(self.at_exit)

    # -- the hooks ------------------------------------------------------------

    def at_exit(self) -> None:
        global _exiting
        _exiting = True  # the interpreter is leaving: see signals_held
        for session in reversed(list(self.sessions)):  # the latest started first, as atexit would
            session.finish()

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self._signal_watch.handled()
        previous = self._previous_sigterm
        if callable(previous) or previous == signal.SIG_IGN:
            # the program goes on, or leaves through its own handler (atexit then writes the
            # final profile): a snapshot now, and recording goes on
            for session in list(self.sessions):
                session.write()
            if callable(previous):
                previous(signum, frame)
            return
        self.at_exit()
        # the default action: die of SIGTERM, so the parent sees the same status
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    def _after_fork(self) -> None:
        to_exec = _forking_to_exec()
        if not to_exec:
            self._signal_watch.restart_in_child()
        for session in list(self.sessions):
            session.after_fork(to_exec=to_exec)
        for reset in list(self._fork_resets):
            try:
                reset()
            except Exception:  # noqa: BLE001 - one module's reset must not stop the others'
                pass

    def _before_exec(self) -> None:
        for session in reversed(list(self.sessions)):
            session.before_exec()

    def _after_multiprocessing_fork(self) -> None:
        """multiprocessing's fork children leave through os._exit after its finalizers: atexit never runs.

        A forkserver child has also cleared the signal watch's wakeup fd by now: it is set again.
        """
        self._signal_watch.reclaim()
        running = [s for s in self.sessions if not s.finished]
        if not running:
            return
        try:
            import multiprocessing.util as mp_util

            mp_util.Finalize(None, self.at_exit, exitpriority=0)
        except Exception as exc:
            running[0].report(f"could not hook the exit of a multiprocessing child ({exc}); its profile may be lost")

    # -- installing -------------------------------------------------------------

    def _install(self) -> None:
        self._install_sigterm()
        if self._installed:
            return
        self._installed = True
        atexit.register(self.at_exit)
        self._hook_fork()
        for name in ("execv", "execve"):
            if hasattr(os, name):
                setattr(os, name, _calling_first(self._before_exec, getattr(os, name)))
        try:
            import multiprocessing.util as mp_util

            mp_util.register_after_fork(self, ExitHooks._after_multiprocessing_fork)
        except Exception:  # pragma: no cover - multiprocessing missing is not our problem
            pass

    def _hook_fork(self) -> None:
        if self._fork_hooked or not hasattr(os, "register_at_fork"):
            return
        self._fork_hooked = True
        os.register_at_fork(after_in_child=self._after_fork)

    def _install_sigterm(self) -> None:
        """Once, from the main thread (the only one allowed to set handlers)."""
        if self._sigterm_installed or threading.current_thread() is not threading.main_thread():
            return
        try:
            self._previous_sigterm = signal.getsignal(signal.SIGTERM)
            signal.signal(signal.SIGTERM, self._on_sigterm)
            self._sigterm_installed = True
        except (ValueError, OSError):
            self._previous_sigterm = None
            return
        try:  # a SIGTERM taken by another thread must still reach this handler (capture/signal_watch.py)
            self._signal_watch.start()
        except Exception:  # noqa: BLE001 - without the watch, SIGTERM handling is as before
            pass


HOOKS = ExitHooks()


def _calling_first(hook: Callable[[], None], real: Callable[..., Any]) -> Callable[..., Any]:
    """*real*, with *hook* run just before it (never stopping it)."""

    @functools.wraps(real)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            hook()
        except Exception:  # noqa: BLE001 - the exec must happen regardless
            pass
        return real(*args, **kwargs)

    return wrapper


def _forking_to_exec() -> bool:
    """Whether this fork child is subprocess's, about to run another program (its preexec_fn ran our hook)."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "_execute_child" and frame.f_code.co_filename.endswith("subprocess.py"):
            return True
        frame = frame.f_back
    return False


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Hold SIGTERM, SIGINT and SIGHUP until the block ends, then deliver them as they would have been.

    Only the main thread may change handlers; elsewhere the block runs
    unprotected (a signal's handler then waits for this thread's write).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    previous: dict[int, Any] = {}
    for sig in HELD_SIGNALS:
        try:
            handler = _raw_signal.getsignal(sig)
            if handler is None:  # set outside Python: it could not be put back
                continue
            previous[sig] = _raw_signal.signal(sig, lambda signum, _frame: arrived.append(signum))
        except (ValueError, OSError):
            continue
    try:
        yield
    finally:
        for sig, handler in previous.items():
            _raw_signal.signal(sig, handler)
        for sig in dict.fromkeys(arrived):
            if _exiting and sig == signal.SIGINT and previous.get(sig) is signal.default_int_handler:
                # the interpreter is leaving: a KeyboardInterrupt now would only print a traceback
                # from the exit hook (a SIGINT sent to the whole group, which the launcher also passed on)
                continue
            signal.raise_signal(sig)
