"""Merge: many profiles into one (pprof's Merge verb), with a peak that happened.

Every sample type but the peak adds up. A peak does not: each profile's peak
is its own highest total, reached at its own moment, and the sum of those is
a moment that may never have happened. So for ``peak_*`` the merge works per
device on what each profile says its peak is (:mod:`gpuflame.model.peak`):

- processes of one run that published to the run's shared table for a
  device (``gpuflame run``) merge into their *joint* peak: each contributes
  what it held at the table's last raise of the highest total, and the
  contributions must add up to that total, or the merge says why not;
- recording windows that did not overlap in time (two ``gpuflame.profile()``
  blocks one after the other, children run one after the other without a
  table) merge by *max*: the window with the highest peak, the others 0;
- windows that overlapped with no common clock (torch-cuda processes, JAX)
  are summed and labelled an *upper bound*.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from gpuflame.model import history, processes
from gpuflame.model.peak import (
    BOUND,
    EXACT,
    JOINT,
    JOINT_OBJECTS,
    JOINT_SPACE,
    MAX,
    PARTIAL,
    PROCESS,
    SAMPLED,
    PeakUnit,
)
from gpuflame.model.phases import merge_rows
from gpuflame.model.profile import Labels, Profile, Sample, SampleType, make_labels
from gpuflame.model.timeline import Point, Timeline

OWN, SHARE, NONE = "own", "share", "none"  # which values stand for a profile's peak on a device
PEAK_TYPES = ("peak_space", "peak_objects")


def merge(
    profiles: Sequence[Profile],
    labels: Sequence[Mapping[str, object] | None] | None = None,
    peaks: str = "moment",
) -> Profile:
    """One profile holding every sample of *profiles*.

    Sample types are the union by type name, in order of first appearance; a
    profile lacking a type contributes 0 to it. *labels*, one mapping per
    profile, are added to that profile's samples (e.g. ``{"pid": 123}`` when
    merging per-process files), without replacing labels the samples have.

    *peaks*: ``"moment"`` (default) merges the peak as the module says, when
    profiles of different processes or windows meet on a device; ``"final"``
    does so even for one profile and drops the per-process ``joint_peak_*``
    types (the end of ``gpuflame run``); ``"sum"`` adds peaks like any type
    (arithmetic on profiles, such as a diff).

    Timelines are combined as a union of series, each relabelled with its
    profile's *labels* like the samples; each keeps its own times, so a
    process stays where it ran. Two series that end up with the same labels
    and do not overlap in time (two windows of one process) become one,
    falling to 0 between them, as a series counts nothing outside its span.
    Two that overlap (merging two runs of one device without telling them
    apart) cannot be one line: the first is kept, the later one dropped,
    and a comment says so.
    """
    if labels is not None and len(labels) != len(profiles):
        raise ValueError("give one labels mapping per profile")
    plan = _plan_peaks(profiles, peaks == "final") if peaks != "sum" else None
    types: list[SampleType] = []
    for p in profiles:
        for st in p.sample_types:
            if st.type not in [t.type for t in types] and not (plan and plan.drop and st.type in plan.drop):
                types.append(st)
    out = Profile(sample_types=types)
    first = profiles[0] if profiles else None
    if first is not None:
        out.default_type = first.default_type
        out.time_nanos = min((p.time_nanos for p in profiles if p.time_nanos), default=0)
        out.duration_nanos = max(p.duration_nanos for p in profiles)
    names = [t.type for t in types]
    for n, p in enumerate(profiles):
        for c in p.comments:
            if c not in out.comments:
                out.comments.append(c)
        slots = [names.index(st.type) if st.type in names else -1 for st in p.sample_types]
        extra = make_labels(labels[n]) if labels else ()
        remap = [out.frame_id(f) for f in p.frames]
        peak_fix = plan.fixer(n, p, names) if plan else None
        for s in p.samples:
            row = [0] * len(types)
            for i, v in zip(slots, s.values, strict=True):
                if i >= 0:
                    row[i] += v
            if peak_fix is not None:
                peak_fix(s, row)
            lab = s.labels
            if extra:
                have = {k for k, _ in lab}
                lab = tuple(sorted(lab + tuple((k, v) for k, v in extra if k not in have)))
            out.samples.append(Sample(tuple(remap[f] for f in s.stack), tuple(row), lab))
    # parts of one profile (its peak, in-use and alloc views) carry the same units: each is kept once
    out.peaks = plan.units if plan else list(dict.fromkeys(u for p in profiles for u in p.peaks))
    if plan and "inuse_space" in names and any(u.kind == MAX and u.windows > 1 for u in plan.units):
        out.comments.append(ENDS_ADDED)
    out.phases = merge_rows(*(p.phases for p in profiles))  # per process and device, never summed
    out.processes = processes.merged(p.processes for p in profiles)  # one per pid, each its own peak
    extras = [make_labels(x) for x in labels] if labels else None
    out.timeline = _merge_timelines(out, profiles, extras)
    out.history = history.merged([p.history for p in profiles], extras)  # each track keeps its own times
    return out


# what a merge of windows one after the other says of inuse_*, which adds up like every type but the peak
ENDS_ADDED = (
    "inuse_* adds up what each recording window held at its end: windows that did not overlap in time "
    "(runs one after the other) never held that total at one moment (peak_* is the highest window's own)"
)


# -- the peak ------------------------------------------------------------------------


@dataclass
class _Window:
    """Peaks of one or more profiles on one device that stand or fall together."""

    unit: PeakUnit
    value: int
    choice: dict[int, str]  # profile index -> OWN or SHARE


@dataclass
class _PeakPlan:
    units: list[PeakUnit]
    choice: dict[tuple[int, str], str] = field(default_factory=dict)  # (profile, device) -> OWN/SHARE/NONE
    drop: tuple[str, ...] = ()  # the joint_peak_* types, once resolved

    def fixer(self, n: int, p: Profile, names: list[str]) -> Callable[[Sample, list[int]], None] | None:
        """The function that sets one sample's peak columns in the merged row; None when they stay."""
        names_in = p.type_names()
        columns = [
            (names.index(t), names_in.index(j) if j in names_in else -1)
            for t, j in zip(PEAK_TYPES, (JOINT_SPACE, JOINT_OBJECTS), strict=True)
            if t in names
        ]
        choice = {d: c for (m, d), c in self.choice.items() if m == n}
        if not choice or all(c == OWN for c in choice.values()):
            return None

        def fix(s: Sample, row: list[int]) -> None:
            how = choice.get(s.label("device", "") or "", OWN)
            if how == OWN:
                return
            for out_i, share_i in columns:
                row[out_i] = s.values[share_i] if how == SHARE and share_i >= 0 else 0

        return fix


