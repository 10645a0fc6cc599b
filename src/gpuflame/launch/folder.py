"""The run's own per-process folder: made fresh and private for each run, locked while the run uses it.

``gpuflame run -o OUT`` keeps its processes' files in ``OUT.processes``
(``store.processes_folder``), often in a shared folder such as ``/tmp``. A
folder found there is never trusted: one another user made, a link, or one
holding files gpuflame does not write is refused in one line; one this
user's earlier run left is removed (its per-process files only) and a new
one made, mode 0700, with an exclusive ``mkdir``. The run holds an
``flock`` on the folder until it ends: a second run with the same ``-o``
(or a ``recover`` of it) finds the lock and refuses instead of merging its
processes into this one's. What is done inside the folder goes through its
descriptor (``boundary/session_folder.py``).
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
from dataclasses import dataclass
from pathlib import Path

from gpuflame.boundary import session_folder
from gpuflame.errors import GpuflameError

# what a run leaves in its folder: per-process files, the peak tables, half-written temporaries
_OWN_NAME = re.compile(r"^(?:(?:proc|lost|idle|started)-\d+(?:\.pb\.gz|\.txt)?|peak-[A-Za-z0-9_.-]+\.table|\..+\.tmp)$")
_TRIES = 3  # a folder that keeps reappearing while this run makes its own: someone races it


@dataclass
class Held:
    """A run's folder, open and locked: *fd* is its descriptor for as long as the run uses it."""

    path: Path
    fd: int

    def close(self) -> None:
        """Let go of the folder (and its lock)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def make_fresh(path: Path, hint: str = "choose another -o") -> Held:
    """A new private folder at *path*, this run's alone (a previous run's of this user's replaced); GpuflameError."""
    for _ in range(_TRIES):
        try:
            os.mkdir(path, session_folder.FOLDER_MODE)
        except FileExistsError:
            _remove_previous(path, hint)
            continue
        except OSError as exc:
            raise GpuflameError(f"{path}: cannot make the run's folder ({exc.strerror or exc})") from None
        held = _hold(path, hint, f"wait for it to end or {hint}")
        if held is not None:
            os.fchmod(held.fd, session_folder.FOLDER_MODE)  # a umask may narrow mkdir's mode, never widen it
            return held
    raise GpuflameError(f"{path}: another process keeps making this folder while this run makes its own; {hint}")


def hold_existing(path: Path) -> Held:
    """The folder a killed run left (``gpuflame recover``), checked private and ours and locked; GpuflameError."""
    held = _hold(path, "recover reads only a folder of this user's with mode 700", "wait for it to end")
    if held is None:
        raise GpuflameError(f"{path}: the folder changed while it was opened; try again")
    return held


def _open(path: Path, hint: str, private: bool) -> int:
    try:
        return session_folder.open_folder(path, private)
    except session_folder.NotOurs as exc:
        raise GpuflameError(f"{path}: {exc.strerror}; refusing to use it for a run's processes ({hint})") from None
    except OSError as exc:
        raise GpuflameError(f"{path}: cannot open the run's folder ({exc.strerror or exc})") from None


def _hold(path: Path, hint: str, busy: str, private: bool = True) -> Held | None:
    """*path* opened, checked and locked; None when *path* no longer names the folder locked (replaced meanwhile).

    Not *private*: a folder of this user's that others may enter (an earlier gpuflame's) is taken, to be removed.
    """
    fd = _open(path, hint, private)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise GpuflameError(f"{path}: a gpuflame run that is still running uses this folder; {busy}") from None
        raise GpuflameError(f"{path}: cannot lock the run's folder ({exc.strerror or exc})") from None
    try:
        now = os.stat(path, follow_symlinks=False)
    except OSError:
        now = None
    mine = os.fstat(fd)
    if now is None or (now.st_dev, now.st_ino) != (mine.st_dev, mine.st_ino):
        os.close(fd)
        return None
    return Held(path, fd)


def _remove_previous(path: Path, hint: str) -> None:
    """Remove the folder an earlier run of this user left at *path*; refuse anyone else's, or one in use."""
    held = _hold(
        path, hint, f"wait for it to end or {hint}", private=False
    )  # only names are removed from it: nothing is read
    if held is None:
        return  # gone or replaced meanwhile: the caller tries again
    try:
        names = os.listdir(held.fd)
        strange = [n for n in names if not _OWN_NAME.match(n)]
        if strange:
            raise GpuflameError(
                f"{path}: holds {strange[0]!r}, which no gpuflame run writes; refusing to remove it ({hint})"
            )
        for name in names:
            try:
                os.unlink(name, dir_fd=held.fd)  # a link is removed, never followed
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise GpuflameError(
                    f"{path}/{name}: cannot remove the previous run's file ({exc.strerror or exc}); {hint}"
                ) from None
        os.rmdir(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise GpuflameError(f"{path}: cannot remove the previous run's folder ({exc.strerror or exc})") from None
    finally:
        held.close()


def remove_if_empty(path: Path) -> bool:
    """Remove *path* when nothing is left in it; whether it is gone."""
    try:
        path.rmdir()
        return True
    except FileNotFoundError:
        return True
    except OSError:
        return False  # not empty: it stays
