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

Comments record what qualifies the numbers: a trace that does not reach back
to the start (ring buffer overwritten, or recording started late), each
out-of-memory event with the bytes asked for and free, and devices without a
trace.

Stacks: ``stacks="all"`` frame lists (C++, CPython and Python frames mixed)
are read by :mod:`gpuflame.formats.torch_frames`; ``native`` keeps the C++
frames. Python frames are named with their class from the source
(:class:`~gpuflame.symbols.qualnames.Resolver`); a comment counts those
whose source was not found.
"""

from __future__ import annotations

import operator
from array import array
from collections.abc import Mapping
from datetime import datetime, timezone
from itertools import islice
from typing import Any

from gpuflame import limits
from gpuflame.errors import GpuflameError, ProfileFormatError
from gpuflame.formats import safe_pickle
from gpuflame.formats.load_save import GZIP_MAGIC, gunzip
from gpuflame.formats.snapshot_phases import Marks, read_marks
from gpuflame.formats.snapshot_phases import phase_table as replay_phases
from gpuflame.formats.torch_frames import Entry, StackReader, make_entry
from gpuflame.gcpause import gc_paused
from gpuflame.model import history as event_history
from gpuflame.model.categories import (
    BLOCK_CATEGORY_KEY,
    CATEGORIES_KEY,
    LABEL,
    SYNTHETIC_CATEGORIES,
    stack_category,
)
from gpuflame.model.functions import def_lines_note
from gpuflame.model.history import History, Track
from gpuflame.model.phases import LABEL as PHASE_LABEL
from gpuflame.model.phases import NONE as NO_PHASE
from gpuflame.model.phases import ordered
from gpuflame.model.profile import PYTHON, SYNTHETIC, Frame, Labels, Profile, Sample
from gpuflame.model.sample_types import memory_sample_types
from gpuflame.model.timeline import Timeline
from gpuflame.symbols import names
from gpuflame.symbols.qualnames import Resolver
from gpuflame.units import format_bytes

CACHED_FREE_FRAME = Frame(names.CACHED_FREE, kind=SYNTHETIC)
ROUNDING_FRAME = Frame(names.ALLOCATOR_ROUNDING, kind=SYNTHETIC)
BEFORE_TRACE_FRAME = Frame("<allocated before the trace>", kind=SYNTHETIC)
_BEFORE = object()  # the event history's stand-in for the frames of an allocation older than the trace
NO_STACK_FRAME = Frame("<no stack recorded>", kind=SYNTHETIC)

# why a block has no Python stack: the note said under the synthetic frame that holds it
STACKLESS_WHY = {
    BEFORE_TRACE_FRAME.name: (
        "was allocated before the trace began, so its stack is not known: the trace's ring buffer had wrapped "
        "(raise max_entries in torch.cuda.memory._record_memory_history) or recording started after these "
        "blocks were made (start it before the model is loaded)"
    ),
    NO_STACK_FRAME.name: (
        "has no stack in the snapshot: its blocks were allocated while torch recorded no stacks (before "
        "torch.cuda.memory._record_memory_history was called, the usual case for weights loaded first, or with "
        "stacks off), or by C++ code with no Python caller (cuBLAS workspaces, NCCL buffers); start recording "
        "before the model is loaded to see them"
    ),
}

INT64_MAX = (1 << 63) - 1  # what pprof can store


# One unit for every view, said in every converted profile (and so in the report's header).
UNITS_NOTE = (
    "units: bytes as each allocation asked for them, in every view; "
    f"{names.ALLOCATOR_ROUNDING} and {names.CACHED_FREE} make up the rest of what the allocator reserved"
)

# "active_awaiting_free" is how torch's docstring spells the state the C++ code writes
# as "active_pending_free"; accept both.
ACTIVE_STATES = frozenset(("active_allocated", "active_pending_free", "active_awaiting_free"))

def decode(data: bytes, *, native: bool = False, resolver: Resolver | None = None) -> Profile:
    """Read a snapshot pickle (gzip-compressed or not) without running any code.

    *native* keeps the C++ frames of ``stacks="all"`` snapshots (see
    :mod:`gpuflame.formats.torch_frames`); *resolver* names Python frames.
    """
    return from_snapshot(read_snapshot(data), native=native, resolver=resolver)


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
            conv = _Converter(snapshot, max_entries, device_type, resolver or Resolver(), native)
            return conv.run()
    except GpuflameError:
        raise
    except RecursionError:
        raise ProfileFormatError("not a valid PyTorch memory snapshot (values nested too deeply)") from None
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError) as exc:
        raise ProfileFormatError(
            f"not a valid PyTorch memory snapshot ({type(exc).__name__}: {_short(exc)})"
        ) from None


def _short(exc: BaseException) -> str:
    return safe_pickle.one_line(str(exc), 100)


# -- stacks --------------------------------------------------------------------


# Lists kept per cheap key. Unbounded, lists that share their leaf, middle and root
# frames but differ elsewhere (a crafted file) made reading quadratic: 8,000 blocks took 40 s.
# Past it, such a list is read anew, which costs its length and nothing more.
_SHAPE_BUCKET = 8
# Out-of-memory events described one comment each; the rest are counted (a file can hold millions).
_OOM_COMMENTS = 20


class _Stacks:
    """Frame lists -> profile stacks (tuples of frame ids, leaf first), memoized.

    A snapshot repeats the same stacks across blocks and trace entries, and
    PyTorch shares one dict per distinct frame (and one list per captured
    stack, shared by a block and its trace entry), which survives pickling.
    So a list is looked up by its identity first (the snapshot keeps every
    object alive while we run), then by a cheap key (the identities of its
    leaf, middle and root frames) with a full comparison, which is an
    identity check per frame when frames are shared; only new stacks are
    read (:mod:`gpuflame.formats.torch_frames` puts C++, CPython and Python
    frames in their places).
    """

    def __init__(self, profile: Profile, resolver: Resolver, native: bool = False) -> None:
        self.profile = profile
        self.resolver = resolver
        self.reader = StackReader(native)
        self.by_list: dict[int, tuple[int, ...]] = {}
        self._by_shape: dict[int, list[tuple[list[Any], tuple[int, ...]]]] = {}
        self._entry_by_id: dict[int, Entry] = {}
        self._entry_by_key: dict[tuple[str, int, str], Entry] = {}
        self.unknown_def_lines: set[str] = set()  # files whose functions' def lines were not found
        self.no_stack = (profile.frame_id(NO_STACK_FRAME),)
        self.max_depth = limits.STACK_DEPTH.value()

    def stack(self, frames: Any) -> tuple[int, ...]:
        """The stack of a ``frames`` list taken from the snapshot."""
        found = self.by_list.get(id(frames))
        if found is None:
            found = self.by_list[id(frames)] = self.stack_of(frames)
        return found

    def stack_of(self, frames: Any) -> tuple[int, ...]:
        """The stack of a frames list, without the identity memo (see :meth:`stack`)."""
        if not frames:
            return self.no_stack
        if type(frames) is not list:
            raise ProfileFormatError("a 'frames' entry is not a list")
        if len(frames) > self.max_depth:
            raise limits.STACK_DEPTH.exceeded("a stack in the snapshot")
        key = id(frames[0]) ^ (id(frames[-1]) << 1) ^ (id(frames[len(frames) >> 1]) << 2)
        bucket = self._by_shape.get(key)
        if bucket is None:
            bucket = self._by_shape[key] = []
        for seen, found in bucket:
            if seen is frames or seen == frames:  # an identity check per frame when they are shared
                return found
        known = self._entry_by_id.get
        entries = [known(id(f)) for f in frames]
        if None in entries:
            entries = [self._entry(f) for f in frames]
        frame_id = self.profile.frame_id
        found = tuple(frame_id(f) for f in self.reader.read(entries)) or self.no_stack  # type: ignore[arg-type]
        if len(bucket) < _SHAPE_BUCKET:
            bucket.append((frames, found))
        return found

    def _entry(self, frame: Any) -> Entry:
        entry = self._entry_by_id.get(id(frame))
        if entry is None:
            if type(frame) is not dict:
                raise ProfileFormatError("a stack frame is not a dict")
            # only str and int go into keys: hashing untrusted nested values is unsafe
            file = frame.get("filename")
            line = frame.get("line")
            name = frame.get("name")
            key = (
                file if type(file) is str else "",
                line if type(line) is int and 0 <= line <= INT64_MAX else 0,  # what pprof can store
                name if type(name) is str else "",
            )
            entry = self._entry_by_key.get(key)
            if entry is None:
                entry = self._entry_by_key[key] = make_entry(*key, self._python_name)
            self._entry_by_id[id(frame)] = entry
        return entry

    def _python_name(self, file: str, line: int, name: str) -> tuple[str, int]:
        """A Python frame's label and def line; files whose def lines are unknown are noted."""
        qualname, start = self.resolver.lookup(file, line, name)
        if not start:
            self.unknown_def_lines.add(file)
        return names.display_name(qualname), start


