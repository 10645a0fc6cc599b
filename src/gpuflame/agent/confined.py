"""Files read on a target's behalf: resolved inside its root, regular files only, never more than a cap.

The agent runs as root on the host; a container's files are reached through
``/proc/PID/root``, where an absolute symlink (``/etc/hostname -> /etc/shadow``)
would otherwise be resolved against the agent's root, the host's. Paths are
resolved with ``openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)`` (Linux 5.6;
the agent's BPF ring buffer needs 5.8 anyway): absolute links and ``..`` stay
inside the given root. The file is first opened ``O_PATH`` (opening a device
or a FIFO for reading can block or act), checked to be a regular file, and
only then reopened for reading, non-blocking, and read up to a cap.
"""

from __future__ import annotations

import ctypes
import os
import stat

SYS_OPENAT2 = 437  # x86-64 (the agent supports x86-64 Linux only)
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_IN_ROOT = 0x10


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _openat2(dirfd: int, path: str, flags: int, resolve: int) -> int:
    how = _OpenHow(flags, 0, resolve)
    fd = _libc.syscall(
        ctypes.c_long(SYS_OPENAT2),
        ctypes.c_int(dirfd),
        ctypes.c_char_p(os.fsencode(path)),
        ctypes.byref(how),
        ctypes.c_size_t(ctypes.sizeof(how)),
    )
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return int(fd)


def open_in_root(root: str, path: str) -> int:
    """A read-only, non-blocking fd of the regular file *path* resolved inside *root*; raises OSError.

    *root* itself (``/proc/PID/root``, a host folder) is opened as given.
    """
    dirfd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        where = _openat2(
            dirfd, path.lstrip("/") or ".", os.O_PATH | os.O_CLOEXEC, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS
        )
    finally:
        os.close(dirfd)
    return _reopen_regular(where, path)


def read_in_root(root: str, path: str, limit: int) -> bytes | None:
    """At most *limit* bytes of the regular file *path* inside *root*; None where it cannot be read so."""
    try:
        fd = open_in_root(root, path)
    except OSError:
        return None
    try:
        return _read_up_to(fd, limit)
    except OSError:
        return None
    finally:
        os.close(fd)


def open_regular(path: str) -> int:
    """A read-only, non-blocking fd of *path* if it is a regular file (a host path: links followed); raises OSError."""
    return _reopen_regular(os.open(path, os.O_PATH | os.O_CLOEXEC), path)


def _reopen_regular(where: int, path: str) -> int:
    """The O_PATH fd *where* (closed here) reopened to read, non-blocking, if it is a regular file; else OSError.

    Checked on the fd itself, so a FIFO or device swapped in after the check is never opened.
    """
    try:
        if not stat.S_ISREG(os.fstat(where).st_mode):
            raise OSError(f"{path}: not a regular file")
        return os.open(f"/proc/self/fd/{where}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    finally:
        os.close(where)


def _read_up_to(fd: int, limit: int) -> bytes:
    chunks, left = [], limit
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
