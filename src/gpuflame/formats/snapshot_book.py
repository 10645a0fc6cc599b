"""The profile a snapshot's conversion builds, and the state its stages share.

A :class:`SnapshotBook` holds the snapshot's parts (segments, traces), the
profile being filled, its rows and what the stages learn on the way (the bytes
reserved and the blocks active per device, the reserved peaks); its methods book
one row, a comment, a block's category and phase. The stages take it and fill
it: :mod:`~gpuflame.formats.snapshot_segments` (``inuse_*`` from the segments),
:mod:`~gpuflame.formats.snapshot_trace` (a device's trace), and
:mod:`~gpuflame.formats.torch_snapshot` runs them in order and adds the notes
that need them all.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuflame.errors import ProfileFormatError
from gpuflame.formats.snapshot_phases import read_marks
from gpuflame.formats.snapshot_stacks import Stacks
from gpuflame.model.categories import (
    BLOCK_CATEGORY_KEY,
    CATEGORIES_KEY,
    LABEL,
    SYNTHETIC_CATEGORIES,
    stack_category,
)
from gpuflame.model.phases import LABEL as PHASE_LABEL
from gpuflame.model.phases import NONE as NO_PHASE
from gpuflame.model.profile import Labels, Profile
from gpuflame.model.sample_types import memory_sample_types
from gpuflame.symbols.qualnames import Resolver


class SnapshotBook:
    """One snapshot's conversion in progress: what it reads, the profile it fills, and how a row is booked."""

    def __init__(
        self,
        snapshot: Mapping[str, Any],
        max_entries: int | None,
        device_type: str,
        resolver: Resolver,
        native: bool = False,
    ):
        if not isinstance(snapshot, Mapping):
            raise ProfileFormatError("a memory snapshot must be a dict")
        self.snapshot = snapshot
        segments = snapshot.get("segments")
        if not isinstance(segments, list):
            raise ProfileFormatError("the snapshot has no 'segments' list")
        self.segments: list[Any] = segments
        traces = snapshot.get("device_traces") or []
        if not isinstance(traces, list):
            raise ProfileFormatError("the snapshot's 'device_traces' is not a list")
        self.traces: list[Any] = traces
        limit = max_entries if max_entries is not None else snapshot.get("max_entries")
        self.max_entries = limit if isinstance(limit, int) and limit > 0 else None
        self.device_type = device_type
        self.has_trace = any(isinstance(t, list) and t for t in traces)
        types = memory_sample_types(peak=self.has_trace, inuse=True, alloc=self.has_trace)
        self.profile = Profile(sample_types=types, default_type="peak_space" if self.has_trace else "inuse_space")
        names_ = [t.type for t in types]
        self.col = {name: i for i, name in enumerate(names_)}
        self.width = len(types)
        self.rows: dict[tuple[tuple[int, ...], Labels], list[int]] = {}
        self.stacks = Stacks(self.profile, resolver, native)
        self.labels: dict[int, Labels] = {}
        self.reserved: dict[int, int] = {}
        self.active: dict[int, dict[int, Any]] = {}  # device -> address -> active block
        # a live gpuflame recorder marks its snapshots and each block the object graph classed
        # (capture/books/categories.py); a saved snapshot has no categories, and gets none
        self.categorize = bool(snapshot.get(CATEGORIES_KEY))
        self.categories: dict[tuple[int, ...], str] = {}  # stack -> the category its frames imply
        # a live recorder's phase marks (formats/snapshot_phases.py): None when there are none
        self.marks = read_marks(snapshot)
        self.alloc_times: dict[int, dict[Any, Any]] = {}  # device -> addr -> time_us of its last alloc in the trace
        # device -> (the most the allocator reserved at any moment of the trace, the live bytes then, epoch ns)
        self.reserved_peaks: dict[int, tuple[int, int, int]] = {}

    def label(self, device: int) -> Labels:
        found = self.labels.get(device)
        if found is None:
            found = self.labels[device] = (("device", f"{self.device_type}:{device}"),)
        return found

    def add(
        self,
        stack: tuple[int, ...],
        device: int,
        space: str,
        size: int,
        count: int,
        source: Any = None,
        phase: str | None = None,
    ) -> None:
        """Book *size* bytes (*count* objects) of *space*; *source*: the block or trace entry, for its category."""
        labels = self.label(device)
        if self.categorize:
            labels = ((LABEL, self.category(stack, source)), *labels)
        if self.marks is not None:
            labels = (*labels, (PHASE_LABEL, phase or NO_PHASE))
        key = (stack, labels)
        row = self.rows.get(key)
        if row is None:
            row = self.rows[key] = [0] * self.width
        i = self.col[space]
        row[i] += size
        row[i + 1] += count

    def history_labels(self, stack: tuple[int, ...], device: int, source: Any) -> Labels:
        """An event history site's labels: its device and, as :meth:`add` gives a sample, its category."""
        labels = self.label(device)
        return ((LABEL, self.category(stack, source)), *labels) if self.categorize else labels

    def comment(self, text: str) -> None:
        self.profile.comments.append(text)

    def category(self, stack: tuple[int, ...], source: Any) -> str:
        """The graph's category of a block (marked by the live recorder), else its stack's."""
        marked = source.get(BLOCK_CATEGORY_KEY) if isinstance(source, Mapping) else None
        if type(marked) is str:
            return marked
        found = self.categories.get(stack)
        if found is None:
            frames = [self.profile.frames[i] for i in stack]
            found = SYNTHETIC_CATEGORIES.get(frames[0].name) if frames else None
            found = self.categories[stack] = found or stack_category(frames)
        return found

    def device_name(self, device: int) -> str:
        return f"{self.device_type}:{device}"

    def phase_of_block(self, device: int, addr: Any) -> str | None:
        """The phase an active block was allocated in: the time of its address's last alloc in the trace."""
        if self.marks is None:
            return None
        times = self.alloc_times.get(device)
        if times is None:
            trace = self.traces[device] if device < len(self.traces) and isinstance(self.traces[device], list) else []
            times = self.alloc_times[device] = {
                e.get("addr"): e.get("time_us") for e in trace if isinstance(e, Mapping) and e.get("action") == "alloc"
            }
        return self.marks.at(times.get(addr))
