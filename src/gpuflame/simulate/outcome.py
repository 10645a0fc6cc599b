"""What one device's replay answers, and the stacks it names (one owner for both)."""

from __future__ import annotations

from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuflame.formats.snapshot_blocks import NO_STACK_FRAME
from gpuflame.formats.torch_frames import StackReader, make_entry
from gpuflame.model.profile import Frame
from gpuflame.model.timeline import MAX_POINTS, downsample
from gpuflame.simulate.gpus import that_fit
from gpuflame.symbols import names
from gpuflame.symbols.qualnames import Resolver

JSON_POINTS = 300  # per line in --json: enough to draw, small enough to read


class Sites:
    """Allocation stacks by number (0: none recorded), from a snapshot's frame lists or a profile's frames."""

    def __init__(self) -> None:
        self._ids: dict[int, int] = {}
        self._raw: list[Any] = [None]
        self._keep: list[Any] = []
        self._named: dict[int, list[Frame]] = {0: [NO_STACK_FRAME]}
        self._reader = StackReader()
        self._resolver = Resolver()

    def of(self, frames: Any) -> int:
        """The number of a snapshot frame list (kept alive, so its identity stays its key)."""
        if not frames or type(frames) is not list:
            return 0
        found = self._ids.get(id(frames))
        if found is None:
            found = self._ids[id(frames)] = len(self._raw)
            self._raw.append(frames)
        return found

    def add_frames(self, frames: list[Frame]) -> int:
        """The number of a stack already named (a profile's, leaf first)."""
        self._raw.append(None)
        self._named[len(self._raw) - 1] = frames or [NO_STACK_FRAME]
        return len(self._raw) - 1

    def frames(self, site: int) -> list[Frame]:
        """The stack of *site*, leaf first, named as every other view names it."""
        found = self._named.get(site)
        if found is None:
            entries = [make_entry(*_key(f), self._python_name) for f in self._raw[site] if type(f) is dict]
            found = self._named[site] = self._reader.read(entries) or [NO_STACK_FRAME]
        return found

    def _python_name(self, file: str, line: int, name: str) -> tuple[str, int]:
        qualname, start = self._resolver.lookup(file, line, name)
        return names.display_name(qualname), start

    def root_first(self, site: int) -> list[str]:
        return [f.name for f in reversed(self.frames(site))]


def _int_or_none(value: Any, scale: int) -> int | None:
    return value * scale if type(value) is int else None


def _key(frame: Mapping[str, Any]) -> tuple[str, int, str]:
    file, line, name = frame.get("filename"), frame.get("line"), frame.get("name")
    return (file if type(file) is str else "", line if type(line) is int else 0, name if type(name) is str else "")


class Series:
    """Reserved and allocated bytes after each event (epoch ns), 24 bytes an event."""

    def __init__(self) -> None:
        self.times, self.reserved, self.allocated = array("q"), array("q"), array("q")

    def add(self, t: int, reserved: int, allocated: int) -> None:
        self.times.append(t)
        self.reserved.append(reserved)
        self.allocated.append(allocated)

    def points(self, which: str, max_points: int = MAX_POINTS) -> list[tuple[int, int]]:
        """One line, downsampled as timelines are (its peak and its end kept exactly)."""
        return downsample(list(zip(self.times, getattr(self, which), strict=True)), max_points)


