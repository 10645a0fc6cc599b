"""In-use, peak and allocated bytes per stack, from the driver's alloc and free events.

Exact, and O(1) per event. Peak is "live at the moment of the highest total",
per process and device: rather than copying every stack's in-use at each new
high (every allocation of a growing process is one), each stack keeps the
time it last changed and, the first time it changes after a peak, the value it
had at that peak.
"""

from __future__ import annotations

from dataclasses import dataclass, field

Group = tuple[int, str]  # (pid, device)
BlockKey = tuple[int, int]  # (is_handle, address or handle)


@dataclass
class Line:
    """One (process, device, stack) row."""

    inuse: int = 0
    inuse_n: int = 0
    alloc: int = 0
    alloc_n: int = 0
    changed: int = 0  # event time of the last change
    peak: int = 0  # in use at the group's peak, once changed after it
    peak_n: int = 0


@dataclass
class GroupState:
    total: int = 0
    peak_total: int = 0
    peak_time: int = 0
    lines: dict[int, Line] = field(default_factory=dict)


class Ledger:
    """Blocks live now, by process; totals by (process, device) and stack id."""

    def __init__(self) -> None:
        self.groups: dict[Group, GroupState] = {}
        self.blocks: dict[int, dict[BlockKey, tuple[Group, int, int]]] = {}
        self.clock = 0
        self.unmatched_frees = 0

    def _touch(self, g: GroupState, stack: int) -> Line:
        line = g.lines.get(stack)
        if line is None:
            line = g.lines[stack] = Line()
        elif line.changed <= g.peak_time:
            line.peak, line.peak_n = line.inuse, line.inuse_n
        return line

    def _settle(self, g: GroupState, line: Line) -> None:
        line.changed = self.clock
        if g.total > g.peak_total:
            g.peak_total = g.total
            g.peak_time = self.clock

    def alloc(self, pid: int, device: str, stack: int, key: BlockKey, size: int) -> None:
        self.clock += 1
        group = (pid, device)
        g = self.groups.get(group) or self.groups.setdefault(group, GroupState())
        old = self.blocks.setdefault(pid, {}).get(key)
        if old is not None:  # an address handed out again without a free we saw
            self._release(pid, key)
        line = self._touch(g, stack)
        line.inuse += size
        line.inuse_n += 1
        line.alloc += size
        line.alloc_n += 1
        g.total += size
        self.blocks[pid][key] = (group, stack, size)
        self._settle(g, line)

    def free(self, pid: int, key: BlockKey) -> bool:
        """Free a block; False when it is not known (allocated before the agent started)."""
        self.clock += 1
        if key not in self.blocks.get(pid, {}):
            self.unmatched_frees += 1
            return False
        self._release(pid, key)
        return True

    def _release(self, pid: int, key: BlockKey) -> None:
        group, stack, size = self.blocks[pid].pop(key)
        g = self.groups[group]
        line = self._touch(g, stack)
        line.inuse -= size
        line.inuse_n -= 1
        g.total -= size
        self._settle(g, line)

    def exit(self, pid: int) -> list[BlockKey]:
        """A process ended: its blocks are freed. Returns their keys."""
        keys = list(self.blocks.get(pid, {}))
        for key in keys:
            self.clock += 1
            self._release(pid, key)
        self.blocks.pop(pid, None)
        return keys

    def rows(self) -> list[tuple[Group, int, tuple[int, int, int, int, int, int]]]:
        """(group, stack id, [peak, peak_n, inuse, inuse_n, alloc, alloc_n]) per row."""
        out = []
        for group, g in self.groups.items():
            for stack, line in g.lines.items():
                at_peak = line.changed <= g.peak_time
                peak, peak_n = (line.inuse, line.inuse_n) if at_peak else (line.peak, line.peak_n)
                out.append((group, stack, (peak, peak_n, line.inuse, line.inuse_n, line.alloc, line.alloc_n)))
        return out
