"""One profiled process: its recorders, and writing their profile whatever happens.

The session's promise is the product's: the workload runs to its normal end
with its normal exit code. Every entry point here (start, periodic snapshot,
signal, exit, fork) catches its own failures, says once on stderr what was
lost, writes that into the session folder for the launcher to report, and
carries on without profiling.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from gpuflame.capture.base import Recorder
from gpuflame.capture.settings import Settings
from gpuflame.model import Profile, merge

PROCESS_FILE = "proc-{pid}.pb.gz"
LOST_FILE = "lost-{pid}.txt"


class Session:
    """Recorders of one process and the file they end up in."""

    def __init__(
        self,
        settings: Settings,
        write: Callable[[Profile, Path], None] | None = None,
        path: Path | None = None,
    ) -> None:
        self.settings = settings
        self._path = path
        self.recorders: list[Recorder] = []
        self.pid = os.getpid()
        self.lost: list[str] = []
        self._write = write or _save
        self._lock = threading.RLock()
        self._finished = False
        self._timer: threading.Thread | None = None
        self._stop_timer = threading.Event()
        self._previous_sigterm: Any = None
        self._forked = False
        # continuous mode: every written snapshot, then the end (ship/continuous.py)
        self.on_snapshot: list[Callable[[Profile], None]] = []
        self.on_finish: list[Callable[[], None]] = []

    # -- life cycle --------------------------------------------------------

    def add(self, recorder: Recorder) -> None:
        """Start *recorder* and keep it; a recorder that fails to start is reported and dropped."""
        try:
            recorder.start()
        except Exception as exc:
            self.report(f"the {recorder.name} backend failed to start ({exc}); nothing is recorded by it")
            return
        with self._lock:
            self.recorders.append(recorder)
        self._note_recorder_errors()
        # The framework just imported has registered its own exit handlers
        # (JAX frees its buffers at exit); atexit runs the latest first, so
        # finishing from here writes the profile before they run.
        atexit.register(self.finish)
        if self.settings.interval > 0 and self._timer is None:
            self._start_timer()

    def install_exit_hooks(self) -> None:
        """Write the profile at exit, on SIGTERM, and in fork children at their exit."""
        atexit.register(self.finish)
        self._install_sigterm()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._after_fork)
        try:
            import multiprocessing.util as mp_util

            # multiprocessing's fork children leave through os._exit: atexit never runs there
            mp_util.register_after_fork(self, Session._after_multiprocessing_fork)
        except Exception:  # pragma: no cover - multiprocessing missing is not our problem
            pass

    def finish(self) -> None:
        """Stop recording and write the final profile (once)."""
        with self._lock:
            if self._finished:
                return
            self._finished = True
        self._stop_timer.set()
        self.write()
        for recorder in list(self.recorders):
            try:
                recorder.stop()
            except Exception as exc:
                self.report(f"stopping the {recorder.name} backend failed ({exc})")
        for hook in list(self.on_finish):
            try:
                hook()
            except Exception as exc:
                self.report(f"finishing a profile consumer failed ({exc})")

    # -- writing ------------------------------------------------------------

    @property
    def path(self) -> Path:
        """Where this process's profile goes: the API's file, else one file per pid."""
        if self._path is not None and self.pid == os.getpid() and not self._forked:
            return self._path
        return Path(self.settings.session_dir) / PROCESS_FILE.format(pid=self.pid)

    def profile(self) -> Profile | None:
        """What the recorders know now, merged, with this process's pid; None if nothing."""
        profiles = []
        for recorder in list(self.recorders):
            try:
                profiles.append(recorder.snapshot())
            except Exception as exc:
                self.report(f"the {recorder.name} backend failed to take a snapshot ({exc}); its data is lost")
        if not profiles:
            return None
        merged = profiles[0] if len(profiles) == 1 else merge(profiles)
        return merge([merged], labels=[{"pid": self.pid}])

    def write(self) -> bool:
        """Write the current profile atomically; False (and reported) when it could not."""
        with self._lock:
            try:
                profile = self.profile()
                self._note_recorder_errors()
                if profile is None:
                    return False
                for message in self.lost:
                    profile.comments.append(f"pid {self.pid}: {message}")
                self._write(profile, self.path)
            except Exception as exc:
                self.report(f"could not write the profile to {self.path} ({exc}); this process's profile is lost")
                return False
        self._hand_out(profile)
        return True

    def _hand_out(self, profile: Profile) -> None:
        """Give the snapshot to the consumers (the Pyroscope pusher): they only queue it."""
        for hook in list(self.on_snapshot):
            try:
                hook(profile)
            except Exception as exc:
                self.report(f"a profile consumer failed ({exc})")

    # -- failures -----------------------------------------------------------

    def report(self, message: str, say: bool = True) -> None:
        """Say once on stderr what failed and what was lost; leave a note for the launcher."""
        if message in self.lost:
            return
        self.lost.append(message)
        if say:
            try:
                sys.stderr.write(f"gpuflame: {message}\n")
                sys.stderr.flush()
            except Exception:
                pass
        try:
            if self.settings.session_dir:
                with open(Path(self.settings.session_dir) / LOST_FILE.format(pid=self.pid), "a") as notes:
                    notes.write(message + "\n")
        except Exception:
            pass

    def _note_recorder_errors(self) -> None:
        """Recorders print their own first error; the launcher still needs to hear of it."""
        for recorder in list(self.recorders):
            for error in getattr(recorder, "errors", [])[:1]:
                self.report(error.removeprefix("gpuflame: "), say=False)

    # -- periodic snapshots ---------------------------------------------------

    def _start_timer(self) -> None:
        self._timer = threading.Thread(target=self._tick, name="gpuflame-snapshots", daemon=True)
        self._timer.start()

    def _tick(self) -> None:
        while not self._stop_timer.wait(self.settings.interval):
            started = time.monotonic()
            self.write()
            if time.monotonic() - started > self.settings.interval:
                # a snapshot slower than the interval would eat the workload's CPU
                self._stop_timer.wait(time.monotonic() - started)

    # -- signals and forks ----------------------------------------------------

    def _install_sigterm(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        try:
            self._previous_sigterm = signal.getsignal(signal.SIGTERM)
            signal.signal(signal.SIGTERM, self._on_sigterm)
        except (ValueError, OSError):
            self._previous_sigterm = None

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self.finish()
        previous = self._previous_sigterm
        if callable(previous):
            previous(signum, frame)
            return
        if previous == signal.SIG_IGN:
            return
        # the default action: die of SIGTERM, so the parent sees the same status
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    def _after_fork(self) -> None:
        """A forked child is a new process: its own pid, file and (fresh) timer."""
        self.pid = os.getpid()
        self._forked = True
        self.lost = []
        self._lock = threading.RLock()
        self._finished = not self.settings.follow
        self._stop_timer = threading.Event()
        self._timer = None
        if self.settings.follow and self.settings.interval > 0 and self.recorders:
            self._start_timer()
        for recorder in self.recorders:
            reset = getattr(recorder, "after_fork", None)
            if callable(reset):
                try:
                    reset()
                except Exception as exc:
                    self.report(f"the {recorder.name} backend could not follow a fork ({exc})")

    def _after_multiprocessing_fork(self) -> None:
        try:
            import multiprocessing.util as mp_util

            mp_util.Finalize(None, self.finish, exitpriority=0)
        except Exception as exc:
            self.report(f"could not hook the exit of a multiprocessing child ({exc}); its profile may be lost")


def _save(profile: Profile, path: Path) -> None:
    from gpuflame.formats import save

    save(profile, path)
