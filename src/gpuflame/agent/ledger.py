"""In-use, peak and allocated bytes per stack, from the driver's alloc and free events.

Exact, and O(1) per event. Peak is "live at the moment of the highest total",
per process and device: rather than copying every stack's in-use at each new
high (every allocation of a growing process is one), each stack keeps the
time it last changed and, the first time it changes after a peak, the value it
had at that peak.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

Group = tuple[int, str]  # (pid, device)
BlockKey = int  # an address, or HANDLE | a cuMemCreate handle: an int hashes and compares faster than a tuple
HANDLE = 1 << 64  # above every 64-bit address and handle


def block_key(is_handle: bool, value: int) -> BlockKey:
    """The ledger's key of an address (or, *is_handle*, of a cuMemCreate handle)."""
    return HANDLE | value if is_handle else value


def key_parts(key: BlockKey) -> tuple[int, int]:
    """(is_handle, address or handle) of a block key."""
    return key >> 64, key & (HANDLE - 1)


# A row is a list (the hot path touches it at every event; lists beat attributes):
INUSE, INUSE_N, ALLOC, ALLOC_N, CHANGED, PEAK, PEAK_N = range(7)
# CHANGED: event time of the last change; PEAK, PEAK_N: in use at the group's peak, once changed after it


@dataclass(slots=True)
class GroupState:
    total: int = 0
    peak_total: int = 0
    peak_time: int = 0
    lines: dict[int, list[int]] = field(default_factory=dict)


Block = tuple[GroupState, list[int], int]  # a live block: its group's state, its row, size (both outlive it)
Steps = list[Callable[[], None]]  # what undoes a VMM release or unmap, in the order it was done
InFlight = tuple[int, BlockKey, "Block | Steps | None"]  # a free-like call booked at its entry: pid, key, undo
MAX_IN_FLIGHT = 1 << 16  # threads whose last free-like call is kept for its undo (more: forgotten at once)