def _plan_peaks(profiles: Sequence[Profile], final: bool) -> _PeakPlan | None:
    """Per device, which profiles' peaks make the merged peak, and what it then is."""
    with_peak = [n for n, p in enumerate(profiles) if "peak_space" in p.type_names()]
    if not with_peak or (len(profiles) < 2 and not final):
        return None
    by_device: dict[str, list[tuple[int, PeakUnit]]] = {}
    for n in with_peak:
        for unit in profiles[n].peak_units():
            by_device.setdefault(unit.device, []).append((n, unit))
    plan = _PeakPlan(units=[])
    resolved = final
    for device, members in by_device.items():
        if len(members) < 2 and not final:
            plan.units.append(members[0][1])
            continue
        resolved = True
        unit, choice = _peak_of_device(profiles, device, members)
        plan.units.append(unit)
        plan.choice.update({(n, device): c for n, c in choice.items()})
    if not resolved:
        return None
    plan.drop = (JOINT_SPACE, JOINT_OBJECTS)
    plan.units = [replace(u, table="", epoch=0, table_max=u.table_max if u.kind == PARTIAL else 0) for u in plan.units]
    return plan


def _peak_of_device(
    profiles: Sequence[Profile], device: str, members: list[tuple[int, PeakUnit]]
) -> tuple[PeakUnit, dict[int, str]]:
    """The merged peak unit of one device and each profile's part in it."""
    windows: list[_Window] = []
    tables: dict[str, list[tuple[int, PeakUnit]]] = {}
    for n, unit in members:
        if unit.kind == PROCESS and unit.table and JOINT_SPACE in profiles[n].type_names():
            tables.setdefault(unit.table, []).append((n, unit))
        else:
            windows.append(_Window(unit, _device_peak(profiles[n], device, "peak_space"), {n: OWN}))
    why = ""
    for group in tables.values():
        joint = _joint(profiles, device, group)
        if isinstance(joint, _Window):
            windows.append(joint)
            continue
        why = joint
        windows += [_Window(u, _device_peak(profiles[n], device, "peak_space"), {n: OWN}) for n, u in group]
    return _combine(windows, why)