@dataclass
class Outcome:
    """One device's answer: the --json entry, plus what the terminal and the profile need."""

    device: str
    settings: str
    pid: str = ""  # the process, in a merged run of several
    rank: str = ""  # its rank, where it said one
    allocations: int = 0
    placed: int = 0
    wrapped: bool = False
    entries: int | None = None  # the trace's length (a snapshot's)
    peak_event: int = -1
    first_difference: dict[str, Any] | None = None
    oom: dict[str, Any] | None = None
    recorded: dict[str, int] | None = None
    simulated: dict[str, int] = field(default_factory=dict)
    segment_events_equal: bool | None = None
    compared: bool = False
    capacity: int | None = None
    min_gpu_memory: int | None = None  # the smallest --gpu-memory that fits (64 MiB steps), where searched
    searched: bool = False  # min_gpu_memory was searched (None then: no device up to 1 TiB fits)
    at_reserved_peak: dict[str, int] | None = None  # explain.breakdown at the reserved peak
    why: str | None = None  # the reserved peak's change from the settings compared with, measured
    notes: list[str] = field(default_factory=list)
    over_time: Series = field(default_factory=lambda: Series())

    def differ(self, event: int, why: str, **detail: int) -> None:
        if self.first_difference is None:
            self.first_difference = {"event": event, "why": why, **detail}

    def set_oom(
        self,
        event: int,
        entry: Mapping[str, Any],
        sim: Any,
        sites: Sites,
        phase: str | None = None,
        recorded: bool = False,
    ) -> None:
        site = sites.of(entry.get("frames"))
        self.oom = {
            "event": event,
            "size": int(entry.get("size", 0)),
            "segment_size": sim.segment_for(int(entry.get("size", 0))),
            "stack": sites.root_first(site),
            "allocated": sim.allocated,
            "cached": sim.reserved - sim.allocated,
            "capacity": sim.capacity,
            "phase": phase,  # from gpuflame's phase marks in a snapshot its torch-cuda backend took
            "at_start": False,
            "recorded": recorded,  # at the trace's own oom entry: the recording ran out of memory there too
            "time_ns": _int_or_none(entry.get("time_us"), 1000),
        }

    def set_oom_at_start(self, sim: Any) -> None:
        """The state the trace starts from holds more than the device allows: the run was out of memory before it."""
        self.oom = {
            "event": None,
            "size": None,
            "segment_size": None,
            "stack": [],
            "allocated": sim.allocated,
            "cached": sim.reserved - sim.allocated,
            "capacity": sim.capacity,
            "phase": None,
            "at_start": True,
            "time_ns": None,
        }

    def finish(
        self, sim: Any, recorded_events: list[tuple[str, int, int]] | None, recorded: dict[str, int] | None
    ) -> None:
        """Totals of the replay; with *recorded_events*, the comparison with the recording."""
        segment_events = [e for e in sim.events if e[0].startswith("segment_")]
        made = sum(1 for a, _, _ in segment_events if a in ("segment_alloc", "segment_map"))
        self.capacity = sim.capacity
        self.simulated = {
            "reserved_peak": sim.reserved_peak,
            "allocated_peak": sim.allocated_peak,
            "segments_allocated": made,
            "segments_freed": sum(1 for a, _, _ in segment_events if a in ("segment_free", "segment_unmap")),
            "fragmentation_at_peak": sim.reserved_peak - sim.allocated_at_reserved_peak,
            "reserved_at_allocated_peak": sim.reserved_at_allocated_peak,
            "fragmentation_at_allocated_peak": sim.reserved_at_allocated_peak - sim.allocated_peak,
        }
        self.recorded = recorded
        if recorded_events is None:
            return
        self.compared = True
        simulated = [(a, s) for a, _, s in segment_events]
        self.segment_events_equal = simulated == [(a, s) for a, _, s in recorded_events]
        if not self.segment_events_equal:
            n = next(
                (k for k, (x, y) in enumerate(zip(simulated, recorded_events, strict=False)) if x != y[::2]),
                min(len(simulated), len(recorded_events)),
            )
            self.notes.append(
                f"segment events differ from number {n + 1}: {len(simulated)} simulated, "
                f"{len(recorded_events)} recorded"
            )

    @property
    def placed_same(self) -> float | None:
        if not self.compared or not self.allocations:
            return None
        return self.placed / self.allocations

    def to_json(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "pid": int(self.pid) if self.pid.isdigit() else None,
            "rank": int(self.rank) if self.rank.isdigit() else None,
            "settings": self.settings,
            "recorded": self.recorded,
            "simulated": self.simulated,
            "placed_same": self.placed_same,
            "segment_events_equal": self.segment_events_equal,
            "first_difference": self.first_difference,
            "oom": self.oom,
            "capacity": self.capacity,
            "at_reserved_peak": self.at_reserved_peak,
            "why": self.why,
            "min_gpu_memory": self.min_gpu_memory,
            "gpus_that_fit": that_fit(self.min_gpu_memory),
            "trace_started_mid_run": self.wrapped,
            "notes": self.notes,
            "over_time": {k: self.over_time.points(k, JSON_POINTS) for k in ("reserved", "allocated")},
        }
