"""glibc's malloc told to keep freed memory for reuse while a one-shot command works on a large profile.

By default glibc maps every block of 32 MB or more fresh from the kernel and
unmaps it when freed, so each of the hundreds of arrays a million-frame
profile passes through (tens to hundreds of MB each) is paid again in page
faults: about 2 s of system time of a 1M-frame ``gpuflame view``, more than
a tenth of the command (BENCHMARKS.md). With mmap off and a high trim
threshold, a freed block goes back to malloc's heap and the next array
reuses its pages.

Only for gpuflame's own one-shot commands (:func:`gpuflame.pipeline.load_profile`
turns it on, the command line turns it off when the command returns), never
in a profiled program: its allocator is its own. Elsewhere than glibc it
does nothing.
"""

from __future__ import annotations

import ctypes

# mallopt's parameters (malloc.h) and glibc's defaults for the two set here
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
DEFAULT_TRIM_THRESHOLD = 128 * 1024
DEFAULT_MMAP_MAX = 65536
KEEP_UP_TO = 2**31 - 1  # bytes of free memory at the heap's top kept (mallopt takes an int)

_on = False


def _glibc() -> ctypes.CDLL | None:
    """The process's C library when it is glibc (musl has a ``mallopt`` that does nothing and no ``malloc_trim``)."""
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version, libc.mallopt, libc.malloc_trim  # noqa: B018  (each raises if absent)
    except (OSError, AttributeError):  # not glibc (macOS, musl), or no symbols of the process
        return None
    return libc


def reuse_freed_memory() -> None:
    """From now until :func:`release_freed_memory`, freed blocks stay in the heap for reuse."""
    global _on
    libc = _glibc()
    if libc is None or _on:
        return
    libc.mallopt(M_MMAP_MAX, 0)
    libc.mallopt(M_TRIM_THRESHOLD, KEEP_UP_TO)
    _on = True


def release_freed_memory() -> None:
    """glibc's defaults again (a process that goes on, as a test calling ``main``, gets its memory back)."""
    global _on
    libc = _glibc()
    if libc is None or not _on:
        return
    libc.mallopt(M_MMAP_MAX, DEFAULT_MMAP_MAX)
    libc.mallopt(M_TRIM_THRESHOLD, DEFAULT_TRIM_THRESHOLD)
    libc.malloc_trim(0)  # what the command freed goes back to the kernel now
    _on = False
