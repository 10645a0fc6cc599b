"""Entry-only probes: allocations recorded at their entry, waiting for their result.

With ``--probes entry`` the kernel sends an allocation (its stack, size, and
where the driver will write the address) when the call starts, and its outcome
later: at the call's return site once a plain uprobe is there (exact), else at
the thread's next probed entry, where only an output in a still-live stack
frame can be trusted. Reading the output later from ``/proc/PID/mem`` was
tried and is wrong for Python callers: ctypes' ``c_uint64`` is freed when the
calling function returns and its memory reused at once (the next call's
``c_uint64`` sits there, set to 0), so the value read says nothing about the call.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Pending:
    """One allocation of one thread whose result is not known yet."""

    seq: int  # the thread's allocation number (its EV_RESULT carries the same)
    kind: int
    device: str
    stack: int
    size: int = 0  # as asked (what is missing if its result is never read)


class PendingResults:
    """(pid, tid) -> the allocation that thread is inside (at most one: a thread makes one call at a time)."""

    def __init__(self) -> None:
        self.calls: dict[tuple[int, int], Pending] = {}
        self.dropped_bytes = 0  # asked by the calls of ended processes, never read

    def held_bytes(self) -> int:
        """What the calls still waiting asked for."""
        return sum(call.size for call in self.calls.values())

    def add(self, pid: int, tid: int, call: Pending) -> None:
        self.calls[(pid, tid)] = call

    def take(self, pid: int, tid: int, seq: int) -> Pending | None:
        """The call an EV_RESULT is about, or None (its allocation was not booked: a process not watched)."""
        call = self.calls.get((pid, tid))
        if call is None or call.seq != seq:
            return None
        del self.calls[(pid, tid)]
        return call

    def drop(self, pid: int) -> int:
        """A process ended: its pending calls are forgotten; how many."""
        keys = [k for k in self.calls if k[0] == pid]
        for k in keys:
            self.dropped_bytes += self.calls.pop(k).size
        return len(keys)
