"""The profile model every stage of gpuflame talks through.

Shaped like pprof so that writing ``*.pb.gz`` is a direct mapping: a profile
holds a table of distinct frames and a list of samples; a sample is a stack of
frame ids (leaf first), one value per sample type, and labels. Stacks are
tuples of small ints rather than frame objects because profiles of hundreds of
thousands of samples are hashed and walked often, and int tuples are what
CPython hashes and compares fastest.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import TYPE_CHECKING, overload

from gpuflame.errors import UnknownSampleTypeError
from gpuflame.model.parts import Frame, Labels, LabelSetTotal, Sample, SampleType, make_labels  # noqa: F401 - the profile's parts, named with it
from gpuflame.model.peak import BOUND, PROCESS, PeakUnit, describe
from gpuflame.model.phases import PhaseStat
from gpuflame.model.processes import ProcessInfo
from gpuflame.model.timeline import Timeline
from gpuflame.symbols.kinds import FRAME_KINDS, NATIVE, PYTHON, SYNTHETIC, TRAMPOLINE_KIND  # noqa: F401 - with Frame
from gpuflame.units import format_bytes

if TYPE_CHECKING:
    from gpuflame.model.columns import SampleColumns
    from gpuflame.model.history import History

# Short names every command and the API accept for a sample type (``--type peak``).
TYPE_ALIASES = {"peak": "peak_space", "inuse": "inuse_space", "alloc": "alloc_space"}


_LABELS = attrgetter("labels")
_VALUES = attrgetter("values")


class _Samples:
    """``Profile.samples``: a list of :class:`Sample`, or columns made into that list on first use.

    A reader of a million samples hands over :class:`gpuflame.model.columns.SampleColumns`
    (:meth:`Profile.set_columns`); code that reads arrays asks :meth:`Profile.columns`
    and the million stack tuples are never built. Anything else sees the list, as ever.
    """

    @overload
    def __get__(self, profile: None, owner: type | None = None) -> _Samples: ...

    @overload
    def __get__(self, profile: Profile, owner: type | None = None) -> list[Sample]: ...

    def __get__(self, profile: Profile | None, owner: type | None = None) -> list[Sample] | _Samples:
        if profile is None:
            return self  # the dataclass's default: __set__ makes it []
        state = profile.__dict__
        columns = state.get("_columns")
        if columns is not None:  # dropped only once the list is in place: another thread reading
            state["_samples"] = columns.to_samples()  # meanwhile builds its own, never sees []
            state.pop("_columns", None)
        samples: list[Sample] = state["_samples"]
        return samples

    def __set__(self, profile: Profile, samples: list[Sample]) -> None:
        profile.__dict__.pop("_columns", None)
        profile.__dict__["_samples"] = samples if isinstance(samples, list) else []  # else: the default


@dataclass
class Profile:
    """Samples over a shared frame table, with one value per sample type."""

    sample_types: list[SampleType]
    frames: list[Frame] = field(default_factory=list)
    samples: _Samples = _Samples()  # a list[Sample], or columns until first read
    comments: list[str] = field(default_factory=list)
    default_type: str | None = None
    time_nanos: int = 0
    duration_nanos: int = 0
    # memory over time (model/timeline.py); None when the source has no time order
    timeline: Timeline | None = None
    # what the peak_* values are, per device (model/peak.py); empty when the source did not say
    peaks: list[PeakUnit] = field(default_factory=list)
    # each phase's own peak and in use at its end (model/phases.py); empty when no phase was marked
    phases: list[PhaseStat] = field(default_factory=list)
    # every allocation and free, bounded (model/history.py); None when the source kept none
    history: History | None = None
    # who each process was: pid, rank, command line, its own peak (model/processes.py); empty when none said
    processes: list[ProcessInfo] = field(default_factory=list)
    # a profile of one moment or window (model/moment.py): what it shows, in words; "" for the peak and the end
    moment: str = ""
    _frame_ids: dict[Frame, int] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.sample_types = [st if type(st) is SampleType else SampleType(*st) for st in self.sample_types]
        self._frame_ids = {f: i for i, f in enumerate(self.frames)}

    # -- building ---------------------------------------------------------

    def frame_id(self, frame: Frame) -> int:
        """Id of *frame* in this profile's table, adding it if new."""
        fid = self._frame_ids.get(frame)
        if fid is None:
            fid = len(self.frames)
            self.frames.append(frame)
            self._frame_ids[frame] = fid
        return fid

    def frame_ids(self, frames: Iterable[Frame]) -> list[int]:
        """:meth:`frame_id` of each of *frames*, in C loops: a reader adds a million at once."""
        frames = list(frames)
        table = self._frame_ids
        if not table:  # a reader's first table: one dict pass where every frame is new (a million, often)
            first = len(self.frames)
            table.update(zip(frames, range(first, first + len(frames)), strict=True))
            if len(table) == len(frames):
                self.frames.extend(frames)
                return list(range(first, first + len(frames)))
            table.clear()
        new = [f for f in dict.fromkeys(frames) if f not in table]
        table.update(zip(new, range(len(self.frames), len(self.frames) + len(new)), strict=True))
        self.frames.extend(new)
        return list(map(table.__getitem__, frames))

    def add(
        self,
        stack: Sequence[Frame],
        values: Sequence[int] | Mapping[str, int],
        labels: Mapping[str, object] | None = None,
    ) -> Sample:
        """Add a sample; *stack* is leaf first, *values* by position or type name."""
        if isinstance(values, Mapping):
            row = [0] * len(self.sample_types)
            for name, v in values.items():
                row[self.type_index(name)] = int(v)
            vals = tuple(row)
        else:
            vals = tuple(int(v) for v in values)
            if len(vals) != len(self.sample_types):
                raise ValueError(f"expected {len(self.sample_types)} values, got {len(vals)}")
        sample = Sample(tuple(self.frame_id(f) for f in stack), vals, make_labels(labels))
        self.samples.append(sample)
        return sample

    def set_columns(self, columns: SampleColumns) -> None:
        """Hold the samples as *columns*; ``samples`` builds the list the first time it is read."""
        self.samples = []
        self.__dict__["_columns"] = columns

    def columns(self) -> SampleColumns:
        """The samples as arrays: the columns a reader handed over, else made from ``samples`` (numpy)."""
        from gpuflame.model.columns import from_samples  # launcher side only

        held: SampleColumns | None = self.__dict__.get("_columns")
        return held if held is not None else from_samples(self.samples, len(self.sample_types))

    def held_columns(self) -> SampleColumns | None:
        """The columns a reader handed over, while no one has asked for ``samples``; else None (nothing is made)."""
        held: SampleColumns | None = self.__dict__.get("_columns")
        return held

    def label_set_totals(self) -> list[LabelSetTotal]:
        """Per distinct label set, in order of first use: each type's sum, and which types have a value not 0.

        A few label sets among a million samples: what per-device and
        per-process answers read, without building stacks held as columns.
        """
        held = self.held_columns()
        if held is not None:  # read by several answers of one report: summed once (columns do not change)
            memo = self.__dict__.get("_label_set_memo")
            if memo is None or memo[0] is not held:
                memo = self.__dict__["_label_set_memo"] = (held, held.label_set_totals())
            return list(memo[1])
        width = len(self.sample_types)
        rows: dict[Labels, tuple[list[int], list[bool]]] = {}
        for labels, values in zip(map(_LABELS, self.samples), map(_VALUES, self.samples), strict=True):
            row = rows.get(labels)
            if row is None:
                row = rows[labels] = ([0] * width, [False] * width)
            sums, nonzero = row
            for k, v in enumerate(values):
                if v:
                    sums[k] += v
                    nonzero[k] = True
        return [LabelSetTotal(labels, tuple(s), tuple(n)) for labels, (s, n) in rows.items()]

    # -- sample types -----------------------------------------------------

    def type_names(self) -> list[str]:
        return [st.type for st in self.sample_types]

    def type_index(self, name: str) -> int:
        """Index of a sample type given as ``peak_space``, ``peak_space/bytes`` or ``peak`` (:data:`TYPE_ALIASES`)."""
        wanted = name.split("/", 1)[0]
        wanted = TYPE_ALIASES.get(wanted, wanted)
        for i, st in enumerate(self.sample_types):
            if st.type == wanted:
                return i
        have = ", ".join(self.type_names()) or "none"
        raise UnknownSampleTypeError(f"this profile has no sample type {name!r} (it has: {have})")

    def pick_type(self, name: str | None = None) -> int:
        """The type the user asked for, else the profile's default, else by preference.

        Preference follows README's sample types: peak (the OOM question), then in-use,
        then allocated, then the last type, as pprof takes it when a file names no
        default (JAX's device-memory profiles list ``allocations`` before ``space``).
        """
        if name:
            return self.type_index(name)
        names = self.type_names()
        if self.default_type and self.default_type in names:
            return names.index(self.default_type)
        for preferred in ("peak_space", "inuse_space", "alloc_space"):
            if preferred in names:
                return names.index(preferred)
        if not names:
            raise UnknownSampleTypeError("this profile has no sample types")
        return len(names) - 1

    # -- reading ----------------------------------------------------------

    def stack_frames(self, sample: Sample) -> list[Frame]:
        """The frames of a sample's stack, leaf first."""
        frames = self.frames
        return [frames[i] for i in sample.stack]

    def totals(self) -> dict[str, int]:
        """Sum of every sample type over all samples."""
        held = self.held_columns()
        if held is not None:
            return dict(zip(self.type_names(), held.totals(), strict=True))
        sums = [0] * len(self.sample_types)
        for s in self.samples:
            for i, v in enumerate(s.values):
                sums[i] += v
        return {st.type: sums[i] for i, st in enumerate(self.sample_types)}

    def label_values(self, key: str) -> list[str]:
        """Distinct values of one label, sorted."""
        return sorted({v for labels in self._label_sets() for k, v in labels if k == key})

    def label_keys(self) -> list[str]:
        return sorted({k for labels in self._label_sets() for k, _ in labels})

    def has_label(self, key: str) -> bool:
        """Whether any sample has the label *key*."""
        return any(k == key for labels in self._label_sets() for k, _ in labels)

    def _label_sets(self) -> Iterable[Labels]:
        """Every sample's labels, or the distinct label sets of columns a reader handed over (no sample made)."""
        held = self.held_columns()
        return held.label_sets if held is not None else map(_LABELS, self.samples)

    def peak_units(self) -> list[PeakUnit]:
        """What the peak_* values are, per device: the stored units, else what can be told.

        A profile that does not say (another tool's, or gpuflame's before it
        said) is one process's own peak when its samples carry one pid (or
        none), and a sum of per-process peaks when they carry several.
        """
        if "peak_space" not in self.type_names():
            return list(self.peaks)
        index = self.type_index("peak_space")
        devices: dict[str, set[str]] = {}
        for labels in {row.labels for row in self.label_set_totals() if row.nonzero[index]}:
            found = dict(labels)
            devices.setdefault(found.get("device", "") or "", set()).add(found.get("pid", "") or "")
        units = list(self.peaks)
        known = {u.device for u in units}
        start = self.time_nanos
        end = start + self.duration_nanos if start and self.duration_nanos else 0
        for device, pids in sorted(devices.items()):
            if device in known:
                continue
            pid = next(iter(pids)) if len(pids) == 1 else ""
            kind = PROCESS if len(pids) == 1 else BOUND
            units.append(PeakUnit(device, kind, start, end, pid=pid, processes=len(pids)))
        return units

    def peak_description(self, type_name: str) -> str:
        """What a ``peak_*`` total of this profile is, in words; '' for other types.

        Only the devices that still have samples are described (after ``--label device=...``).
        A profile of one moment (``--at``, ``--between``) says which moment, for every type.
        """
        if self.moment:
            return self.moment
        if not type_name.split("/", 1)[0].startswith("peak_"):
            return ""
        units = self.peak_units()
        shown = [dict(row.labels) for row in self.label_set_totals() if any(row.nonzero)]
        devices = {labels.get("device", "") or "" for labels in shown}
        pids = {labels.get("pid", "") or "" for labels in shown}
        only_pid = next(iter(pids)) if len(pids) == 1 else ""
        units = [u for u in units if u.device in devices] or units
        text = describe(units, only_pid)
        if len({u.device for u in units}) < 2:
            return text
        sums = self.device_totals(self.type_index(type_name))
        each = ", ".join(f"{u.device} {format_bytes(sums.get(u.device, 0))}" for u in units)
        joint = self.joint_device_peak()
        start = self.timeline.start() if self.timeline is not None else None
        together = (
            (
                f": their allocations together peaked at {format_bytes(joint[1])}, "
                f"{(joint[0] - (start or joint[0])) / 1e9:.3f} s into the strip"
            )
            if joint
            else ""
        )
        plain = all(u.kind == PROCESS and not u.why for u in units)
        why = (  # torch's "cpu" and JAX's "cpu:0" in one process are one memory: the sum is no device's
            "CPU devices share the host's memory: the moment together is what it held"
            if all(u.device.split(":", 1)[0] == "cpu" for u in units)
            else "every GPU has its own memory"
        )
        return f"{len(units)} devices, each at its own peak ({why}): {each}; the sum is not one moment{together}" + (
            "" if plain else f"; per device: {text}"
        )

    def device_totals(self, type_index: int) -> dict[str, int]:
        """Each device's total of one sample type (``""`` for samples without a device)."""
        out: dict[str, int] = {}
        for row in self.label_set_totals():
            device = next((v for k, v in row.labels if k == "device"), "") or ""  # the first, as Sample.label
            out[device] = out.get(device, 0) + row.totals[type_index]
        return out

    def joint_device_peak(self) -> tuple[int, int] | None:
        """(epoch ns, bytes): the highest total of live allocations of all devices at one moment, from the
        timeline (the devices of one process share its clock); None without a timeline."""
        if self.timeline is None:
            return None
        total = self.timeline.total()
        return max(total, key=lambda p: p[1]) if total else None

    def __iter__(self) -> Iterator[Sample]:
        return iter(self.samples)

    def __len__(self) -> int:
        return len(self.samples)

    # -- housekeeping -----------------------------------------------------

    def empty_like(self) -> Profile:
        """A profile with the same types and metadata and no samples.

        The timeline is metadata too: filtering frames does not change how
        much memory the process held over time, so derived profiles share it.
        """
        return Profile(
            sample_types=list(self.sample_types),
            comments=list(self.comments),
            default_type=self.default_type,
            time_nanos=self.time_nanos,
            duration_nanos=self.duration_nanos,
            timeline=self.timeline,
            peaks=list(self.peaks),
            phases=list(self.phases),
            history=self.history,
            processes=list(self.processes),
            moment=self.moment,
        )

    def derive(
        self,
        samples: list[Sample] | None = None,
        sample_types: list[SampleType] | None = None,
    ) -> Profile:
        """A profile over the same frame table and metadata with other samples.

        The verbs (filter, diff, prune) use it to keep frame ids valid without
        copying stacks; call :meth:`compact` to drop frames no longer used.
        """
        out = self.empty_like()
        if sample_types is not None:
            out.sample_types = list(sample_types)
            if out.default_type not in [t.type for t in out.sample_types]:
                out.default_type = None
        out.frames = list(self.frames)
        out._frame_ids = dict(self._frame_ids)
        out.samples = samples if samples is not None else list(self.samples)
        return out

    def compact(self) -> Profile:
        """Merge samples with equal stack and labels, drop all-zero samples and unused frames.

        Returns a new profile; frames are renumbered in order of first use.
        """
        sums: dict[tuple[tuple[int, ...], Labels], list[int]] = {}
        width = len(self.sample_types)
        for s in self.samples:
            key = (s.stack, s.labels)
            row = sums.get(key)
            if row is None:
                sums[key] = list(s.values)
            else:
                for i in range(width):
                    row[i] += s.values[i]
        out = self.empty_like()
        remap: dict[int, int] = {}
        for (stack, labels), row in sums.items():
            if not any(row):
                continue
            new_stack = []
            for fid in stack:
                nid = remap.get(fid)
                if nid is None:
                    nid = remap[fid] = out.frame_id(self.frames[fid])
                new_stack.append(nid)
            out.samples.append(Sample(tuple(new_stack), tuple(row), labels))
        return out
