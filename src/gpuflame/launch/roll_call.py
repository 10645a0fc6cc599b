"""Which processes of a run recorded, and which ended without writing their final profile: the launcher's half.

A process registers in the session folder (``started-PID``) when it starts
recording and removes that file once its final profile is written
(``boundary/roll_call.py``, the half the profiled process imports). A file
still there after the run names a process that ended without its exit
hooks: ``os._exit``, SIGKILL, a crash. The launcher (:class:`EndWatch`) notes when each registered process
ends, so that it can say how much of such a process a kept ``--interval``
snapshot misses, and which pids left nothing at all.
"""

from __future__ import annotations

import os
import select
import threading
import time
from dataclasses import dataclass

from gpuflame.boundary.contract import STARTED_FILE, process_files

POLL_S = 0.02  # how often the launcher looks for new processes and ended ones


def unfinished(folder: int) -> list[int]:
    """Pids registered and never unregistered in *folder* (a descriptor): they ended without their exit hooks
    (or still run). Only names are read: nothing found there is opened."""
    return list(process_files(folder, STARTED_FILE))


@dataclass
class Ending:
    """When the launcher saw a process end (wall clock); None: still running, or gone before it looked."""

    ended: float | None
    seen_running: bool


class EndWatch:
    """Notes when each registered process of *folder* (a descriptor) ends (pidfd on Linux, else a liveness check)."""

    def __init__(self, folder: int) -> None:
        self.folder = folder
        self._running: dict[int, int | None] = {}  # pid -> pidfd (None: polled with kill 0)
        self.endings: dict[int, Ending] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="gpuflame-end-watch", daemon=True)
        # settle() looks from the launcher's thread while the watch thread looks too: one look at a time
        # (two at once changed _running under each other's loops and could close a pidfd twice)
        self._looking = threading.Lock()

    def start(self) -> EndWatch:
        self._thread.start()
        return self

    def settle(self, timeout: float) -> int:
        """Wait (up to *timeout* s) for registered processes that outlive the program to end; how many still run.

        A forkserver or an orphaned child is often still writing its profile
        when the program's main process has ended.
        """
        deadline = time.monotonic() + timeout
        while True:
            self._look()
            if not self._running or time.monotonic() >= deadline:
                return len(self._running)
            time.sleep(POLL_S)

    def stop(self) -> dict[int, Ending]:
        """Stop watching; one last look; what is known of every registered pid."""
        self._stop.set()
        self._thread.join()
        self._look()
        for pid, fd in self._running.items():
            self.endings.setdefault(pid, Ending(None, seen_running=True))
            if fd is not None:
                os.close(fd)
        self._running.clear()
        return self.endings

    def _watch(self) -> None:
        while not self._stop.wait(POLL_S):
            self._look()

    def _look(self) -> None:
        with self._looking:
            self._look_once()

    def _look_once(self) -> None:
        registered = set(unfinished(self.folder))
        for pid in registered:
            if pid not in self._running and pid not in self.endings:
                self._follow(pid)
        for pid in [p for p in self._running if p not in registered]:  # ended cleanly: nothing to say
            fd = self._running.pop(pid)
            if fd is not None:
                os.close(fd)
        now = time.time()
        for pid in [p for p, fd in self._running.items() if _ended(p, fd)]:
            fd = self._running.pop(pid)
            if fd is not None:
                os.close(fd)
            self.endings[pid] = Ending(now, seen_running=True)

    def _follow(self, pid: int) -> None:
        try:
            self._running[pid] = os.pidfd_open(pid) if hasattr(os, "pidfd_open") else None
        except ProcessLookupError:
            self.endings[pid] = Ending(None, seen_running=False)
        except OSError:
            self._running[pid] = None


def _ended(pid: int, fd: int | None) -> bool:
    if fd is not None:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))  # readable once the process has exited
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False
