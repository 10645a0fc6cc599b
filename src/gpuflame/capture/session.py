"""One profiled process: its recorders, and writing their profile whatever happens.

The session's promise is the product's: the workload runs to its normal end
with its normal exit code. Every entry point here (start, periodic snapshot,
signal, exit, fork) catches its own failures, says once on stderr what was
lost, writes that into the session folder for the launcher to report, and
carries on without profiling.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from itertools import chain
from pathlib import Path

from gpuflame.boundary import backends, ranks, roll_call, session_folder
from gpuflame.boundary.contract import IDLE_FILE, LOST_FILE, PROCESS_FILE
from gpuflame.boundary.settings import Settings
from gpuflame.capture.base import Recorder
from gpuflame.capture.exit_hooks import HOOKS, signals_held
from gpuflame.errors import GpuflameError
from gpuflame.gcpause import gc_paused
from gpuflame.model import Profile, merge
from gpuflame.model.processes import ProcessInfo, bounded_argv

FINISH_WAIT_S = 60.0  # how long a signal handler waits for another thread's final write


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
        self._finishing: int | None = None  # the thread writing the final profile
        self._done = threading.Event()
        self._timer: threading.Thread | None = None
        self._stop_timer = threading.Event()
        self._forked = False
        # continuous mode: every written snapshot, then the end (capture/continuous.py)
        self.on_snapshot: list[Callable[[Profile], None]] = []
        self.on_finish: list[Callable[[], None]] = []
        self.result: Profile | None = None  # the final profile, once finished (None when nothing was recorded)

    # -- life cycle --------------------------------------------------------

    @property
    def finished(self) -> bool:
        return self._finished

    def add(self, recorder: Recorder) -> None:
        """Start *recorder* and keep it; a recorder that fails to start is reported and dropped."""
        if self._finished:
            return
        try:
            recorder.start()
        except Exception as exc:
            self.report(f"the {recorder.name} backend failed to start ({exc}); nothing is recorded by it")
            return
        with self._lock:
            first = not self.recorders
            self.recorders.append(recorder)
        self._note_recorder_errors()
        if first:
            _prepare_writer()
            self._register()
        # The framework just imported has registered its own exit handlers
        # (JAX frees its buffers at exit); finishing before them writes the
        # profile while its buffers are still there.
        HOOKS.to_front()
        if self.settings.interval > 0 and self._timer is None:
            self._start_timer()

    def install_exit_hooks(self) -> None:
        """Write the profile at exit, on SIGTERM, and in fork children at their exit (one session at a time)."""
        HOOKS.attach(self)

    def finish(self, write: bool = True, build: bool = True) -> None:
        """Stop recording and write the final profile (once; a signal meanwhile waits for the file).

        *write* False keeps it in :attr:`result` without writing a file (the
        API's ``stop(write=False)``: a host that reads the numbers at once).
        *build* False (with *write* False) builds no profile at all: a host that
        had the numbers it needs from :meth:`peak_now` (the pytest plugin's passing tests).
        Signals are held from the first line: one that came between marking
        the session finished and holding them would find it "already
        finishing" and kill the process before anything was written.
        """
        with signals_held():
            me = threading.get_ident()
            with self._lock:
                first = not self._finished
                if first:
                    self._finished, self._finishing = True, me
            if not first:
                if self._finishing != me:
                    self._done.wait(FINISH_WAIT_S)  # another thread is writing: its file first, then the signal
                return
            try:
                self._finish(write, build or write)
            finally:
                self._done.set()

    def _finish(self, write: bool, build: bool = True) -> None:
        self._stop_timer.set()
        # those that hand their books over instead of copying them: stopped first
        first = [r for r in self.recorders if getattr(r, "final_after_stop", False)]
        with gc_paused():  # what they copy out is many small objects: no collection walks torch's meanwhile
            self._stop_recorders(first)
            self.result = self._take(to_file=write) if build else None
        self._stop_recorders([r for r in self.recorders if r not in first])
        for hook in list(self.on_finish):
            try:
                hook()
            except Exception as exc:
                self.report(f"finishing a profile consumer failed ({exc})")
        if self.settings.session_dir:
            if not self.recorders:
                self._note_idle()
            roll_call.unregister(self.settings.session_dir, self.pid)
        HOOKS.detach(self)

    def _stop_recorders(self, recorders: list[Recorder]) -> None:
        for recorder in recorders:
            try:
                recorder.stop()
            except Exception as exc:
                self.report(f"stopping the {recorder.name} backend failed ({exc})")

    def after_fork(self, to_exec: bool = False) -> None:
        """In a forked child: a new process with its own pid, file and (fresh) timer.

        The recorders reset their own state at a fork (``HOOKS.at_fork_child``);
        the session only takes the child's identity. A child that is about to
        run another program (*to_exec*) records nothing of its own.
        """
        self.pid = os.getpid()
        self._forked = True
        self.lost = []
        self._lock = threading.RLock()
        self._done = threading.Event()
        self._finishing = None
        self._stop_timer = threading.Event()
        self._timer = None
        self._finished = self._finished or not self.settings.follow or to_exec
        if self._finished:
            self._done.set()
            HOOKS.detach(self)
            return
        if not self.recorders:
            return
        self._register()
        if self.settings.interval > 0:
            self._start_timer()

    def before_exec(self) -> None:
        """The process image is about to be replaced: write what it recorded, unless it is a fork child.

        A fork child that execs (``os.fork()`` then ``os.execvp()``, ``pty``)
        only ran another program: it leaves the roll call without a word.
        """
        if not self._forked:
            self.finish()
            return
        with self._lock:
            self._finished = True
        self._stop_timer.set()
        self._done.set()
        if self.settings.session_dir:
            roll_call.unregister(self.settings.session_dir, self.pid)

    def _register(self) -> None:
        if self.settings.session_dir:
            problem = roll_call.register(self.settings.session_dir, self.pid)
            if problem:
                self.report(problem)

    # -- writing ------------------------------------------------------------

    @property
    def path(self) -> Path:
        """Where this process's profile goes: the API's file, else one file per pid."""
        if self._path is not None and self.pid == os.getpid() and not self._forked:
            return self._path
        return Path(self.settings.session_dir) / PROCESS_FILE.format(pid=self.pid)

    def _write_file(self, profile: Profile) -> None:
        """Write *profile* to :attr:`path`: a file of the run's folder through its descriptor (session_folder.py)."""
        path = self.path
        if self._write is not _save or path == self._path or not self.settings.session_dir:  # the API's file
            self._write(profile, path)
            return
        with session_folder.opened(self.settings.session_dir) as folder:
            session_folder.write_file(folder, path.name, _dumps(profile))

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
        return self._with_pid(profiles[0] if len(profiles) == 1 else merge(profiles))

    def peak_now(self) -> tuple[int, int] | None:
        """The window's peak and in-use bytes so far, cheaply, where its one recorder can say them; else None.

        Equal to the peak_space and inuse_space totals of the profile built now.
        """
        recorders = list(self.recorders)
        if len(recorders) != 1 or recorders[0].errors:  # several: their joint peak is the merged profile's
            return None
        return recorders[0].peak_now()

    def _with_pid(self, profile: Profile) -> Profile:
        """*profile* with this process's pid (and rank, where a launcher gave one) on every sample and
        timeline series, and this process's description (:mod:`gpuflame.model.processes`).

        A recorder that put the labels there itself (the torch ones put the
        pid) is taken as it is: merging a profile only to add a label it has
        costs more than a small test (a host records a window per test). The
        rank is read at each profile, not at start: a rank written into the
        process's own environment after it started is seen too.
        """
        labels = {"pid": str(self.pid), **ranks.rank_labels(os.environ)}
        wanted = tuple(labels.items())
        series = profile.timeline.series if profile.timeline is not None else {}
        have = chain((s.labels for s in profile.samples), series)
        if not all(pair in found for found in have for pair in wanted):
            profile = merge([profile], labels=[labels])
        profile.processes = [self._describe(profile, labels)]
        return profile

    def _describe(self, profile: Profile, labels: dict[str, str]) -> ProcessInfo:
        """Who this process is and its own peak: what a merged profile's per-process table needs."""
        index = profile.type_names().index("peak_space") if "peak_space" in profile.type_names() else -1
        rows = profile.label_set_totals()  # a few label sets: one pass over the samples
        peak = sum(row.totals[index] for row in rows) if index >= 0 else 0
        devices = sorted({dict(row.labels).get("device", "") for row in rows} - {""})
        line = profile.timeline.total() if profile.timeline is not None else []
        when = max(line, key=lambda p: p[1])[0] if line else 0
        return ProcessInfo(
            pid=str(self.pid),
            rank=labels.get(ranks.RANK, ""),
            local_rank=labels.get(ranks.LOCAL_RANK, ""),
            world_size=labels.get(ranks.WORLD_SIZE, ""),
            argv=bounded_argv(getattr(sys, "orig_argv", sys.argv)),
            peak=peak,
            peak_ns=when,
            devices=tuple(devices),
        )

    def write(self) -> bool:
        """Write the current profile atomically; False (and reported) when it could not."""
        return self._take(to_file=True) is not None

    def current(self) -> Profile | None:
        """The profile so far with the notes of what was lost, recording on: a nested recording's answer."""
        with self._lock:
            try:
                profile = self.profile()
            except Exception as exc:
                self.report(f"could not build the profile ({exc})")
                return None
            if profile is not None:
                profile.comments.extend(f"pid {self.pid}: {m}" for m in self.lost if m not in profile.comments)
            return profile

    def save_to(self, profile: Profile, path: Path) -> bool:
        """Write *profile* to *path* (not this session's file); False, and said once, when it could not."""
        try:
            self._write(profile, path)
            return True
        except Exception as exc:
            self.report(f"could not write the profile to {path} ({exc})")
            return False

    def _take(self, to_file: bool) -> Profile | None:
        """The current profile with the notes of what was lost, written if *to_file*, handed out."""
        with self._lock, gc_paused():  # building it makes many objects, no cycles: no collection walks torch's
            try:
                profile = self.profile()
                self._note_recorder_errors()
                if profile is None:
                    return None
                for message in self.lost:
                    if message not in profile.comments:  # a recorder may have noted it already
                        profile.comments.append(f"pid {self.pid}: {message}")
                if to_file:
                    self._write_file(profile)
            except Exception as exc:
                where = (
                    "build the profile"
                    if not to_file
                    else "write the profile" + ("" if isinstance(exc, GpuflameError) else f" to {self.path}")
                )  # its message names the file
                self.report(f"could not {where} ({exc}); this process's profile is lost")
                return None
        self._hand_out(profile)
        return profile

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
                with session_folder.opened(self.settings.session_dir) as folder:
                    session_folder.append_text(folder, LOST_FILE.format(pid=self.pid), message + "\n")
        except Exception:
            pass

    def _note_recorder_errors(self) -> None:
        """Recorders print their own first error and their losses; the launcher still needs to hear of them."""
        for recorder in list(self.recorders):
            for error in getattr(recorder, "errors", [])[:1]:
                self.report(error.removeprefix("gpuflame: "), say=False)
            for loss in list(getattr(recorder, "losses", [])):
                self.report(loss, say=False)

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

    def _note_idle(self) -> None:
        """Say why nothing was recorded here when a framework was imported that the backend does not record."""
        backend = self.settings.backend
        recorded = backends.frameworks(backend)
        missed = [m for m in backends.frameworks("auto") if m in sys.modules and m not in recorded]
        if not missed:
            return
        path = Path(self.settings.session_dir) / IDLE_FILE.format(pid=self.pid)
        note = f"imported {' and '.join(missed)}, which --backend {backend} does not record\n"
        try:
            with session_folder.opened(self.settings.session_dir) as folder:
                session_folder.create_file(folder, path.name, note.encode())
        except OSError as exc:
            self.report(f"could not leave the note of why nothing was recorded ({path}: {exc.strerror or exc})")


def _prepare_writer() -> None:
    """Import what writing a profile needs now, not in the exit handler.

    Code run at exit must not create classes or named tuples: CPython runs
    their generated source through the same path as a script, which forgets
    that the script ended with an unhandled KeyboardInterrupt, so Ctrl-C
    would exit 1 instead of dying of SIGINT (130).

    Signals are held meanwhile: a SIGTERM whose handler ran inside this
    import would find the writer half imported and lose the profile (a
    pool's ``terminate()`` reaches workers that are still importing torch).
    """
    with signals_held():
        import gpuflame.formats.pprof  # noqa: F401


def _save(profile: Profile, path: Path) -> None:
    from gpuflame.formats import save

    save(profile, path)


def _dumps(profile: Profile) -> bytes:
    from gpuflame.formats import dumps

    return dumps(profile)
