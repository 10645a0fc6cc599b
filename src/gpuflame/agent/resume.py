"""The hold's resumer: a small process beside the agent that lets a held process go at the bound, and every
held process go when the agent ends, however it ends (SIGKILL and crashes included: its pipe closes).

With ``--hold-late-drivers`` the kernel side stops (SIGSTOP) a process that opens a driver file the agent
has not probed yet and records it in the map ``held`` (tgid -> when, on CLOCK_MONOTONIC); the agent sends
SIGCONT once the file is probed. This process shares that map (its descriptor inherited) and the read end of
a pipe only the agent writes to: every :data:`TICK_S` it resumes what has been held longer than the bound,
and at the pipe's end of file it resumes all and exits. It ignores SIGINT and SIGTERM (a Ctrl-C or a pod's
stop reaches it with the agent): it ends with the agent's pipe.

    python -m gpuflame.agent.resume MAP_FD PIPE_FD BOUND_MS
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time

from gpuflame.agent.libbpf import Map

TICK_S = 0.05
PID = 4  # the map's key: a tgid (u32); its value: when it was stopped (u64 ns)


def held(m: Map) -> list[tuple[int, int]]:
    """(pid, when it was stopped) of each process held now."""
    out = []
    for key in m.keys(PID):
        value = m.lookup(key)
        if value is not None:
            out.append((int.from_bytes(key, "little"), int.from_bytes(value[:8], "little")))
    return out


def resume(m: Map, pid: int) -> bool:
    """SIGCONT to *pid*, out of the map; whether it was still there to resume."""
    m.delete(pid.to_bytes(PID, "little"))
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        return False
    return True


def main(argv: list[str]) -> int:
    map_fd, pipe_fd, bound_ns = int(argv[0]), int(argv[1]), int(argv[2]) * 1_000_000
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    m = Map(map_fd, 8)
    while True:
        ready, _, _ = select.select([pipe_fd], [], [], TICK_S)
        if ready and not os.read(pipe_fd, 4096):
            break  # the agent has ended
        now = time.monotonic_ns()
        for pid, since in held(m):
            if now - since >= bound_ns:
                resume(m, pid)
    for pid, _ in held(m):
        resume(m, pid)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
