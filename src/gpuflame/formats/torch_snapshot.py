"""PyTorch CUDA memory snapshots (``torch.cuda.memory._dump_snapshot``) as profiles.

A snapshot is the caching allocator's state when it was taken: ``segments``
(each ``cudaMalloc``'d range, with ``device`` and ``total_size``) split into
``blocks`` (``size``, ``requested_size``, ``address``, ``state`` and the
``frames`` of the allocation's call stack, leaf first), plus, when
``_record_memory_history`` was on, ``device_traces``: one list per device of
the allocator's recent actions (``alloc``, ``free_requested``,
``free_completed``, ``segment_alloc``, ``segment_free``, ``segment_map``,
``segment_unmap``, ``oom``, ``snapshot``), each with ``addr``, ``size``,
``time_us`` and ``frames``. No torch import is needed.

What the profile holds, per device (label ``device=cuda:N``):

One unit for every view: the bytes each allocation asked for (the block's
``requested_size``; what the trace records), so peak >= in use always.

``inuse_*``
    Every active block (``active_allocated`` or ``active_pending_free``) at its
    requested bytes, under the stack that allocated it; the allocator's
    rounding (block ``size`` minus requested) as one sample under the
    synthetic frame ``<allocator rounding>`` and inactive blocks (cached by
    the allocator, free for reuse) under ``<cached free blocks>`` (objects 0).
    So the in-use total is exactly what the allocator reserved (the sum of the
    segments' ``total_size``), and ignoring the two synthetic frames leaves
    the live tensors.

``alloc_*``
    Every ``alloc`` in the trace, frees ignored, at the size it asked for.

``peak_*``
    The trace replayed, in order, to find the moment the allocations alive on
    the device add up to the most; the samples are what was alive then. An
    allocation is alive from its ``alloc`` until its ``free_completed`` (as
    ``inuse`` counts ``active_pending_free`` blocks); sizes are the requested
    bytes the trace records. Allocations older than the trace are recovered:
    a block alive at the end with no ``alloc`` in the trace was alive all
    along (its stack is known), and a free of an address the trace never
    allocated belongs to an allocation made before the trace began (shown
    under ``<allocated before the trace>``). If several moments tie, the
    first wins; if the allocations alive at the end are more than the replay
    ever reaches (frees requested, never completed), the end is the peak.
    ``<allocator rounding>`` at the peak is the rounding of the allocations
    whose blocks are still known at the end; ``<cached free blocks>`` is the
    memory reserved then (the end's reserved total with the trace's segment
    events undone) minus both; it holds the rounding of allocations freed
    since, and is left out, with a comment, when the trace does not add up.

The profile's timeline (:mod:`gpuflame.model.timeline`) holds, per traced
device, the live allocated bytes (as ``peak_*`` counts them, without the
reserved rest) after each ``alloc`` and free of the trace, starting from
the bytes alive before the trace began, at ``time_us``.

Each traced device's peak unit (:mod:`gpuflame.model.peak`) holds the
allocator's true reserved peak: the most it reserved at any moment of the
trace (the end's segments with the trace's segment events undone, then
replayed), the allocations live then and when; ``peak_*`` holds what was
reserved when the allocations peaked, which can be less.

Comments record what qualifies the numbers: a trace that does not reach back
to the start (ring buffer overwritten, or recording started late), each
out-of-memory event with the bytes asked for and free, and devices without a
trace.

Stacks: ``stacks="all"`` frame lists (C++, CPython and Python frames mixed)
are read by :mod:`gpuflame.formats.torch_frames`; ``native`` keeps the C++
frames. Python frames are named with their class from the source
(:class:`~gpuflame.symbols.qualnames.Resolver`), each source file parsed once and
its index kept in the user's cache folder for the next run
(:mod:`gpuflame.symbols.index_cache`); a comment counts those whose source
was not found.

This module reads the file and runs the conversion's stages in order; the parts
live beside it: :mod:`~gpuflame.formats.snapshot_book` (the profile being built,
which each stage takes), :mod:`~gpuflame.formats.snapshot_segments` (``inuse_*``),
:mod:`~gpuflame.formats.snapshot_trace` (``alloc_*``, ``peak_*``, timeline,
history), :mod:`~gpuflame.formats.snapshot_stacks`,
:mod:`~gpuflame.formats.snapshot_blocks` and
:mod:`~gpuflame.formats.snapshot_walk` (the pass over a trace).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuflame.defaults import source_index_dir
from gpuflame.errors import GpuflameError, ProfileFormatError
from gpuflame.formats import safe_pickle
from gpuflame.formats.gzip_io import GZIP_MAGIC, gunzip
from gpuflame.formats.snapshot_blocks import BEFORE_TRACE_FRAME, INT64_MAX, NO_STACK_FRAME, STACKLESS_WHY
from gpuflame.formats.snapshot_blocks import allocated_bytes as allocated_bytes  # callers import it from here
from gpuflame.formats.snapshot_blocks import requested_bytes as requested_bytes
from gpuflame.formats.snapshot_book import SnapshotBook
from gpuflame.formats.snapshot_segments import book_in_use
from gpuflame.formats.snapshot_trace import DeviceTrace
from gpuflame.gcpause import gc_paused
from gpuflame.model.functions import def_lines_note
from gpuflame.model.peak import PeakUnit
from gpuflame.model.phases import ordered
from gpuflame.model.profile import PYTHON, SYNTHETIC, Profile, Sample
from gpuflame.symbols import names
from gpuflame.symbols.qualnames import Resolver
from gpuflame.units import format_bytes

# One unit for every view, said in every converted profile (and so in the report's header).
UNITS_NOTE = (
    "units: bytes as each allocation asked for them, in every view; "
    f"{names.ALLOCATOR_ROUNDING} and {names.CACHED_FREE} make up the rest of what the allocator reserved"
)


def decode(data: bytes, *, native: bool = False, resolver: Resolver | None = None) -> Profile:
    """Read a snapshot pickle (gzip-compressed or not) without running any code.

    *native* keeps the C++ frames of ``stacks="all"`` snapshots (see
    :mod:`gpuflame.formats.torch_frames`); *resolver* names Python frames.
    """
    # one pause for the read and the conversion, the snapshot dropped inside it: re-enabled between
    # them, the collector walked every object of the snapshot just built (a tenth of a warm decode)
    with gc_paused():
        snapshot = read_snapshot(data)
        profile = from_snapshot(snapshot, native=native, resolver=resolver)
        del snapshot
    return profile


def read_snapshot(data: bytes) -> dict[str, Any]:
    """The snapshot dict of a pickle (gzip or not), by the restricted unpickler within the readers' limits."""
    if data[:2] == GZIP_MAGIC:
        data = gunzip(data)
    snapshot = safe_pickle.loads(data)
    if isinstance(snapshot, list) and all(isinstance(s, dict) for s in snapshot):
        snapshot = {"segments": snapshot}  # a bare segment list, as _memory_viz also accepts
    if not isinstance(snapshot, dict) or not isinstance(snapshot.get("segments"), list):
        raise ProfileFormatError(
            f"not a profile: a pickle of a {type(snapshot).__name__}, not a PyTorch memory snapshot "
            "(a dict with 'segments', as torch.cuda.memory._dump_snapshot writes)"
        )
    return snapshot


