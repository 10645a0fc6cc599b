"""One device's allocator trace replayed: the ``alloc_*`` and ``peak_*`` views, the timeline, the event
history, and the comments that qualify them (formats/torch_snapshot.py says what each counts)."""

from __future__ import annotations

from array import array
from collections.abc import Mapping
from datetime import datetime, timezone
from itertools import repeat
from operator import itemgetter, methodcaller
from typing import Any

from gpuflame.formats.snapshot_blocks import (
    BEFORE_TRACE_FRAME,
    CACHED_FREE_FRAME,
    INT64_MAX,
    NO_STACK_FRAME,
    ROUNDING_FRAME,
    RowKey,
    block_frames,
    checked_int,
    requested_bytes,
    tally,
)
from gpuflame.formats.snapshot_book import SnapshotBook
from gpuflame.formats.snapshot_phases import phase_table as replay_phases
from gpuflame.formats.snapshot_walk import BEFORE, Walk, in_time_order
from gpuflame.model import history as event_history
from gpuflame.model.categories import BLOCK_CATEGORY_KEY
from gpuflame.model.history import History, Track
from gpuflame.model.profile import PYTHON, Labels
from gpuflame.model.timeline import Timeline
from gpuflame.units import format_bytes

TORCH_2_0 = (
    " (torch 2.0 keeps 1 by default: _record_memory_history(True, trace_alloc_max_entries=N) there, "
    "max_entries=N from torch 2.1)"
)
# Out-of-memory events described one comment each; the rest are counted (a file can hold millions).
_OOM_COMMENTS = 20