class Ledger:
    """Blocks live now, by process; totals by (process, device) and stack id."""

    def __init__(self) -> None:
        self.groups: dict[Group, GroupState] = {}
        self.blocks: dict[int, dict[BlockKey, Block]] = {}
        self.clock = 0
        self.unmatched_frees = 0
        # tid -> (pid, key, what): each thread's last free-like call, booked at its entry (the driver may hand
        # the address out again from inside the call), kept to undo it if the driver refuses the call: a Block
        # to book again, None (an unknown address, counted), or the steps of a VMM release or unmap to reverse
        self.in_flight: dict[int, InFlight] = {}
        self.undo_missed = 0  # refused calls whose booking could not be undone (its record was gone)
        # VMM: a cuMemCreate block lives while its handles (cuMemCreate's, each cuMemRetainAllocationHandle's)
        # and its mappings hold it
        self.refs: dict[tuple[int, int], int] = {}  # (pid, handle) -> references
        self.mappings: dict[int, dict[int, tuple[int, int]]] = {}  # pid -> address -> (size, handle)

    def _unbook(self, g: GroupState, line: list[int], size: int) -> None:
        """Take a freed block of *size* bytes off its row, keeping the row's value at the peak (a free
        never makes a new peak)."""
        self.clock = clock = self.clock + 1
        if line[CHANGED] <= g.peak_time:
            line[PEAK] = line[INUSE]
            line[PEAK_N] = line[INUSE_N]
        line[INUSE] -= size
        line[INUSE_N] -= 1
        line[CHANGED] = clock
        g.total -= size

    def _book(self, g: GroupState, line: list[int], size: int) -> None:
        """Put a block of *size* bytes in use on its row, keeping the row's value at the peak; a new peak of
        the group is marked (the twin of :meth:`_unbook`; the common case is inlined in Booking._read_ring)."""
        self.clock = clock = self.clock + 1
        if line[CHANGED] <= g.peak_time:
            line[PEAK] = line[INUSE]
            line[PEAK_N] = line[INUSE_N]
        line[INUSE] += size
        line[INUSE_N] += 1
        line[CHANGED] = clock
        total = g.total = g.total + size
        if total > g.peak_total:
            g.peak_total = total
            g.peak_time = clock

    def _rebook(self, pid: int, key: BlockKey, block: Block) -> None:
        """A freed block back in use (its free was refused): in use and the peak again, not allocated again."""
        blocks = self.blocks.setdefault(pid, {})
        if key in blocks:
            return  # the address was booked again meanwhile (an event lost): the newer block stays
        self._book(*block)
        blocks[key] = block

    def alloc(self, pid: int, device: str, stack: int, key: BlockKey, size: int) -> None:
        """Book a block. An address still booked: its free was missed (released now; a free is booked at its
        entry, so one still in the driver is booked already)."""
        group = (pid, device)
        g = self.groups.get(group)
        if g is None:
            g = self.groups[group] = GroupState()
        blocks = self.blocks.get(pid)
        if blocks is None:
            blocks = self.blocks[pid] = {}
        elif key in blocks:  # an address handed out again without a free we saw
            self._release(pid, key)
        # the common case (a row that exists, an address not in use) is booked in Booking._read_ring's loop
        line = g.lines.get(stack)
        if line is None:
            line = g.lines[stack] = [0] * (PEAK_N + 1)  # a new row: nothing yet, booked below
        line[ALLOC] += size
        line[ALLOC_N] += 1
        self._book(g, line, size)
        blocks[key] = (g, line, size)
        if key >= HANDLE:
            self.refs[(pid, key - HANDLE)] = 1

    def note(self, tid: int, call: InFlight) -> None:
        """Keep thread *tid*'s free-like call, booked at its entry, until its undo or the thread's next one."""
        if len(self.in_flight) >= MAX_IN_FLIGHT and tid not in self.in_flight:
            self.in_flight.clear()  # bounded: a call refused after this is counted in undo_missed
        self.in_flight[tid] = call

    def free(self, pid: int, key: BlockKey, tid: int = -1, known: bool = False) -> bool:
        """Free a block at its call's entry (*tid*: the calling thread, to undo it if the driver refuses the
        call); False when it is not known (allocated before the agent started, or, *known* to the kernel, its
        allocation's record was lost: counted there, not here)."""
        blocks = self.blocks.get(pid)
        block = blocks.pop(key, None) if blocks is not None else None
        if tid >= 0:
            self.note(tid, (pid, key, [] if block is None and known else block))
        if block is None:
            self.clock += 1
            self.unmatched_frees += not known
            return False
        self._unbook(*block)
        return True

    def undo(self, pid: int, tid: int, key: BlockKey) -> bool:
        """The driver refused thread *tid*'s free-like call of *key*: what its entry booked is taken back."""
        call = self.in_flight.pop(tid, None)
        if call is None or call[0] != pid or call[1] != key:
            self.undo_missed += 1  # its entry's record was lost (counted there) or forgotten (MAX_IN_FLIGHT)
            return False
        what = call[2]
        if what is None:
            self.unmatched_frees -= 1  # an unknown address the driver refused: no free of anything
        elif isinstance(what, list):
            for step in reversed(what):
                step()
        else:
            self._rebook(pid, key, what)
        return True

    def release(self, pid: int, handle: int, tid: int = -1, steps: Steps | None = None) -> bool:
        """cuMemRelease: one handle less; the memory goes with the last reference (False: an unknown handle).
        *tid*: kept for its undo; *steps*: what undoes it is added there instead (an unmap's)."""
        own: Steps = [] if steps is None else steps
        ref, key = (pid, handle), HANDLE | handle
        n = self.refs.get(ref)
        if n is not None and n > 1:
            self.refs[ref] = n - 1
            own.append(partial(self._ref_back, ref))
            known = True
        else:
            self.refs.pop(ref, None)
            blocks = self.blocks.get(pid)
            block = blocks.pop(key, None) if blocks is not None else None
            if block is None:
                self.clock += 1
                self.unmatched_frees += 1
                own.append(self._unmatched_undone)
            else:
                self._unbook(*block)
                own.append(partial(self._handle_back, pid, key, block))
            known = block is not None
        if steps is None and tid >= 0:
            self.note(tid, (pid, key, own))
        return known

    def _ref_back(self, ref: tuple[int, int]) -> None:
        self.refs[ref] = self.refs.get(ref, 0) + 1

    def _unmatched_undone(self) -> None:
        self.unmatched_frees -= 1

    def _handle_back(self, pid: int, key: BlockKey, block: Block) -> None:
        self._rebook(pid, key, block)
        self.refs[(pid, key - HANDLE)] = 1

    def map(self, pid: int, address: int, size: int, handle: int) -> None:
        """cuMemMap: the mapping holds the handle's memory until it is unmapped."""
        if (pid, handle) in self.refs:
            self.refs[(pid, handle)] += 1
            self.mappings.setdefault(pid, {})[address] = (size, handle)

    def unmap(self, pid: int, address: int, size: int, tid: int = -1) -> None:
        """cuMemUnmap of [address, address + size): each mapping starting there lets go of its memory (*tid*:
        kept for its undo, under *address*)."""
        maps = self.mappings.get(pid, {})
        starts = [address] if address in maps else [a for a in maps if address <= a < address + size]
        steps: Steps = []
        for start in starts:
            mapping = maps.pop(start)
            steps.append(partial(self._map_back, pid, start, mapping))
            self.release(pid, mapping[1], steps=steps)
        if tid >= 0:
            self.note(tid, (pid, address, steps))

    def _map_back(self, pid: int, start: int, mapping: tuple[int, int]) -> None:
        self.mappings.setdefault(pid, {})[start] = mapping

    def retain(self, pid: int, address: int) -> None:
        """cuMemRetainAllocationHandle: one more handle on the memory mapped at *address*."""
        for start, (size, handle) in self.mappings.get(pid, {}).items():
            if start <= address < start + size and (pid, handle) in self.refs:
                self.refs[(pid, handle)] += 1
                return

    def _release(self, pid: int, key: BlockKey) -> None:
        self._unbook(*self.blocks[pid].pop(key))

    def exit(self, pid: int) -> list[BlockKey]:
        """A process ended: its blocks are freed. Returns their keys."""
        keys = list(self.blocks.get(pid, {}))
        for key in keys:
            self._release(pid, key)
        self.mappings.pop(pid, None)
        for ref in [ref for ref in self.refs if ref[0] == pid]:
            del self.refs[ref]
        for tid in [tid for tid, call in self.in_flight.items() if call[0] == pid]:
            del self.in_flight[tid]
        self.blocks.pop(pid, None)
        return keys

    def drop(self, pid: int) -> None:
        """Forget an ended process's rows (its peak and allocated bytes too)."""
        self.exit(pid)
        for group in [g for g in self.groups if g[0] == pid]:
            del self.groups[group]

    def rows(self) -> list[tuple[Group, int, tuple[int, int, int, int, int, int]]]:
        """(group, stack id, [peak, peak_n, inuse, inuse_n, alloc, alloc_n]) per row."""
        out = []
        for group, g in self.groups.items():
            for stack, line in g.lines.items():
                at_peak = line[CHANGED] <= g.peak_time
                peak, peak_n = (line[INUSE], line[INUSE_N]) if at_peak else (line[PEAK], line[PEAK_N])
                out.append((group, stack, (peak, peak_n, line[INUSE], line[INUSE_N], line[ALLOC], line[ALLOC_N])))
        return out
