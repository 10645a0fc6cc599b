"""Merge: many profiles into one (pprof's Merge verb)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpuflame.model.profile import Labels, Profile, Sample, SampleType, make_labels
from gpuflame.model.timeline import Point, Timeline


def merge(
    profiles: Sequence[Profile],
    labels: Sequence[Mapping[str, object] | None] | None = None,
) -> Profile:
    """One profile holding every sample of *profiles*.

    Sample types are the union by type name, in order of first appearance; a
    profile lacking a type contributes 0 to it. *labels*, one mapping per
    profile, are added to that profile's samples (e.g. ``{"pid": 123}`` when
    merging per-process files), without replacing labels the samples have.

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
    types: list[SampleType] = []
    for p in profiles:
        for st in p.sample_types:
            if st.type not in [t.type for t in types]:
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
        slots = [names.index(st.type) for st in p.sample_types]
        extra = make_labels(labels[n]) if labels else ()
        remap = [out.frame_id(f) for f in p.frames]
        for s in p.samples:
            row = [0] * len(types)
            for i, v in zip(slots, s.values, strict=True):
                row[i] += v
            lab = s.labels
            if extra:
                have = {k for k, _ in lab}
                lab = tuple(sorted(lab + tuple((k, v) for k, v in extra if k not in have)))
            out.samples.append(Sample(tuple(remap[f] for f in s.stack), tuple(row), lab))
    out.timeline = _merge_timelines(out, profiles, [make_labels(x) for x in labels] if labels else None)
    return out


def _merge_timelines(
    out: Profile, profiles: Sequence[Profile], extras: Sequence[Labels] | None
) -> Timeline | None:
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