# -- conversion ----------------------------------------------------------------


class _Converter:
    """One snapshot -> one profile."""

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
        self.profile = Profile(
            sample_types=types, default_type="peak_space" if self.has_trace else "inuse_space"
        )
        names_ = [t.type for t in types]
        self.col = {name: i for i, name in enumerate(names_)}
        self.width = len(types)
        self.rows: dict[tuple[tuple[int, ...], Labels], list[int]] = {}
        self.stacks = _Stacks(self.profile, resolver, native)
        self.labels: dict[int, Labels] = {}
        self.reserved: dict[int, int] = {}
        self.active: dict[int, dict[int, Any]] = {}  # device -> address -> active block
        # a live gpuflame recorder marks its snapshots and each block the object graph classed
        # (capture/categories.py); a saved snapshot has no categories, and gets none
        self.categorize = bool(snapshot.get(CATEGORIES_KEY))
        self.categories: dict[tuple[int, ...], str] = {}  # stack -> the category its frames imply
        # a live recorder's phase marks (formats/snapshot_phases.py): None when there are none
        self.marks = read_marks(snapshot)
        self.alloc_times: dict[int, dict[Any, Any]] = {}  # device -> addr -> time_us of its last alloc in the trace

    def run(self) -> Profile:
        self.comment(UNITS_NOTE)
        self._segments()
        times: list[tuple[int, int]] = []
        for device, trace in enumerate(self.traces):
            if isinstance(trace, list) and trace:
                window = _DeviceTrace(self, device, trace).replay()
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
        self.profile.samples = [
            Sample(stack, tuple(row), labels) for (stack, labels), row in self.rows.items()
        ]
        self.profile.phases = ordered(self.profile.phases)
        self._comment_stacks()
        self._comment_unqualified()
        self._comment_stackless()
        if any(v < 0 or v > INT64_MAX for row in self.rows.values() for v in row):
            raise ProfileFormatError("sizes in the snapshot are out of range (a damaged file?)")
        return self.profile

    def _note_unknown_def_lines(self) -> None:
        """Say which files' functions show no ``def`` line: a snapshot records only call lines."""
        files = sorted(self.stacks.unknown_def_lines)
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

    # -- helpers used by the device replays --------------------------------

    def label(self, device: int) -> Labels:
        found = self.labels.get(device)
        if found is None:
            found = self.labels[device] = (("device", f"{self.device_type}:{device}"),)
        return found

    def add(
        self, stack: tuple[int, ...], device: int, space: str, size: int, count: int, source: Any = None,
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

    # -- in use -------------------------------------------------------------

    def _segments(self) -> None:
        """In use: active blocks at their requested bytes, the allocator's rounding, cached free blocks."""
        cached: dict[int, int] = {}
        rounding: dict[int, int] = {}
        stack_of = self.stacks.stack_of
        by_list = self.stacks.by_list
        # device -> (stack, category, phase) -> [bytes, count]
        inuse_by_device: dict[int, dict[tuple[tuple[int, ...], Any, str | None], list[int]]] = {}
        for seg in self.segments:
            device = _int(seg.get("device", 0), "segment device")
            total = _int(seg["total_size"], "segment total_size")
            self.reserved[device] = self.reserved.get(device, 0) + total
            active = self.active.setdefault(device, {})
            inuse = inuse_by_device.setdefault(device, {})
            address = seg.get("address", 0)
            covered = 0
            for block in seg["blocks"]:
                size = block["size"]
                state = block["state"]
                if type(size) is not int or type(state) is not str or size < 0:
                    raise ProfileFormatError("a block's size or state is not a size/string")
                if state in ACTIVE_STATES:
                    addr = block.get("address")
                    if addr is None:  # older snapshots: blocks follow each other in the segment
                        addr = covered + address
                    if type(addr) is not int:
                        raise ProfileFormatError("a block's address is not an integer")
                    active[addr] = block
                    frames = block.get("frames")
                    st = by_list.get(id(frames))
                    if st is None:
                        frames = _block_frames(block)
                        st = by_list[id(frames)] = stack_of(frames)
                    asked = requested_bytes(block)
                    rounding[device] = rounding.get(device, 0) + size - asked
                    key = (st, block.get(BLOCK_CATEGORY_KEY) if self.categorize else None,
                           self.phase_of_block(device, addr))
                    row = inuse.get(key)
                    if row is None:
                        inuse[key] = [asked, 1]
                    else:
                        row[0] += asked
                        row[1] += 1
                else:
                    cached[device] = cached.get(device, 0) + size
                covered += size
            if total > covered:  # a segment whose blocks do not cover it: reserved, unused
                cached[device] = cached.get(device, 0) + total - covered
        for device, inuse in inuse_by_device.items():
            for (st, marked, phase), (size, count) in inuse.items():
                self.add(st, device, "inuse_space", size, count, {BLOCK_CATEGORY_KEY: marked}, phase)
        for frame, sizes in ((ROUNDING_FRAME, rounding), (CACHED_FREE_FRAME, cached)):
            for device, size in sorted(sizes.items()):
                if size:
                    self.add((self.profile.frame_id(frame),), device, "inuse_space", size, 0)

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


def _block_frames(block: Mapping[str, Any]) -> Any:
    frames = block.get("frames")
    if frames is None and "history" in block:  # snapshots before torch 2.1
        history = block["history"]
        if isinstance(history, list) and history and isinstance(history[0], dict):
            return history[0].get("frames")
    return frames


def allocated_bytes(profile: Profile, type_name: str) -> int:
    """A view's live allocations: its total without the allocator's rounding and cached blocks."""
    i = profile.type_index(type_name)
    reserve = (names.ALLOCATOR_ROUNDING, names.CACHED_FREE)
    frames = profile.frames
    return sum(s.values[i] for s in profile.samples if frames[s.stack[0]].name not in reserve)


def requested_bytes(block: Mapping[str, Any]) -> int:
    """What an active block's allocation asked for: the unit of every view.

    The trace records requested bytes, so peak, in use and allocated all
    count them; the block's ``size`` adds the allocator's rounding. Snapshots
    older than ``requested_size`` (torch < 2.0) give the block size.
    """
    size = block["size"]
    asked = block.get("requested_size")
    if type(asked) is int and 0 <= asked <= size:
        return asked
    return size


def _int(value: Any, what: str) -> int:
    """A size, count or index from the snapshot: a non-negative integer pprof can hold."""
    if type(value) is int and 0 <= value <= INT64_MAX:
        return value
    raise ProfileFormatError(f"{what} is not a non-negative integer ({type(value).__name__})")


# -- the trace replay ----------------------------------------------------------


class _DeviceTrace:
    """One device's trace: alloc samples, the peak, and what qualifies them."""

    def __init__(self, conv: _Converter, device: int, trace: list[Any]) -> None:
        self.conv = conv
        self.device = device
        self.trace = _in_time_order(trace)
        self.name = conv.device_name(device)

    def replay(self) -> tuple[int, int] | None:
        """Walk the trace once; add alloc and peak samples; return its time window."""
        conv = self.conv
        walk = _Walk(self.trace, conv.marks)
        walk.run()
        always = self._alive_throughout(walk.live, walk.release_on_request)
        before_bytes = walk.before_bytes + sum(size for _, size, _ in always)
        still_live = [v for v in walk.live.values() if v[0] <= walk.best_i] + always  # their blocks are known
        peak_set = walk.closed_at_peak + still_live
        best, seg, seg_at_best = walk.best, walk.seg, walk.seg_at_best
        # reserved at a moment = reserved at the end minus segments added since
        reserved_end = conv.reserved.get(self.device, 0)
        reserved_start = reserved_end - seg
        self._add_allocs(walk.allocs, walk.others)
        self._add_timeline(walk.points, before_bytes)
        self._add_history(walk.events, walk.base + [(_block_frames(block), size) for _, size, block in always])
        if walk.marks is not None and self._window() is not None:
            conv.profile.phases += replay_phases(self.trace, walk.marks, self.name, before_bytes,
                                                 walk.release_on_request, self._leaf_name, BEFORE_TRACE_FRAME.name)
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
        self._add_peak(peak_set, before_bytes + best, reserved_at_peak, reserved_start >= before_bytes,
                       self._rounding(still_live))
        self._comment_reserved_after_peak(reserved_at_peak, reserved_end)
        window = self._window()
        self._comment_window(window, walk.freed_unknown)
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
                out.append((-1, _int(size, "block requested_size"), block))
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
        if any(type(t) is not int or not first <= t <= last for t, _ in marks):
            return
        # the series spans the trace's whole window, segment and oom events included
        points = [(first * 1000, baseline)]
        points += [(t * 1000, baseline + d) for t, d in marks]
        if marks[-1][0] < last:
            points.append((last * 1000, points[-1][1]))
        timeline = self.conv.profile.timeline
        if timeline is None:
            timeline = self.conv.profile.timeline = Timeline()
        timeline.add_series(self.conv.label(self.device), points)

    def _add_history(self, events: list[tuple[Any, Any, int]], base: list[tuple[Any, int]]) -> None:
        """The trace as the event history (model/history.py): its ring buffer is the bound.

        What was alive before the trace began is the base state at its first
        event; earlier moments are not available. Left out, as the timeline,
        when the trace has no plausible times.
        """
        window = self._window()
        if not events or window is None or any(type(t) is not int or not window[0] <= t <= window[1]
                                                for t, _, _ in events):
            return
        conv = self.conv
        labels = conv.label(self.device)
        before = (conv.profile.frame_id(BEFORE_TRACE_FRAME),)
        site_of: dict[tuple[int, ...], int] = {}

        def site(frames: Any) -> int:
            stack = before if frames is _BEFORE else conv.stacks.stack(frames)
            return site_of.setdefault(stack, len(site_of))

        rows: dict[int, tuple[int, int]] = {}
        for frames, size in base:
            b, c = rows.get(site(frames), (0, 0))
            rows[site(frames)] = (b + size, c + 1)
        times = array("q", (t * 1000 for t, _, _ in events))
        sites = array("q", (site(frames) for _, frames, _ in events))
        track = Track((), 0, 0, window[0] * 1000, max(1, len(base)), rows, times, sites,
                      array("q", (size for _, _, size in events)))
        one = History(conv.profile.frames, [(stack, labels) for stack in site_of], [track])
        conv.profile.history = event_history.merged([conv.profile.history, one])

    def _add_allocs(self, allocs: dict[Any, list[Any]], others: list[tuple[Any, int, Any]]) -> None:
        stack_of = self.conv.stacks.stack
        for key, (frames, size, count) in allocs.items():
            self.conv.add(stack_of(frames), self.device, "alloc_space", size, count, phase=_phase_of_key(key))
        for frames, size, key in others:
            self.conv.add(stack_of(frames), self.device, "alloc_space", size, 1, phase=_phase_of_key(key))

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
        self, peak_set: list[tuple[int, int, Any]], allocated: int, reserved: int, sound: bool, rounding: int
    ) -> None:
        """Samples for what was alive at the peak, and the reserved rest.

        *reserved* is what the allocator held at the peak; *sound* says the
        trace's segment events add up (the memory reserved at the start holds
        the allocations alive at the start); *rounding* is the allocator's
        rounding of the allocations whose blocks are known (still alive at
        the end), shown under ``<allocator rounding>``.
        """
        conv = self.conv
        stack_of = conv.stacks.stack
        before: tuple[int, ...] = (conv.profile.frame_id(BEFORE_TRACE_FRAME),)
        by_stack: dict[tuple[tuple[int, ...], Any, str | None], list[int]] = {}  # (stack, category, phase)
        for _, size, source in peak_set:
            if source is None:
                st = before
            elif "action" in source:  # a trace entry
                st = stack_of(source.get("frames"))
            else:  # a block
                st = stack_of(_block_frames(source))
            key = (st, self._marked(source) if conv.categorize else None, self._phase_of(source))
            row = by_stack.get(key)
            if row is None:
                by_stack[key] = [size, 1]
            else:
                row[0] += size
                row[1] += 1
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

    def _comment_window(self, window: tuple[int, int] | None, freed_unknown: int) -> None:
        n = len(self.trace)
        full = self.conv.max_entries is not None and n >= self.conv.max_entries
        if not freed_unknown and not full:
            return
        span = f" from {_when(window[0])} to {_when(window[1])}" if window else ""
        why = []
        if full:
            limit = self.conv.max_entries
            why.append(f"it is full ({n:,} of max_entries {limit:,}), so older events were overwritten")
        if freed_unknown:
            why.append(
                f"{freed_unknown:,} frees in it are of allocations made before it began, "
                f"so at least {freed_unknown:,} earlier events are lost"
            )
        self.conv.comment(
            f"{self.name}: the allocator trace does not reach back to the start of the run: it holds "
            f"{n:,} events{span}; " + "; ".join(why) + ". peak_* is the highest point within this "
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
            parts.append(
                f"; PyTorch had {format_bytes(allocated)} allocated of {format_bytes(reserved)} reserved"
            )
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


class _Walk:
    """The running state of one pass over a device's time-ordered trace: what ``replay`` concludes from.

    Sizes are relative to the trace's start (``delta``): what was alive
    before it is only known from its frees (``before_bytes``) and from the
    blocks still active at the end, which ``replay`` adds.
    """

    __slots__ = ("trace", "marks", "release_on_request", "live", "closed_at_peak", "allocs", "others",
                 "before_bytes", "freed_unknown", "best", "best_i", "seg", "seg_at_best", "ooms", "unknown",
                 "points", "events", "base")

    def __init__(self, trace: list[Any], marks: Marks | None) -> None:
        self.trace = trace
        self.marks = marks  # phase marks, when the recording had any
        # a trace recorded without free_completed events: a requested free is the free
        self.release_on_request = not any(e.get("action") == "free_completed" for e in trace)
        self.live: dict[Any, tuple[int, int, Any]] = {}  # addr -> (start index, size, entry or None)
        self.closed_at_peak: list[tuple[int, int, Any]] = []  # freed since the peak, alive at it
        self.allocs: dict[Any, list[Any]] = {}  # stack key -> [frames, bytes, count]
        self.others: list[tuple[Any, int, Any]] = []  # allocations whose key clashed with another stack
        self.before_bytes = 0  # allocations older than the trace, known from their frees
        self.freed_unknown = 0
        self.best = 0  # the live bytes at the peak, relative to the start
        self.best_i = -1  # the peak's trace index
        self.seg = self.seg_at_best = 0  # segment bytes added since the start: at the end, at the peak
        self.ooms: list[tuple[int, Any, int, int]] = []  # (index, entry, delta, seg) of each oom event
        self.unknown = 0  # events of unknown kinds
        self.points: list[tuple[Any, int]] = []  # (time_us, delta) after each alloc and free: the timeline
        self.events: list[tuple[Any, Any, int]] = []  # (time_us, frames or _BEFORE, +-bytes): the event history
        self.base: list[Any] = []  # (frames or _BEFORE, bytes) of what was alive before the trace began

    def run(self) -> None:
        """The single pass: live bytes after each alloc and free, the peak, segments, the rest noted."""
        live, closed, points, events = self.live, self.closed_at_peak, self.points, self.events
        group, release_on_request = self._group, self.release_on_request
        delta = best = seg = seg_at_best = 0  # locals while the loop runs; stored when it ends
        best_i = -1
        for i, e in enumerate(self.trace):
            action = e["action"]
            if action == "alloc":
                addr = e["addr"]
                size = e["size"]
                if type(addr) is not int or type(size) is not int or size < 0:
                    raise ProfileFormatError(f"trace event {i + 1}: addr or size is not an integer")
                t, frames = e.get("time_us"), e.get("frames")
                old = live.get(addr)
                if old is not None:  # the address came back without a recorded free
                    delta -= old[1]
                    events.append((t, old[2].get("frames"), -old[1]))
                    if old[0] <= best_i:
                        closed.append(old)
                live[addr] = (i, size, e)
                delta += size
                group(frames, size, t)
                points.append((t, delta))
                events.append((t, frames, size))
                if delta > best:
                    best, best_i, seg_at_best = delta, i, seg
                    closed.clear()
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
                    events.append((t, old[2].get("frames"), -old[1]))
                points.append((t, delta))
            elif action != "free_requested":
                # (a requested free changes nothing: an allocation counts until its free completes;
                # one the trace never saw allocated is picked up at completion, or from the blocks
                # when it is still pending at the end)
                seg = self._other(i, e, action, delta, seg)
        self.best, self.best_i, self.seg, self.seg_at_best = best, best_i, seg, seg_at_best

    def _group(self, frames: Any, size: int, time_us: Any) -> None:
        """Book an allocation to its stack's row without converting the stack.

        A cheap key from three frames' identities, then list equality (an
        identity check per frame, as torch shares frame dicts); a clash goes
        to ``others``. With phase marks the key holds the phase too.
        """
        if type(frames) is list and frames:
            key: Any = id(frames[0]) ^ (id(frames[-1]) << 1) ^ (id(frames[len(frames) >> 1]) << 2)
        else:
            key = id(frames)
        if self.marks is not None:
            key = (key, self.marks.at(time_us))
        row = self.allocs.get(key)
        if row is None:
            self.allocs[key] = [frames, size, 1]
        elif row[0] is frames or row[0] == frames:
            row[1] += size
            row[2] += 1
        else:
            self.others.append((frames, size, key))

    def _free_before(self, i: int, e: Mapping[str, Any]) -> int:
        """A free of an allocation made before the trace began: alive at any peak; its size."""
        size = _int(e["size"], f"trace event {i + 1} size")
        self.before_bytes += size
        self.freed_unknown += 1
        self.closed_at_peak.append((-1, size, None))
        self.base.append((_BEFORE, size))
        self.events.append((e.get("time_us"), _BEFORE, -size))
        return size

    def _other(self, i: int, e: Mapping[str, Any], action: str, delta: int, seg: int) -> int:
        """A segment, oom or unknown event (rare beside allocs and frees); returns the segment bytes after it."""
        if action == "segment_alloc" or action == "segment_map":
            seg += _int(e["size"], f"trace event {i + 1} size")
        elif action == "segment_free" or action == "segment_unmap":
            seg -= _int(e["size"], f"trace event {i + 1} size")
        elif action == "oom":
            self.ooms.append((i, e, delta, seg))
        elif action != "snapshot":
            self.unknown += 1
        return seg


def _phase_of_key(key: Any) -> str | None:
    """An alloc row's phase: its key is (stack key, phase) when the snapshot has phase marks."""
    return key[1] if type(key) is tuple else None


def _in_time_order(trace: list[Any]) -> list[Any]:
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


def _when(time_us: int) -> str:
    """Epoch microseconds as a UTC time; the raw number if it is not a plausible time."""
    try:
        moment = datetime.fromtimestamp(time_us / 1e6, tz=timezone.utc)
    except (OverflowError, OSError, ValueError):
        return f"t={time_us} us"
    if moment.year < 2000:
        return f"t={time_us} us"
    return moment.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"
