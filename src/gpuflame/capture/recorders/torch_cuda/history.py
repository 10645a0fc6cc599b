"""Peak and allocated totals over a whole run, from a bounded allocator trace.

PyTorch keeps the allocator's history in a ring buffer of ``max_entries``
events: over a long run the oldest events are overwritten, and a snapshot's
trace covers only the last window. So each snapshot the backend takes (at
every ``--interval`` and at exit) is folded in here:

* allocated (``alloc_*``): the events not seen in an earlier snapshot are
  converted and added to a running sum per stack, so the total covers the
  whole run as long as the buffer does not wrap between two snapshots;
* peak (``peak_*``): each snapshot's replay finds the highest moment of its
  window; the highest of those windows (in allocated bytes, as one replay
  picks its moment) is the run's peak, so it is never below the latest in use;
* in use: always the latest snapshot.

Memory stays bounded: the sums are per distinct stack, not per event.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from gpuflame.formats.snapshot_phases import PHASES_KEY
from gpuflame.formats.torch_snapshot import allocated_bytes, from_snapshot
from gpuflame.model import Profile, merge, select_types
from gpuflame.model.categories import CATEGORIES_KEY
from gpuflame.model.peak import PeakUnit
from gpuflame.model.phases import PhaseStat, ordered
from gpuflame.model.sample_types import (
    ALLOC_OBJECTS,
    ALLOC_SPACE,
    INUSE_OBJECTS,
    INUSE_SPACE,
    PEAK_OBJECTS,
    PEAK_SPACE,
)
from gpuflame.symbols.qualnames import Resolver

EventKey = tuple[Any, ...]


class SnapshotHistory:
    """Snapshots of one process folded into one profile for the whole run."""

    def __init__(self, max_entries: int | None = None, native: bool = False) -> None:
        self.max_entries = max_entries
        self.native = native  # keep the C++ frames of stacks="all" (--native)
        self.resolver = Resolver()
        self.snapshots = 0
        self._alloc: Profile | None = None
        self._peak: Profile | None = None
        self._peak_total = -1
        self._seen_until: dict[int, int] = {}  # device -> latest time_us folded
        self._seen_at_edge: dict[int, set[EventKey]] = {}  # events at that very microsecond
        self._phases: dict[tuple[str, str], PhaseStat] = {}  # (phase, device) -> its row over all snapshots
        self._reserved: dict[str, tuple[int, int, int]] = {}  # device -> the highest reserved peak seen, with its
        # allocations and time (PeakUnit's reserved fields)

    def add(self, snapshot: Mapping[str, Any]) -> Profile:
        """Fold in one snapshot; the profile of the run so far."""
        current = from_snapshot(snapshot, max_entries=self.max_entries, resolver=self.resolver, native=self.native)
        self.snapshots += 1
        self._fold_peak(current)
        self._fold_alloc(snapshot)
        parts = [p for p in (self._peak, _types(current, INUSE_SPACE, INUSE_OBJECTS), self._alloc) if p is not None]
        out = merge(parts)
        out.default_type = PEAK_SPACE.type
        out.comments = list(current.comments)
        out.phases = self._fold_phases(current.phases)
        out.history = current.history  # the latest snapshot's trace: the ring buffer is the history's bound
        out.peaks = self._fold_reserved(current)
        if self.snapshots > 1:
            out.comments.append(
                f"peak and allocated cover {self.snapshots} snapshots of the allocator's trace; in use is the latest"
            )
        return out

    def _fold_peak(self, current: Profile) -> None:
        if PEAK_SPACE.type not in current.type_names():
            return
        total = allocated_bytes(current, PEAK_SPACE.type)  # the moment with the most allocated, as one replay picks it
        if total > self._peak_total:
            self._peak_total = total
            self._peak = _types(current, PEAK_SPACE, PEAK_OBJECTS)

    def _fold_reserved(self, current: Profile) -> list[PeakUnit]:
        """The peak's units (one per device), each with the highest reserved peak any snapshot's trace saw:
        the peak part may come from an earlier snapshot than the latest, and so may the reserved peak."""
        for u in current.peaks:
            if u.reserved > self._reserved.get(u.device, (0, 0, 0))[0]:
                self._reserved[u.device] = (u.reserved, u.reserved_allocated, u.reserved_at)
        units = self._peak.peaks if self._peak is not None else []
        out = []
        for u in units:
            if u.device in self._reserved:
                reserved, allocated, at = self._reserved[u.device]
                u = replace(u, reserved=reserved, reserved_allocated=allocated, reserved_at=at)
            out.append(u)
        return out

    def _fold_phases(self, rows: list[PhaseStat]) -> list[PhaseStat]:
        """Per phase, the highest moment any snapshot's window saw; its end and in use as the latest saw them."""
        for r in rows:
            key = (r.phase, r.device)
            old = self._phases.get(key)
            if old is not None and old.peak > r.peak:  # that moment fell out of the ring buffer since
                r = replace(
                    r,
                    peak=old.peak,
                    peak_time=old.peak_time,
                    top=old.top,
                    top_bytes=old.top_bytes,
                    start=min(old.start, r.start),
                )
            self._phases[key] = r
        return ordered(self._phases.values())

    def _fold_alloc(self, snapshot: Mapping[str, Any]) -> None:
        fresh = [self._new_events(device, trace) for device, trace in enumerate(snapshot.get("device_traces") or [])]
        if not any(fresh):
            return
        converted = from_snapshot(
            {
                "segments": [],
                "device_traces": fresh,
                CATEGORIES_KEY: snapshot.get(CATEGORIES_KEY),
                PHASES_KEY: snapshot.get(PHASES_KEY),
            },
            resolver=self.resolver,
            native=self.native,
        )
        alloc = _types(converted, ALLOC_SPACE, ALLOC_OBJECTS)
        alloc.comments = []
        alloc.phases = []
        self._alloc = alloc if self._alloc is None else merge([self._alloc, alloc]).compact()

    def _new_events(self, device: int, trace: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        """Events of *trace* that no earlier snapshot had (by time, then identity at the edge)."""
        until = self._seen_until.get(device, -1)
        edge = self._seen_at_edge.get(device, set())
        fresh = [e for e in trace if e["time_us"] > until or (e["time_us"] == until and _key(e) not in edge)]
        if fresh:
            last = max(e["time_us"] for e in fresh)
            at_last = {_key(e) for e in trace if e["time_us"] == last}
            self._seen_until[device] = last
            self._seen_at_edge[device] = at_last | (edge if last == until else set())
        return fresh


def _key(event: Mapping[str, Any]) -> EventKey:
    return (event.get("action"), event.get("addr"), event.get("size"), event.get("stream"))


def _types(profile: Profile, *types: Any) -> Profile:
    present = [t for t in types if t.type in profile.type_names()]
    return select_types(profile, present)
