"""One pass over a device's time-ordered allocator trace: live bytes, the peak, segments, what was older.

The running state the trace replay (formats/snapshot_trace.py) concludes
from; kept apart because it is the hot loop of reading a snapshot.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from itertools import islice
from typing import Any

from gpuflame.errors import ProfileFormatError
from gpuflame.formats.snapshot_blocks import checked_int
from gpuflame.formats.snapshot_phases import Marks

BEFORE = object()  # the event history's stand-in for the frames of an allocation older than the trace


class Walk:
    """The running state of one pass over a device's time-ordered trace: what ``replay`` concludes from.

    Sizes are relative to the trace's start (``delta``): what was alive
    before it is only known from its frees (``before_bytes``) and from the
    blocks still active at the end, which ``replay`` adds.
    """

    __slots__ = (
        "trace",
        "marks",
        "release_on_request",
        "live",
        "closed_at_peak",
        "allocs",
        "before_bytes",
        "freed_unknown",
        "best",
        "best_i",
        "seg",
        "seg_at_best",
        "ooms",
        "unknown",
        "points",
        "events",
        "base",
        "seg_top",
        "seg_top_i",
        "delta_at_top",
    )

    def __init__(self, trace: list[Any], marks: Marks | None) -> None:
        self.trace = trace
        self.marks = marks  # phase marks, when the recording had any
        # a trace recorded without free_completed events: a requested free is the free
        self.release_on_request = not any(e.get("action") == "free_completed" for e in trace)
        self.live: dict[Any, tuple[int, int, Any]] = {}  # addr -> (start index, size, entry or None)
        self.closed_at_peak: list[tuple[int, int, Any]] = []  # freed since the peak, alive at it
        self.allocs: list[int] = []  # the trace index of each alloc event
        self.before_bytes = 0  # allocations older than the trace, known from their frees
        self.freed_unknown = 0
        self.best = 0  # the live bytes at the peak, relative to the start
        self.best_i = -1  # the peak's trace index
        self.seg = self.seg_at_best = 0  # segment bytes added since the start: at the end, at the peak
        # the reserved peak: the most segment bytes added at any moment (0: the start), the trace index that
        # first reached it, and the most live bytes (relative) while they were that high (the least fragmentation)
        self.seg_top, self.seg_top_i, self.delta_at_top = 0, -1, 0
        self.ooms: list[tuple[int, Any, int, int]] = []  # (index, entry, delta, seg) of each oom event
        self.unknown = 0  # events of unknown kinds
        self.points: list[tuple[Any, int]] = []  # (time_us, delta) after each alloc and free: the timeline
        # (time_us, the trace index of the alloc event, or -1 before the trace, +-bytes): the event history
        self.events: list[tuple[Any, int, int]] = []
        self.base: list[Any] = []  # (frames or BEFORE, bytes) of what was alive before the trace began

    def run(self) -> None:
        """The single pass: live bytes after each alloc and free, the peak, segments, the rest noted."""
        live, closed, points, events = self.live, self.closed_at_peak, self.points, self.events
        allocs, release_on_request = self.allocs.append, self.release_on_request
        delta = best = seg = seg_at_best = top = delta_top = 0  # locals while the loop runs; stored when it ends
        best_i = top_i = -1
        for i, e in enumerate(self.trace):
            action = e["action"]
            if action == "alloc":
                addr = e["addr"]
                size = e["size"]
                if type(addr) is not int or type(size) is not int or size < 0:
                    raise ProfileFormatError(f"trace event {i + 1}: addr or size is not an integer")
                t = e.get("time_us")
                old = live.get(addr)
                if old is not None:  # the address came back without a recorded free
                    delta -= old[1]
                    events.append((t, old[0], -old[1]))
                    if old[0] <= best_i:
                        closed.append(old)
                live[addr] = (i, size, e)
                delta += size
                allocs(i)
                points.append((t, delta))
                events.append((t, i, size))
                if delta > best:
                    best, best_i, seg_at_best = delta, i, seg
                    closed.clear()
                if seg == top and delta > delta_top:
                    delta_top = delta
            elif action == "free_completed" or (action == "free_requested" and release_on_request):
                addr = e["addr"]
                if type(addr) is not int:
                    raise ProfileFormatError(f"trace event {i + 1}: addr is not an integer")
                t = e.get("time_us")
                old = live.pop(addr, None)
                if old is None:  # allocated before the trace began
                    delta -= self._free_before(i, e)
                else:
                    delta -= old[1]
                    if old[0] <= best_i:
                        closed.append(old)
                    events.append((t, old[0], -old[1]))
                points.append((t, delta))
            elif action != "free_requested":
                # (a requested free changes nothing: an allocation counts until its free completes;
                # one the trace never saw allocated is picked up at completion, or from the blocks
                # when it is still pending at the end)
                seg = self._other(i, e, action, delta, seg)
                if seg > top:
                    top, top_i, delta_top = seg, i, delta
                elif seg == top and delta > delta_top:
                    delta_top = delta
        self.best, self.best_i, self.seg, self.seg_at_best = best, best_i, seg, seg_at_best
        self.seg_top, self.seg_top_i, self.delta_at_top = top, top_i, delta_top

    def _free_before(self, i: int, e: Mapping[str, Any]) -> int:
        """A free of an allocation made before the trace began: alive at any peak; its size."""
        size = checked_int(e["size"], f"trace event {i + 1} size")
        self.before_bytes += size
        self.freed_unknown += 1
        self.closed_at_peak.append((-1, size, None))
        self.base.append((BEFORE, size))
        self.events.append((e.get("time_us"), -1, -size))
        return size

    def _other(self, i: int, e: Mapping[str, Any], action: str, delta: int, seg: int) -> int:
        """A segment, oom or unknown event (rare beside allocs and frees); returns the segment bytes after it."""
        if action == "segment_alloc" or action == "segment_map":
            seg += checked_int(e["size"], f"trace event {i + 1} size")
        elif action == "segment_free" or action == "segment_unmap":
            seg -= checked_int(e["size"], f"trace event {i + 1} size")
        elif action == "oom":
            self.ooms.append((i, e, delta, seg))
        elif action != "snapshot":
            self.unknown += 1
        return seg


def in_time_order(trace: list[Any]) -> list[Any]:
    """The ring buffer hands entries out oldest first; re-sort only if they are not.

    Sorting is stable, so events recorded within the same microsecond keep
    the order the allocator recorded them in.
    """
    try:
        times = [e["time_us"] for e in trace]
        if all(map(operator.le, times, islice(times, 1, None))):
            return trace
        if any(type(t) is not int for t in times):
            return trace
    except (KeyError, TypeError, RecursionError):  # no usable times: keep the recorded order
        return trace
    return sorted(trace, key=lambda e: e["time_us"])