def from_snapshot(
    snapshot: Mapping[str, Any],
    *,
    max_entries: int | None = None,
    device_type: str = "cuda",
    resolver: Resolver | None = None,
    native: bool = False,
) -> Profile:
    """Build a profile from a snapshot dict (see the module docstring).

    *max_entries* is the ``_record_memory_history`` ring-buffer size when the
    caller knows it (the snapshot does not record it); a trace that long has
    overflowed. A snapshot may also carry it under the key ``max_entries``.
    *native* keeps the C++ frames (``--native``).
    """
    try:
        with gc_paused():
            resolver = resolver or Resolver(store=source_index_dir())
            conv = _Converter(snapshot, max_entries, device_type, resolver, native)
            return conv.run()
    except GpuflameError:
        raise
    except RecursionError:
        raise ProfileFormatError("not a valid PyTorch memory snapshot (values nested too deeply)") from None
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError) as exc:
        raise ProfileFormatError(f"not a valid PyTorch memory snapshot ({type(exc).__name__}: {_short(exc)})") from None


def _short(exc: BaseException) -> str:
    return safe_pickle.one_line(str(exc), 100)


# -- conversion ----------------------------------------------------------------


class _Converter(SnapshotBook):
    """One snapshot -> one profile: the stages in order, then the notes that need them all."""

    def run(self) -> Profile:
        self.comment(UNITS_NOTE)
        book_in_use(self)
        times: list[tuple[int, int]] = []
        for device, trace in enumerate(self.traces):
            if isinstance(trace, list) and trace:
                window = DeviceTrace(self, device, trace).replay()
                if window:
                    times.append(window)
        self._devices_without_trace()
        self._note_unknown_def_lines()
        if times:
            self._hold_to_the_end(max(t for _, t in times) * 1000)
        if times:
            first = min(t for t, _ in times)
            last = max(t for _, t in times)
            self.profile.time_nanos = first * 1000
            self.profile.duration_nanos = max(0, last - first) * 1000
        self.profile.samples = [Sample(stack, tuple(row), labels) for (stack, labels), row in self.rows.items()]
        self._reserved_peaks()
        self.profile.phases = ordered(self.profile.phases)
        self._comment_stacks()
        self._comment_unqualified()
        self._comment_stackless()
        if any(v < 0 or v > INT64_MAX for row in self.rows.values() for v in row):
            raise ProfileFormatError("sizes in the snapshot are out of range (a damaged file?)")
        return self.profile

    def _reserved_peaks(self) -> None:
        """Each traced device's peak unit with the allocator's true reserved peak (not the reserved bytes at
        the allocations' peak, which peak_space shows): what ``report`` says and its fragmentation hint uses."""
        start = self.profile.time_nanos
        end = start + self.profile.duration_nanos if start and self.profile.duration_nanos else 0
        self.profile.peaks = [
            PeakUnit(self.device_name(d), start=start, end=end, reserved=r, reserved_allocated=a, reserved_at=t)
            for d, (r, a, t) in sorted(self.reserved_peaks.items())
            if r > 0
        ]

    def _note_unknown_def_lines(self) -> None:
        """Say which files' functions show no ``def`` line: a snapshot records only call lines."""
        files = self.stacks.unknown_def_lines
        if files:  # the snapshot records only the lines running; the source is not here or changed
            self.comment(def_lines_note(files))

    def _comment_stacks(self) -> None:
        """Say what the stacks could not show: C++ frames without a known place."""
        unplaced = self.stacks.reader.unplaced
        if unplaced:
            self.comment(
                f"{unplaced:,} stacks had C++ frames between two Python frames whose place is not known "
                "(CPython 3.11+ runs several Python frames in one C frame); they are left out"
            )

    def _hold_to_the_end(self, end_ns: int) -> None:
        """Carry each device's series to the snapshot's last event: the devices share one clock, and a
        device whose trace ends first still holds its memory (a strip that dropped it to 0 undercounted
        a multi-GPU peak by a whole device)."""
        timeline = self.profile.timeline
        if timeline is None:
            return
        for labels, points in timeline.series.items():
            if points and points[-1][0] < end_ns:
                timeline.series[labels] = [*points, (end_ns, points[-1][1])]

    def _comment_stackless(self) -> None:
        """Say what ``<allocated before the trace>`` and ``<no stack recorded>`` hold and why they have no stack."""
        index = self.profile.pick_type()
        held = {BEFORE_TRACE_FRAME.name: 0, NO_STACK_FRAME.name: 0}
        for stack, labels in self.rows:
            name = self.profile.frames[stack[0]].name if stack else ""
            if name in held and self.profile.frames[stack[0]].kind == SYNTHETIC:
                held[name] += self.rows[(stack, labels)][index]
        total = sum(row[index] for row in self.rows.values())
        kind = self.profile.sample_types[index].type
        for name, size in held.items():
            if size:
                share = f"{format_bytes(size)} of {kind} ({100 * size / total:.0f}%)" if total else format_bytes(size)
                self.comment(f"{name}: {share} {STACKLESS_WHY[name]}")

    def _comment_unqualified(self) -> None:
        """Say how many Python frames lack their class because their source is not here."""
        missing = {(f, line) for f, line, _ in self.stacks.resolver.unqualified}
        if not missing:
            return
        python = [f for f in self.profile.frames if f.kind == PYTHON and f.name != names.MODULE]
        lost = [f for f in python if (f.file, f.line) in missing]
        other = self.stacks.resolver.other_version
        away = [f for f in lost if f.file not in other]
        moved = [f for f in lost if f.file in other]
        if away:
            self.comment(
                f"{len(away):,} of {len(python):,} Python frames could not be qualified: their source is not "
                f"on this machine (e.g. {away[0].file}), so a method among them shows without its class; "
                "--source-root OLD=NEW maps the recording machine's paths to a copy here"
            )
        if moved:
            self.comment(
                f"{len(moved):,} of {len(python):,} Python frames could not be qualified: another version of "
                f"their file is here (e.g. {moved[0].file}) whose lines differ from the recording's, and more "
                "than one class defines their function; --source-root OLD=NEW maps them to a copy of the "
                "recording's version"
            )

    def _devices_without_trace(self) -> None:
        """A device with blocks but no trace: its peak is the state at the snapshot."""
        if not self.has_trace:
            return
        traced = {d for d, t in enumerate(self.traces) if isinstance(t, list) and t}
        inuse, peak = self.col["inuse_space"], self.col["peak_space"]
        for device in sorted(set(self.reserved) - traced):
            label = self.label(device)
            for (_, labels), row in self.rows.items():
                if labels == label:
                    row[peak] += row[inuse]
                    row[peak + 1] += row[inuse + 1]
            self.comment(
                f"{self.device_name(device)}: no allocation trace was recorded for this device; "
                "its peak_* values are the memory in use when the snapshot was taken"
            )
