"""Replay a PyTorch snapshot's trace through the allocator model, compared event by event with the recording.

The trace (``device_traces``) is the input: each ``alloc`` is a request of
its bytes on its stream, ``free_requested`` and ``free_completed`` end it
(a block between the two is neither reusable nor merged), segments freed
by ``empty_cache()`` or by a ``cudaMalloc`` that failed because the device
was full are freed in the replay too (the very segments, under the recorded
settings; the whole cache, under others), and an ``oom`` entry's
``device_free`` gives the device's capacity.
The recorded ``segment_*`` entries are what the replay is checked against.

A trace that starts part way through the run (the ring buffer wrapped, or
recording began late) starts from the allocator state at its first event:
the snapshot's segments with the trace's segment events undone, holding the
blocks alive then (alive at the end and never allocated in the trace, at
their recorded size; freed in the trace without an allocation, at their
rounded size, taking the rest of their gap where the allocator would not
have split it off; an expandable segment from the mapped ranges the
snapshot lists, the trace's maps and unmaps undone).

Under the recorded settings a new segment takes the address the recording
gave it (best fit breaks ties by address, so placement can only be compared
when addresses agree); under other settings, fresh addresses above all
recorded ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuflame.errors import ProfileFormatError
from gpuflame.formats.snapshot_phases import read_marks
from gpuflame.formats.torch_snapshot import read_snapshot
from gpuflame.model.phases import NONE as NO_PHASE
from gpuflame.simulate.allocator import Allocator
from gpuflame.simulate.blocks import LARGE_BUFFER, SMALL_BUFFER, SMALL_SIZE, Block, Live, Segment, round_size
from gpuflame.simulate.gpus import MAX_DEVICE
from gpuflame.simulate.outcome import Outcome, Sites
from gpuflame.simulate.settings import Settings

FRESH_BASE = 1 << 50  # addresses of segments the recording did not make: above every real one
ACTIVE = frozenset(("active_allocated", "active_pending_free", "active_awaiting_free"))
RELEASE_RUN = ("segment_free", "segment_unmap", "free_completed")  # what one release writes to the trace
GROWS = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}


def read(data: bytes) -> dict[str, Any]:
    """The snapshot dict of a pickle (gzip or not): the converter's own reading, its limits included."""
    return read_snapshot(data)


def traced_devices(snapshot: Mapping[str, Any]) -> list[int]:
    """The devices whose trace holds at least one allocation."""
    traces = snapshot.get("device_traces")
    if not isinstance(traces, list):
        return []
    return [
        d
        for d, t in enumerate(traces)
        if isinstance(t, list) and any(isinstance(e, dict) and e.get("action") == "alloc" for e in t)
    ]


@dataclass
class _Start:
    """The allocator state at the trace's first event, rebuilt."""

    segments: dict[int, tuple[int, bool, int, bool]] = field(default_factory=dict)  # see _start_segments
    # addr -> (size, requested, frames, pending, size known)
    live: dict[int, tuple[int, int, Any, bool, bool]] = field(default_factory=dict)
    wrapped: bool = False