class DeviceTrace:
    """One device's trace: alloc samples, the peak, and what qualifies them."""

    def __init__(self, conv: SnapshotBook, device: int, trace: list[Any]) -> None:
        self.conv = conv
        self.device = device
        self.trace = in_time_order(trace)
        self.name = conv.device_name(device)

    def replay(self) -> tuple[int, int] | None:
        """Walk the trace once; add alloc and peak samples; return its time window."""
        conv = self.conv
        walk = Walk(self.trace, conv.marks)
        walk.run()
        always = self._alive_throughout(walk.live, walk.release_on_request)
        before_bytes = walk.before_bytes + sum(size for _, size, _ in always)
        still_live = [v for v in walk.live.values() if v[0] <= walk.best_i] + always  # their blocks are known
        peak_set = walk.closed_at_peak + still_live
        best, seg, seg_at_best = walk.best, walk.seg, walk.seg_at_best
        # reserved at a moment = reserved at the end minus segments added since
        reserved_end = conv.reserved.get(self.device, 0)
        reserved_start = reserved_end - seg
        stack_at = self._stacks_of_allocs(walk.allocs)
        self._add_allocs(walk.allocs, stack_at)
        self._add_timeline(walk.points, before_bytes)
        base = [(frames, size, None) for frames, size in walk.base]
        base += [(block_frames(block), size, block) for _, size, block in always]
        self._add_history(walk.events, base, stack_at, {start for start, _, _ in walk.live.values()})
        if walk.marks is not None and self._window() is not None:
            conv.profile.phases += replay_phases(
                self.trace,
                walk.marks,
                self.name,
                before_bytes,
                walk.release_on_request,
                self._leaf_name,
                BEFORE_TRACE_FRAME.name,
            )
        end_set = self._end_state()
        if sum(size for _, size, _ in end_set) > before_bytes + best:
            # the replay stayed below what the allocator holds at the end
            # (frees requested, never completed): the end is the peak
            conv.comment(
                f"{self.name}: the allocations alive when the snapshot was taken are more than the trace's "
                "replay reaches at any moment (frees requested but not completed?); peak_* is that end state"
            )
            peak_set, still_live, seg_at_best = end_set, end_set, seg
            best = sum(size for _, size, _ in end_set) - before_bytes
        reserved_at_peak = reserved_end - (seg - seg_at_best)
        if reserved_start >= before_bytes:  # the segment events add up: the reserved peak is known
            at = self.trace[walk.seg_top_i].get("time_us") if walk.seg_top_i >= 0 else self.trace[0].get("time_us")
            conv.reserved_peaks[self.device] = (
                reserved_start + walk.seg_top,
                before_bytes + walk.delta_at_top,
                at * 1000 if type(at) is int and 0 <= at <= INT64_MAX // 1000 else 0,
            )
        self._add_peak(
            peak_set,
            stack_at,
            before_bytes + best,
            reserved_at_peak,
            reserved_start >= before_bytes,
            self._rounding(still_live),
        )
        self._comment_reserved_after_peak(reserved_at_peak, reserved_end)
        window = self._window()
        older = sum(size for _, size, _ in always)  # alive at the peak, allocated before the trace began
        if window is None:
            exact = "peak_* and the end are exact but " if not (older or walk.freed_unknown) else ""
            conv.comment(
                f"{self.name}: the trace's events carry no times (time_us: older PyTorch versions record none), "
                f"so {exact}there is no memory-over-time strip and no --at or --between"
            )
        self._comment_window(window, walk.freed_unknown, (len(always), older))
        for i, e, d, s in walk.ooms[:_OOM_COMMENTS]:
            self._comment_oom(i, e, before_bytes + d, reserved_end - (seg - s))
        if len(walk.ooms) > _OOM_COMMENTS:
            conv.comment(f"{self.name}: {len(walk.ooms) - _OOM_COMMENTS:,} more out-of-memory events in the trace")
        if walk.unknown:
            conv.comment(f"{self.name}: ignored {walk.unknown} trace events of unknown kinds")
        return window

    def _alive_throughout(
        self, live: dict[Any, tuple[int, int, Any]], release_on_request: bool
    ) -> list[tuple[int, int, Any]]:
        """Blocks active at the end that the trace never allocated nor freed: older than it, still held.

        A block whose address the trace did allocate but no longer holds is
        one whose free was requested and not completed, replayed as freed
        (a trace recorded without ``free_completed`` events): not counted again.
        Nor is one allocated before the trace whose requested free the replay
        took as its free (it is counted among the bytes freed from before the trace).
        """
        out = []
        seen: set[Any] | None = None
        counted = ("alloc", "free_completed", "free_requested") if release_on_request else ("alloc", "free_completed")
        for addr, block in self.conv.active.get(self.device, {}).items():
            if addr in live:
                continue
            if seen is None:
                seen = {e["addr"] for e in self.trace if e["action"] in counted}
            if addr not in seen:
                size = requested_bytes(block)
                out.append((-1, checked_int(size, "block requested_size"), block))
        return out

    def _end_state(self) -> list[tuple[int, int, Any]]:
        """The active blocks at the end, as peak entries (their requested bytes)."""
        out = []
        for block in self.conv.active.get(self.device, {}).values():
            out.append((-1, requested_bytes(block), block))
        return out

    def _rounding(self, entries: list[tuple[int, int, Any]]) -> int:
        """The allocator's rounding (block size - requested) of allocations whose block is known."""
        active = self.conv.active.get(self.device, {})
        total = 0
        for _, size, source in entries:
            block = source if source is not None and "action" not in source else None
            if block is None and source is not None:
                block = active.get(source.get("addr"))
            if block is not None and requested_bytes(block) == size:
                total += block["size"] - size
        return total

    def _comment_reserved_after_peak(self, at_peak: int, at_end: int) -> None:
        if at_end > at_peak:
            self.conv.comment(
                f"{self.name}: the allocator reserved {format_bytes(at_end - at_peak)} more after the peak "
                f"({format_bytes(at_peak)} at the peak, {format_bytes(at_end)} at the end), so peak_space "
                "counts fewer reserved bytes than inuse_space; the live allocations are highest at the peak"
            )

    def _add_timeline(self, marks: list[tuple[Any, int]], baseline: int) -> None:
        """The live allocated bytes after each event, as the peak counts them.

        *baseline* is what was alive before the trace began (allocations the
        trace frees but never allocated, and blocks alive throughout), so
        the series' maximum is the peak's live allocations (``peak_space``
        without ``<cached free blocks>``) and its last point the end state's
        live allocations, at their requested sizes. Left out when the trace
        has no plausible times to plot against.
        """
        window = self._window()
        if not marks or window is None:
            return
        first, last = window
        times, deltas = zip(*marks, strict=True)
        if not _times_within(times, first, last):
            return
        # the series spans the trace's whole window, segment and oom events included
        stamps = [first * 1000, *map((1000).__mul__, times)]
        values = [baseline, *map(baseline.__add__, deltas)]
        if marks[-1][0] < last:
            stamps.append(last * 1000)
            values.append(values[-1])
        timeline = self.conv.profile.timeline
        if timeline is None:
            timeline = self.conv.profile.timeline = Timeline()
        timeline.add_columns(self.conv.label(self.device), stamps, values)

    def _stacks_of_allocs(self, allocs: list[int]) -> dict[int, tuple[int, ...]]:
        """Each alloc event's stack by its trace index, all read at once (formats/snapshot_stacks.py);
        -1, the walk's index for an allocation older than the trace, gives ``<allocated before the trace>``."""
        lists = list(map(methodcaller("get", "frames"), map(self.trace.__getitem__, allocs)))
        stack_at = dict(zip(allocs, self.conv.stacks.many(lists), strict=True))
        stack_at[-1] = (self.conv.profile.frame_id(BEFORE_TRACE_FRAME),)
        return stack_at

    def _add_history(
        self,
        events: list[tuple[Any, int, int]],
        base: list[tuple[Any, int, Any]],
        stack_at: dict[int, tuple[int, ...]],
        live_at_end: set[int],
    ) -> None:
        """The trace as the event history (model/history.py): its ring buffer is the bound.

        What was alive before the trace began is the base state at its first
        event (*base*: frames, bytes, the block when known); earlier moments
        are not available. Left out, as the timeline, when the trace has no
        plausible times. A site is a stack and its category: an allocation
        still live at the end (its trace index in *live_at_end*) takes the
        category the recorder marked on its block, its free the same site;
        a block freed before the snapshot is classed by its stack.
        """
        window = self._window()
        if not events or window is None:
            return
        # unzipped once, so that what follows runs per event in C
        times, sources, sizes = zip(*events, strict=True)
        if not _times_within(times, window[0], window[1]):
            return
        conv = self.conv
        before = stack_at[-1]
        site_of: dict[tuple[tuple[int, ...], Labels], int] = {}
        rows: dict[int, tuple[int, int]] = {}
        known = iter(conv.stacks.many([frames for frames, _, _ in base if frames is not BEFORE]))
        for frames, size, block in base:
            stack = before if frames is BEFORE else next(known)
            site = site_of.setdefault((stack, conv.history_labels(stack, self.device, block)), len(site_of))
            b, c = rows.get(site, (0, 0))
            rows[site] = (b + size, c + 1)
        # each event names its alloc event's index: sites are numbered in the order the events first name them
        firsts = list(dict.fromkeys(sources))
        if conv.categorize:
            plain: dict[tuple[int, ...], Labels] = {}  # a stack's labels where no mark decides, made once
            keys = [self._history_site(i, stack_at[i], i in live_at_end, plain) for i in firsts]
        else:  # a saved snapshot: its device alone, per event in C
            keys = list(zip(map(stack_at.__getitem__, firsts), repeat(conv.label(self.device))))
        for key in dict.fromkeys(keys):
            site_of.setdefault(key, len(site_of))
        site_at = dict(zip(firsts, map(site_of.__getitem__, keys), strict=True))
        track = Track(
            (),
            0,
            0,
            window[0] * 1000,
            max(1, len(base)),
            rows,
            array("q", map((1000).__mul__, times)),
            array("q", map(site_at.__getitem__, sources)),
            array("q", sizes),
        )
        one = History(conv.profile.frames, list(site_of), [track])
        conv.profile.history = event_history.merged([conv.profile.history, one])

    def _history_site(
        self, source: int, stack: tuple[int, ...], live: bool, plain: dict[tuple[int, ...], Labels]
    ) -> tuple[tuple[int, ...], Labels]:
        """The history site of the allocation at trace index *source*: its stack, its labels (its category:
        the recorder's mark on its block when it is still live at the end, else its stack's, kept in *plain*)."""
        conv = self.conv
        marked = self._marked(self.trace[source]) if live and conv.categorize else None
        if marked is not None:
            return stack, conv.history_labels(stack, self.device, {BLOCK_CATEGORY_KEY: marked})
        labels = plain.get(stack)
        if labels is None:
            labels = plain[stack] = conv.history_labels(stack, self.device, None)
        return stack, labels

    def _add_allocs(self, allocs: list[int], stack_at: dict[int, tuple[int, ...]]) -> None:
        """The alloc_* rows (one per stack and phase), in the order of their first event."""
        entries = list(map(self.trace.__getitem__, allocs))
        marks = self.conv.marks
        phases = repeat(None) if marks is None else map(marks.at, map(methodcaller("get", "time_us"), entries))
        rows: dict[tuple[tuple[int, ...], str | None], list[int]] = {}
        keys = zip(map(stack_at.__getitem__, allocs), phases, strict=False)  # phases: repeat(None) without marks
        for key, size in zip(keys, map(itemgetter("size"), entries), strict=True):
            tally(rows, key, size)
        for (stack, phase), (size, count) in rows.items():
            self.conv.add(stack, self.device, "alloc_space", size, count, phase=phase)

    def _leaf_name(self, entry: Any) -> str:
        """The function an alloc entry's stack ends in (its leaf), for the phase table."""
        stack = self.conv.stacks.stack(entry.get("frames"))
        return self.conv.profile.frames[stack[0]].name if stack else NO_STACK_FRAME.name

    def _phase_of(self, source: Any) -> str | None:
        """The phase a peak entry was allocated in: a trace entry's time, a block's last alloc."""
        conv = self.conv
        if conv.marks is None or source is None:
            return None
        if "action" in source:
            return conv.marks.at(source.get("time_us"))
        return conv.phase_of_block(self.device, source.get("address"))

    def _marked(self, source: Any) -> str | None:
        """The graph's category of a block live at the peak: its own mark, or that of the same allocation at the end."""
        if source is None:
            return None
        if "action" not in source:
            return source.get(BLOCK_CATEGORY_KEY)
        block = self.conv.active.get(self.device, {}).get(source.get("addr"))
        if block is not None and block.get("frames") == source.get("frames") and block["size"] == source.get("size"):
            return block.get(BLOCK_CATEGORY_KEY)
        return None

    def _add_peak(
        self,
        peak_set: list[tuple[int, int, Any]],
        stack_at: dict[int, tuple[int, ...]],
        allocated: int,
        reserved: int,
        sound: bool,
        rounding: int,
    ) -> None:
        """Samples for what was alive at the peak, and the reserved rest.

        *reserved* is what the allocator held at the peak; *sound* says the
        trace's segment events add up (the memory reserved at the start holds
        the allocations alive at the start); *rounding* is the allocator's
        rounding of the allocations whose blocks are known (still alive at
        the end), shown under ``<allocator rounding>``. A trace entry's stack
        is its alloc event's in *stack_at*; the blocks' are read at once.
        """
        conv = self.conv
        blocks = [block_frames(source) for _, _, source in peak_set if source is not None and "action" not in source]
        block_stacks = iter(conv.stacks.many(blocks))
        by_stack: dict[RowKey, list[int]] = {}
        for start, size, source in peak_set:
            if source is None:
                st = stack_at[-1]
            elif "action" in source:  # a trace entry
                st = stack_at[start]
            else:  # a block
                st = next(block_stacks)
            tally(by_stack, (st, self._marked(source) if conv.categorize else None, self._phase_of(source)), size)
        for (st, marked, phase), (size, count) in by_stack.items():
            conv.add(st, self.device, "peak_space", size, count, {BLOCK_CATEGORY_KEY: marked}, phase)
        cached = reserved - allocated - rounding
        if sound and cached >= 0:
            if rounding:
                conv.add((conv.profile.frame_id(ROUNDING_FRAME),), self.device, "peak_space", rounding, 0)
            if cached:
                conv.add((conv.profile.frame_id(CACHED_FREE_FRAME),), self.device, "peak_space", cached, 0)
        else:
            conv.comment(
                f"{self.name}: the memory reserved at the peak could not be reconstructed from the trace "
                f"(segment events missing?); peak_* shows the live allocations only"
            )

    def _window(self) -> tuple[int, int] | None:
        """First and last ``time_us``, if they are plausible times (they become pprof nanoseconds)."""
        first = self.trace[0].get("time_us")
        last = self.trace[-1].get("time_us")
        if type(first) is int and type(last) is int and 0 <= first <= last <= INT64_MAX // 1000:
            return first, last
        return None

    def _comment_window(self, window: tuple[int, int] | None, freed_unknown: int, older: tuple[int, int]) -> None:
        """Say where the trace does not reach back to the first allocation of what peak_* counts."""
        n = len(self.trace)
        full = self.conv.max_entries is not None and n >= self.conv.max_entries
        if not freed_unknown and not full and not older[0]:
            return
        span = f" from {_when(window[0])} to {_when(window[1])}" if window else ""
        why = []
        if full:
            limit = self.conv.max_entries
            why.append(f"it is full ({n:,} of max_entries {limit:,}), so older events were overwritten")
        if freed_unknown:
            one = freed_unknown == 1
            why.append(
                f"{freed_unknown:,} {'free' if one else 'frees'} in it {'is' if one else 'are'} of "
                f"{'an allocation' if one else 'allocations'} made before it began, so at least "
                f"{freed_unknown:,} earlier {'event is' if one else 'events are'} lost"
            )
        if older[0]:
            one = older[0] == 1
            why.append(
                f"{older[0]:,} {'allocation' if one else 'allocations'} alive in it ({format_bytes(older[1])}) "
                f"{'was' if one else 'were'} made before it began"
            )
        entries = f"{n:,} events" if n != 1 else f"1 event{TORCH_2_0}"
        self.conv.comment(
            f"{self.name}: the allocator trace does not reach back to the start of the run: it holds "
            f"{entries}{span}; " + "; ".join(why) + ". peak_* is the highest point within this "
            "recorded window only; an earlier, higher peak is possible"
        )

    def _comment_oom(self, index: int, entry: Mapping[str, Any], allocated: int, reserved: int) -> None:
        size = entry.get("size")
        free = entry.get("device_free")
        when = entry.get("time_us")
        parts = [f"{self.name}: out of memory"]
        if isinstance(when, int):
            parts.append(f" at {_when(when)}")
        parts.append(f" (trace event {index + 1:,} of {len(self.trace):,})")
        if isinstance(size, int):
            parts.append(f": asked for {format_bytes(size)}")
        if isinstance(free, int):
            parts.append(f" with {format_bytes(free)} free on the device")
        if allocated >= 0 and reserved >= allocated:
            parts.append(f"; PyTorch had {format_bytes(allocated)} allocated of {format_bytes(reserved)} reserved")
        where = self._leaf_python(entry.get("frames"))
        if where:
            parts.append(f"; in {where}")
        self.conv.comment("".join(parts))

    def _leaf_python(self, frames: Any) -> str:
        """The innermost Python frame of a stack, as ``name (file:line)``."""
        profile = self.conv.profile
        for fid in self.conv.stacks.stack(frames):
            frame = profile.frames[fid]
            if frame.kind == PYTHON:
                return f"{frame.name} ({frame.location()})" if frame.file else frame.name
        return ""


def _times_within(times: tuple[Any, ...], first: int, last: int) -> bool:
    """Every time an int between *first* and *last* (checked in C: a trace has millions)."""
    return set(map(type, times)) == {int} and first <= min(times) and max(times) <= last


def _when(time_us: int) -> str:
    """Epoch microseconds as a UTC time; the raw number if it is not a plausible time."""
    try:
        moment = datetime.fromtimestamp(time_us / 1e6, tz=timezone.utc)
    except (OverflowError, OSError, ValueError):
        return f"t={time_us} us"
    if moment.year < 2000:
        return f"t={time_us} us"
    return moment.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"
