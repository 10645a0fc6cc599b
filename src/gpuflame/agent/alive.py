"""The agent's liveness file: its reader thread touches it, a probe checks that it is fresh.

A DaemonSet's liveness probe must tell a working agent (idle or busy) from a
stuck one. The reader thread is what does the work, so it refreshes the
file's modification time every :data:`TOUCH_EVERY_S`; the probe
(``python -m gpuflame.agent.alive FILE``, about a third of a second of one
core, most of it importing the package) fails when the file is older than :data:`STALE_S`.
A file rather than an HTTP endpoint: no listening socket in a root process.
"""

from __future__ import annotations

import os
import sys
import time

TOUCH_EVERY_S = 5.0
STALE_S = 60.0  # a dozen missed touches: the reader thread is stuck
FILE_MODE = 0o644


def touch(path: str) -> None:
    """Create *path* or refresh its modification time."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, FILE_MODE)
    try:
        os.utime(fd)
    finally:
        os.close(fd)


def age(path: str) -> float | None:
    """Seconds since *path* was last touched, or None when it does not exist."""
    try:
        return time.time() - os.stat(path).st_mtime
    except OSError:
        return None


def main(argv: list[str]) -> int:
    """The liveness probe: exit 0 if the file is fresh, else one line and exit 1."""
    if len(argv) != 1:
        sys.stderr.write("usage: python -m gpuflame.agent.alive FILE\n")
        return 2
    seconds = age(argv[0])
    if seconds is None:
        sys.stderr.write(f"gpuflame agent: not alive: {argv[0]} does not exist\n")
        return 1
    if seconds > STALE_S:
        sys.stderr.write(f"gpuflame agent: not alive: {argv[0]} last touched {seconds:.0f}s ago\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