def _joint(profiles: Sequence[Profile], device: str, group: list[tuple[int, PeakUnit]]) -> _Window | str:
    """The exact joint peak of processes that shared a table; a reason when it cannot be had."""
    last = max(u.epoch for _, u in group)
    at_last = [(n, u) for n, u in group if u.epoch == last]
    share = sum(_device_peak(profiles[n], device, JOINT_SPACE) for n, _ in at_last)
    expected = at_last[0][1].table_max
    if share > expected:
        return (
            f"the processes' shares at their joint peak add up to {share:,} B, more than the {expected:,} B "
            "they held together"
        )
    kind = (JOINT if len(group) > 1 else PROCESS) if share == expected else PARTIAL
    unit = PeakUnit(
        device,
        kind,
        start=min(u.start for _, u in group),
        end=max(u.end for _, u in group),
        pid=group[0][1].pid if len(group) == 1 and kind == PROCESS else "",
        processes=len(group),
        table_max=expected if kind == PARTIAL else 0,
    )
    choice = {n: (SHARE if u.epoch == last else NONE) for n, u in group}
    return _Window(unit, share, choice)


def _combine(windows: list[_Window], why: str) -> tuple[PeakUnit, dict[int, str]]:
    """Windows that overlap in time add up (a bound); apart, the highest group wins (exact)."""
    windows.sort(key=lambda w: (w.unit.start, w.unit.end))
    groups: list[list[_Window]] = []
    for w in windows:
        if groups and any(w.unit.overlaps(o.unit) for o in groups[-1]):
            groups[-1].append(w)
        else:
            groups.append([w])
    best = max(groups, key=lambda g: sum(w.value for w in g))  # the first of equals
    choice: dict[int, str] = {}
    for g in groups:
        for w in g:
            choice.update(w.choice if g is best else dict.fromkeys(w.choice, NONE))
    start = min((w.unit.start for w in best), default=0)
    end = max((w.unit.end for w in best), default=0)
    if len(best) == 1:
        unit = best[0].unit
        if len(groups) > 1 and unit.kind in EXACT:
            unit = replace(unit, kind=MAX, windows=len(groups))
        return replace(unit, why=why or unit.why), choice
    processes = sum(w.unit.processes for w in best)
    device = best[0].unit.device
    sampled = [w.unit.samples for w in best if w.unit.kind == SAMPLED or w.unit.samples]
    return PeakUnit(device, BOUND, start, end, processes=processes, samples=min(sampled, default=0), why=why), choice


def _device_peak(p: Profile, device: str, type_name: str) -> int:
    """A profile's total of one type on one device."""
    if type_name not in p.type_names():
        return 0
    i = p.type_index(type_name)
    return sum(s.values[i] for s in p.samples if (s.label("device", "") or "") == device)


def _merge_timelines(out: Profile, profiles: Sequence[Profile], extras: Sequence[Labels] | None) -> Timeline | None:
    """The union of the profiles' timeline series (see :func:`merge`); None when none has one."""
    if not any(p.timeline for p in profiles):
        return None
    merged = Timeline()
    dropped = 0
    for n, p in enumerate(profiles):
        if p.timeline is None:
            continue
        for key, points in p.timeline.relabelled(extras[n] if extras else ()).series.items():
            if key not in merged.series:
                merged.series[key] = points
                continue
            joined = _one_after_the_other(merged.series[key], points)
            if joined is None:
                dropped += 1
            else:
                merged.series[key] = joined
    if dropped:
        out.comments.append(
            f"merge: {dropped} memory timeline series left out: another profile had one with the same labels"
        )
    return merged


def _one_after_the_other(a: list[Point], b: list[Point]) -> list[Point] | None:
    """Two series of one label set as one, in time order, at 0 between them; None when they overlap."""
    if not a or not b:
        return a or b
    if a[0][0] > b[0][0]:
        a, b = b, a
    if a[-1][0] > b[0][0]:
        return None
    gap = [(a[-1][0], 0)] if a[-1][0] < b[0][0] and a[-1][1] else []
    return [*a, *gap, *b]
