"""A thread whose interpreter frames sit right above a page that cannot be read (standard library only).

CPython 3.11+ keeps a thread's frames in a data stack it maps in 16 KiB chunks when the thread makes its
first call; the first frame starts near the chunk's start. What lies below the chunk is whatever the
process mapped there: often readable (a library's data), sometimes a gap or memory never touched. This
makes the second case on purpose, for the agent's frame walk (tests/agent/target.py ``guarded N``,
bench/agent/pairs.py ``guarded DEPTH N``), which must not read below the frames it needs.
"""

from __future__ import annotations  # the targets run on 3.9 too

import _thread
import ctypes
import sys
import time

PAGE, CHUNK = 4096, 16384
_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.mmap.restype = ctypes.c_void_p
_LIBC.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
_LIBC.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)


def _unreadable(size: int) -> int:
    return _LIBC.mmap(None, size, 0, 0x22, -1, 0)  # PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS


def _hole() -> int | None:
    """Where the next 16 KiB mapping goes, an unreadable page right below it. The kernel maps top-down into
    the highest hole that fits: higher holes of 16 KiB are filled (with unreadable pages, left mapped)."""
    guard = _unreadable(PAGE + CHUNK)
    _LIBC.munmap(guard + PAGE, CHUNK)
    for _ in range(4096):
        probe = _unreadable(CHUNK)
        if probe == guard + PAGE:
            _LIBC.munmap(probe, CHUNK)
            return guard + PAGE
    return None


def first_frame_page() -> int | None:
    """The page of the calling thread's first interpreter frame (PyFrameObject.f_frame, 3.11+); None before
    3.11, whose frames are objects on the heap."""
    if sys.version_info < (3, 11):
        return None
    frame = sys._getframe()
    while frame.f_back is not None:
        frame = frame.f_back
    return (ctypes.c_void_p.from_address(id(frame) + 24).value or 0) & ~(PAGE - 1)


def run_guarded(fn, *args):  # noqa: ANN001, ANN002, ANN201
    """fn(*args) in a new thread whose frames start right above an unreadable page: (True, its result), or
    (False, None) where the layout did not come out so (fn is not run then)."""
    done = []

    def runner() -> None:
        try:
            done.append((True, fn(*args)) if hole is not None and first_frame_page() == hole else (False, None))
        except BaseException as exc:  # noqa: BLE001  (handed to the caller's thread)
            done.append((True, exc))

    hole = _hole()
    _thread.start_new_thread(runner, ())
    while not done:
        time.sleep(0.001)
    if isinstance(done[0][1], BaseException):
        raise done[0][1]
    return done[0]
