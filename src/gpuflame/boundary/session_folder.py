"""The session folder handled by its descriptor: nothing in it is followed, blocked on, or trusted unless ours.

A run's session folder (``contract.py``) is private: mode 0700, owned by
the user who runs (``launch/folder.py`` makes it so, fresh for each run).
Both sides open it once per use without following a link and check that
it still is; every file in it is then opened relative to that descriptor,
without following a link and without blocking (a FIFO planted under a
file's name must hang no one), and used only when it is a regular file of
this user with one name. New files are created exclusively (a final one is
written under a fresh temporary name and renamed into place). Anything
else raises :class:`NotOurs`, an ``OSError`` whose message says why.

Standard library only: the profiled process imports this module.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator

FOLDER_MODE = 0o700  # the session folder: its owner alone may list, read or add files
FILE_MODE = 0o666  # less the umask, as open() gives: the private folder is what keeps others out
_BASE = os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
_PROBE_BYTES = 4096  # a small profile: what write_problem writes to tell a full disk from a working one


class NotOurs(OSError):
    """A session folder or file that is not this user's own private one (the message says why)."""

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


def folder_problem(st: os.stat_result, private: bool = True) -> str:
    """'' for a folder this user owns and (*private*) no one else may enter; else why not, in words."""
    if not stat.S_ISDIR(st.st_mode):
        return "not a folder"
    if st.st_uid != os.geteuid():
        return f"owned by another user (uid {st.st_uid}), not by this one (uid {os.geteuid()})"
    if private and st.st_mode & 0o077:
        return f"not private (mode {stat.S_IMODE(st.st_mode):o}; a run's folder is 700: others may not add files)"
    return ""


def file_problem(st: os.stat_result) -> str:
    """'' for a regular file of this user with one name (not a link to another); else why not."""
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_uid != os.geteuid():
        return f"owned by another user (uid {st.st_uid})"
    if st.st_nlink != 1:
        return f"has {st.st_nlink} names (a hard link)"
    return ""


def open_folder(path: str | os.PathLike[str], private: bool = True) -> int:
    """A descriptor of the session folder at *path*, checked ours (and *private*); NotOurs (or OSError) else.

    The last part of *path* must not be a link (``O_NOFOLLOW``).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | _BASE)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise NotOurs(exc.errno, "a link or a file, not a folder", os.fspath(path)) from None
        raise
    problem = folder_problem(os.fstat(fd), private)
    if problem:
        os.close(fd)
        raise NotOurs(errno.EPERM, problem, os.fspath(path))
    return fd


@contextlib.contextmanager
def opened(path: str | os.PathLike[str]) -> Iterator[int]:
    """:func:`open_folder` for the length of a ``with`` block."""
    fd = open_folder(path)
    try:
        yield fd
    finally:
        os.close(fd)


def _open_file(folder: int, name: str, flags: int, mode: int = FILE_MODE) -> int:
    """*name* in *folder*, opened with *flags*, checked to be a regular file of ours; NotOurs else."""
    try:
        fd = os.open(name, flags | _BASE, mode, dir_fd=folder)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotOurs(exc.errno, "a link, which is never followed here", name) from None
        raise
    problem = file_problem(os.fstat(fd))
    if problem:
        os.close(fd)
        raise NotOurs(errno.EPERM, problem, name)
    return fd


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def create_file(folder: int, name: str, data: bytes = b"") -> None:
    """A new file *name* holding *data*; FileExistsError when anything has that name already."""
    fd = _open_file(folder, name, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        _write_all(fd, data)
    finally:
        os.close(fd)


def write_file(folder: int, name: str, data: bytes) -> None:
    """*data* as *name*, whole or not at all: a fresh temporary file renamed over whatever had the name."""
    for _ in range(100):
        tmp = f".{name}.{os.urandom(4).hex()}.tmp"
        try:
            fd = _open_file(folder, tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(errno.EEXIST, "no free temporary name", name)
    try:
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
    except BaseException:
        remove(folder, tmp)
        raise


def append_text(folder: int, name: str, text: str) -> None:
    """Add *text* at the end of *name* (made when missing), which must be a regular file of ours."""
    fd = _open_file(folder, name, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        _write_all(fd, text.encode("utf-8", errors="replace"))
    finally:
        os.close(fd)


def read_file(folder: int, name: str, limit: int | None = None) -> bytes:
    """The bytes of *name*, a regular file of ours (never a link, a FIFO or a device); NotOurs else.

    A file of more than *limit* bytes is not read: OSError(EFBIG).
    """
    fd = _open_file(folder, name, os.O_RDONLY)
    try:
        chunks: list[bytes] = []
        size = 0
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if limit is not None and size > limit:
                raise OSError(errno.EFBIG, f"larger than {limit:,} bytes", name)
            chunks.append(chunk)
    finally:
        os.close(fd)


def own_files(folder: int) -> dict[str, os.stat_result]:
    """name -> status of every regular file of ours in *folder* (links, FIFOs, others' files left out)."""
    found = {}
    for name in os.listdir(folder):
        try:
            st = os.stat(name, dir_fd=folder, follow_symlinks=False)
        except OSError:
            continue  # gone meanwhile
        if not file_problem(st):
            found[name] = st
    return found


def remove(folder: int, name: str) -> None:
    """Remove the name *name* (a link is removed, never followed); quietly when it is gone or cannot go."""
    try:
        os.unlink(name, dir_fd=folder)
    except OSError:
        pass


def write_problem(folder: int) -> str:
    """'' when *folder* takes a small file now, else why not in the OS's words (a full disk, a read-only mount).

    An empty file proves little: a full filesystem still makes one.
    """
    name = f".gpuflame-probe.{os.urandom(4).hex()}.tmp"
    try:
        fd = _open_file(folder, name, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except OSError as exc:
        return exc.strerror or str(exc)
    try:
        _write_all(fd, bytes(_PROBE_BYTES))
        return ""
    except OSError as exc:
        return exc.strerror or str(exc)
    finally:
        os.close(fd)
        remove(folder, name)