class DeviceReplay:
    """One device's trace replayed under *settings* (the recorded ones when *recorded* is true)."""

    def __init__(
        self,
        snapshot: Mapping[str, Any],
        device: int,
        settings: Settings,
        recorded: bool,
        capacity: int | None = None,
        sites: Sites | None = None,
        fraction_limit: int | None = None,
    ) -> None:
        trace = snapshot["device_traces"][device]
        if not all(type(e) is dict for e in trace):
            raise ProfileFormatError(f"a trace entry of device {device} is not a dict")
        self.trace = sorted(trace, key=lambda e: _int(e.get("time_us", 0)))
        self.snapshot, self.device = snapshot, device
        _check_sizes(self.trace, self._segments(), device)
        self.snapshot, self.device, self.settings, self.recorded = snapshot, device, settings, recorded
        self.sites = sites if sites is not None else Sites()
        self.start = self._rebuild()
        self.recorded_reserved, self.oom_capacity = self._recorded_reserved()
        self.capacity = capacity if capacity is not None else self.oom_capacity
        self.fraction_limit = fraction_limit
        self.compare = recorded and capacity is None  # a replay on another device size is not checked
        self.live: dict[int, Block] = {}
        self._marks = read_marks(snapshot)

    # -- the state at the first event ---------------------------------------------------

    def _rebuild(self) -> _Start:
        start = _Start(self._start_segments())
        in_trace: set[int] = set()
        for e in self.trace:
            action, addr = e.get("action"), _int(e.get("addr", 0))
            if action == "alloc":
                in_trace.add(addr)
            elif action == "free_requested" and addr not in in_trace and addr not in start.live:
                start.live[addr] = (0, _int(e["size"]), None, False, False)
            elif action == "free_completed":
                if addr in in_trace:
                    in_trace.discard(addr)
                elif addr not in start.live:
                    start.live[addr] = (0, _int(e["size"]), None, True, False)
        for seg in self._segments():
            for b in seg.get("blocks") or ():
                addr = _int(b.get("address", 0))
                if b.get("state") in ACTIVE and addr not in in_trace:
                    old = start.live.get(addr)
                    requested = _int(b.get("requested_size", b["size"]))
                    start.live[addr] = (
                        _int(b["size"]),
                        old[1] if old else requested,
                        b.get("frames"),
                        old[3] if old else False,
                        True,
                    )
        start.wrapped = bool(start.live) or bool(start.segments)
        return start

    def _segments(self) -> list[Mapping[str, Any]]:
        return [s for s in self.snapshot["segments"] if isinstance(s, dict) and _int(s.get("device", 0)) == self.device]

    def _start_segments(self) -> dict[int, tuple[int, bool, int, bool]]:
        """addr -> (size, small, stream, expandable) at the first event: the end's, the trace's segment events undone.

        An expandable segment shows as its mapped ranges (as the snapshot
        lists them); a range unmapped in the trace is taken as large when a
        whole number of 20 MiB pages, else small.
        """
        segs: dict[int, tuple[int, bool, int, bool]] = {}
        for seg in self._segments():
            size = _int(seg["total_size"])
            small = seg.get("segment_type") == "small" if "segment_type" in seg else size == SMALL_BUFFER
            segs[_int(seg["address"])] = (size, small, _int(seg.get("stream", 0)), seg.get("is_expandable") is True)
        for e in reversed(self.trace):
            action, addr, size = e.get("action"), _int(e.get("addr", 0)), _int(e.get("size", 0))
            if action == "segment_alloc":
                segs.pop(addr, None)
            elif action == "segment_free":
                segs[addr] = (size, size == SMALL_BUFFER, _int(e.get("stream", 0)), False)
            elif action == "segment_map":
                _carve(segs, addr, size)
            elif action == "segment_unmap":
                segs[addr] = (size, size % LARGE_BUFFER != 0, _int(e.get("stream", 0)), True)
        return segs

    def _recorded_reserved(self) -> tuple[list[int], int | None]:
        """The recorded reserved bytes after each trace event; the capacity an oom entry reveals."""
        reserved = sum(seg[0] for seg in self.start.segments.values())
        out, capacity = [], None
        for e in self.trace:
            action = e.get("action")
            if action in GROWS:
                reserved += GROWS[action] * _int(e.get("size", 0))
            elif action == "oom" and capacity is None:
                capacity = reserved + _int(e.get("device_free", 0))
            out.append(reserved)
        return out, capacity

    def _place_start(self, sim: Allocator) -> None:
        by_segment: dict[int, list[Live]] = {a: [] for a in self.start.segments}
        seg_addrs = sorted(self.start.segments)
        for addr, (size, requested, frames, pending, known) in sorted(self.start.live.items()):
            seg = _containing(seg_addrs, self.start.segments, addr)
            if seg is not None:
                by_segment[seg].append(
                    (
                        addr,
                        size if known else round_size(requested, self.settings),
                        requested,
                        self.sites.of(frames),
                        pending,
                    )
                )
        expandable: dict[tuple[bool, int], tuple[list[tuple[int, int]], list[Live]]] = {}
        for seg_addr, live in by_segment.items():
            size, small, stream, is_expandable = self.start.segments[seg_addr]
            live = self._unsplit_tails(seg_addr + size, small or is_expandable, live)
            if is_expandable:
                ranges, lives = expandable.setdefault((small, stream), ([], []))
                ranges.append((seg_addr, size))
                lives += live
                continue
            for b in sim.add_segment(seg_addr, size, small, stream, live):
                self.live[b.addr] = b
        for (small, stream), (ranges, lives) in expandable.items():
            for b in sim.add_expandable(_merged(ranges), small, stream, lives):
                self.live[b.addr] = b

    def _unsplit_tails(self, end: int, fine: bool, live: list[Live]) -> list[Live]:
        """A block of unknown size takes the gap after it when the allocator would not have split that off.

        *fine*: the segment splits off any rest of 512 bytes or more (small pool, expandable segment).
        """
        known = {addr for addr, (_, _, _, _, k) in self.start.live.items() if k}
        out = []
        live = sorted(live)
        for i, (addr, size, requested, site, pending) in enumerate(live):
            nxt = live[i + 1][0] if i + 1 < len(live) else end
            gap = nxt - addr - size
            if addr not in known and gap > 0:
                splits = gap >= 512 if fine else (size < self.settings.max_split_size and gap > SMALL_SIZE)
                if not splits:
                    size += gap
            out.append((addr, size, requested, site, pending))
        return out

    # -- the replay ------------------------------------------------------------------------

    def run(self, stop_at: int | None = None) -> tuple[Allocator, Outcome]:
        """Replay up to event *stop_at* (all by default); the allocator as it stands then and the outcome."""
        self._fresh = FRESH_BASE
        self._new_segments: list[tuple[int, int]] = []  # recorded (addr, size) made before the coming alloc
        sim = Allocator(self.settings, self.capacity, self._address, self.fraction_limit)
        self._sim, self.live, self._held = sim, {}, []
        self._place_start(sim)
        out = Outcome(f"cuda:{self.device}", self.settings.describe())
        out.wrapped, out.entries = self.start.wrapped, len(self.trace)
        if sim.capacity is not None and sim.reserved > sim.capacity:
            out.set_oom_at_start(sim)  # out of memory before the trace began: no event of it is to blame
            out.finish(sim, None, self._recorded_summary())
            return sim, out
        peak_seen = (sim.reserved_peak, sim.allocated_at_reserved_peak)
        recorded_events: list[tuple[str, int, int]] = []
        retries = self._retries() if self.recorded else {}
        hold_until = -1
        for i, e in enumerate(self.trace):
            if stop_at is not None and i > stop_at:
                break
            action = e.get("action")
            if action in GROWS:
                recorded_events.append((action, _int(e.get("addr", 0)), _int(e.get("size", 0))))
                if action in ("segment_alloc", "segment_map") and self.recorded:
                    self._new_segments.append((_int(e.get("addr", 0)), _int(e.get("size", 0))))
            hold_until = retries.get(i, hold_until)
            if i < hold_until:
                self._held.append(i)  # part of the coming malloc's release: replayed with it
            elif not self._step(i, e, sim, out):
                break
            sim.note_peak()
            out.over_time.add(_int(e.get("time_us", 0)) * 1000, sim.reserved, sim.allocated)
            if (sim.reserved_peak, sim.allocated_at_reserved_peak) > peak_seen:
                peak_seen, out.peak_event = (sim.reserved_peak, sim.allocated_at_reserved_peak), i
        out.finish(sim, recorded_events if self.compare else None, self._recorded_summary())
        return sim, out

    def _address(self, size: int) -> int:
        """A new segment's address: the recording's, under the recorded settings, else a fresh one."""
        expandable = self.settings.expandable_segments  # a new expandable segment's first map is at its base
        while self._new_segments:
            addr, rec_size = self._new_segments.pop(0)
            if expandable and not any(_grows(self._sim, s, addr) for s in self._sim.segments.values()):
                return addr
            if not expandable and rec_size == size and addr not in self._sim.segments:
                return addr
        addr = self._fresh
        self._fresh += -(-size // SMALL_BUFFER) * SMALL_BUFFER
        return addr

    def _step(self, i: int, e: Mapping[str, Any], sim: Allocator, out: Outcome) -> bool:
        """One trace event applied to the replay; False when the replay stops (out of memory)."""
        action = e.get("action")
        if action in ("segment_free", "segment_unmap"):
            self._released(i, sim)
        elif action == "alloc":
            if not self._alloc(i, e, sim, out):
                return False
            self._new_segments.clear()
        elif action == "free_requested":
            b = self.live.get(_int(e.get("addr", 0)))
            if b is not None:
                sim.free_request(b)
        elif action == "free_completed":
            b = self.live.pop(_int(e.get("addr", 0)), None)
            if b is not None:
                sim.free_complete(b)
        elif action == "oom":
            self._oom(i, e, sim, out)
        return True

    def _oom(self, i: int, e: Mapping[str, Any], sim: Allocator, out: Outcome) -> None:
        b = sim.malloc(_int(e.get("size", 0)), _int(e.get("stream", 0)), self.sites.of(e.get("frames")))
        if b is not None:
            sim.free(b)
            if self.compare:
                out.differ(i, "the recording ran out of memory here; the simulation found room")
            else:
                out.notes.append(f"the recording ran out of memory at trace event {i}: not in this replay")
        elif out.oom is None:
            out.set_oom(i, e, sim, self.sites, self._phase(e), recorded=True)  # the recording's own OOM too

    def _phase(self, e: Mapping[str, Any]) -> str | None:
        """The gpuflame phase running at trace entry *e*, where the snapshot carries phase marks."""
        if self._marks is None:
            return None
        name = self._marks.at(e.get("time_us"))
        return None if name == NO_PHASE else name

    def _retries(self) -> dict[int, int]:
        """Releases that may be a malloc's retry: the frees completed and segments freed just before a new
        segment and its allocation. Their first event -> the allocation's index."""
        t, out, i = self.trace, {}, 0
        while i < len(t):
            if t[i].get("action") not in ("segment_free", "segment_unmap"):
                i += 1
                continue
            first = i
            while first > 0 and t[first - 1].get("action") == "free_completed":
                first -= 1
            while i < len(t) and t[i].get("action") in RELEASE_RUN:
                i += 1
            k = i
            while k < len(t) and t[k].get("action") in ("segment_alloc", "segment_map"):
                k += 1
            if i < k < len(t) and t[k].get("action") == "alloc":
                out[first] = k
        return out

    def _alloc(self, i: int, e: Mapping[str, Any], sim: Allocator, out: Outcome) -> bool:
        """One recorded allocation; False when the simulated device is out of memory (the program would stop)."""
        addr, size, stream = _int(e.get("addr", 0)), _int(e.get("size", 0)), _int(e.get("stream", 0))
        made = len(sim.events)
        cached = True
        if self._held:  # the release the trace shows before this allocation
            cached = sim.fits_cached(size, stream)  # a cached block fits: it was empty_cache(), not a retry
            for j in self._held:
                self._step(j, self.trace[j], sim, out)
            self._held = []
        b = sim.malloc(size, stream, self.sites.of(e.get("frames")), cached=cached)
        if b is None:
            out.set_oom(i, e, sim, self.sites, self._phase(e))
            return False
        out.allocations += 1
        if b.addr == addr:
            out.placed += 1
        elif self.compare and out.first_difference is None:
            made_new = any(a == "segment_alloc" for a, _, _ in sim.events[made:])
            out.differ(i, _why(self.trace, i, made_new), addr=addr, simulated_addr=b.addr, size=size)
        old = self.live.pop(addr, None)
        if old is not None and (old.allocated or old.pending):
            sim.free(old)  # the recording reused an address the replay still holds: it was freed unseen
        self.live[addr] = b
        return True

    def _released(self, i: int, sim: Allocator) -> None:
        """Recorded segments freed: by empty_cache(), or by a cudaMalloc that failed (the device was full).

        Under the recorded settings the replay frees the very segments the
        recording freed (a release just before a new segment and its
        allocation is held and replayed with that allocation, as its retry
        when no cached block fitted before it: :meth:`_retries`); under
        others it empties the cache, as both would. A release just before
        an ``oom`` entry is the failing allocation's own: the capacity
        replays it.
        """
        e = self.trace[i]
        if self.recorded and e.get("action") == "segment_free":
            if sim.release_segment(_int(e.get("addr", 0))):
                return
        prev = self.trace[i - 1].get("action") if i else None
        if prev in ("segment_free", "segment_unmap"):
            return  # the same release
        j = i
        while j < len(self.trace) and self.trace[j].get("action") in RELEASE_RUN:
            j += 1
        if j < len(self.trace) and self.trace[j].get("action") == "oom":
            return
        if not self.recorded or e.get("action") == "segment_unmap":
            sim.release_cached()

    def _recorded_summary(self) -> dict[str, int]:
        peak = max([sum(seg[0] for seg in self.start.segments.values()), *self.recorded_reserved])
        made = sum(1 for e in self.trace if e.get("action") in ("segment_alloc", "segment_map"))
        return {"reserved_peak": peak, "segments_allocated": made}


def _why(trace: list[Any], i: int, simulated_new: bool) -> str:
    recorded_new = i > 0 and trace[i - 1].get("action") in ("segment_alloc", "segment_map")
    if recorded_new and not simulated_new:
        return "the recording made a new segment here; the simulation reused a cached block"
    if simulated_new and recorded_new:
        return "both made a new segment here, but of different sizes"
    if simulated_new and not recorded_new:
        return "the simulation found no cached block that fits and made a new segment; the recording reused one"
    return (
        "both reused cached blocks, but different ones: the state before differed, "
        "or the recording lacks what decided it"
    )


def _grows(sim: Allocator, seg: Segment, addr: int) -> bool:
    """Whether a recorded map at *addr* can be pages added to the simulated expandable segment *seg*.

    Pages are mapped at the start of an unmapped range, so never past the
    start of the segment's unmapped tail. The simulated segment's address
    space (1 TiB where the device's size is unknown) may be far larger than
    the recording's (9/8 of the device's memory), so an address inside it but
    past that tail is another segment's base, not this one's growth.
    """
    end = seg.addr + seg.size
    if not seg.addr <= addr < end:
        return False
    if not seg.expandable:
        return True
    pool = sim.small if seg.small else sim.large
    tail = next((b.addr for b in pool.unmapped_blocks.values() if b.segment is seg and b.addr + b.size == end), end)
    return addr <= tail


def _carve(segs: dict[int, tuple[int, bool, int, bool]], addr: int, size: int) -> None:
    """Take [addr, addr + size) out of the mapped ranges it overlaps (undoing a segment_map)."""
    end = addr + size
    for start, (length, small, stream, expandable) in list(segs.items()):
        if expandable and start < end and addr < start + length:
            del segs[start]
            if addr > start:
                segs[start] = (addr - start, small, stream, True)
            if end < start + length:
                segs[end] = (start + length - end, small, stream, True)


def _merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for addr, size in sorted(ranges):
        if out and out[-1][0] + out[-1][1] == addr:
            out[-1] = (out[-1][0], out[-1][1] + size)
        else:
            out.append((addr, size))
    return out


def _containing(addrs: list[int], segments: dict[int, tuple[int, bool, int, bool]], addr: int) -> int | None:
    from bisect import bisect_right

    i = bisect_right(addrs, addr) - 1
    if i >= 0 and addr < addrs[i] + segments[addrs[i]][0]:
        return addrs[i]
    return None


SIZE_KEYS = ("size", "device_free")


def _check_sizes(trace: list[dict[str, Any]], segments: list[Mapping[str, Any]], device: int) -> None:
    """Every size the replay reads is a whole number from 0 to the largest device (else one line, exit 2)."""
    for i, e in enumerate(trace):
        for key in SIZE_KEYS:
            if key in e:
                _size(e[key], f"trace entry {i} of cuda:{device} ({key})")
    for seg in segments:
        where = f"the segment at {_int(seg.get('address', 0)):#x} of cuda:{device}"
        _size(seg.get("total_size", 0), where)
        for b in seg.get("blocks") or ():
            if isinstance(b, Mapping):
                _size(b.get("size", 0), f"a block of {where}")
                _size(b.get("requested_size", 0), f"a block of {where}")


def _size(value: Any, where: str) -> int:
    n = _int(value)
    if n < 0:
        raise ProfileFormatError(f"a size in the snapshot is negative: {n} at {where}")
    if n > MAX_DEVICE:
        raise ProfileFormatError(
            f"a size in the snapshot is larger than any GPU (none has more than 1 TiB): {n:,} bytes at {where}"
        )
    return n


def _int(value: Any) -> int:
    if type(value) is int:
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProfileFormatError(f"a number in the snapshot is not an integer: {type(value).__name__}")
    return int(value)
