"""Diff: what changed between two profiles, as one profile of signed values."""

from __future__ import annotations

from gpuflame.errors import GpuflameError
from gpuflame.model.merge import merge
from gpuflame.model.profile import Profile, Sample, SampleType


def negate(profile: Profile) -> Profile:
    """The same profile with every value negated (pprof's ``-diff_base``)."""
    return profile.derive([Sample(s.stack, tuple(-v for v in s.values), s.labels) for s in profile.samples])


def shared_types(base: Profile, new: Profile) -> list[SampleType]:
    """The sample types both profiles have, in *new*'s order; an error naming both sets if none."""
    common = [st for st in new.sample_types if st.type in base.type_names()]
    if not common:
        raise GpuflameError(
            "the two profiles share no sample type "
            f"(base has {', '.join(base.type_names()) or 'none'}; "
            f"new has {', '.join(new.type_names()) or 'none'})"
        )
    return common


def diff(base: Profile, new: Profile) -> Profile:
    """``new - base`` per stack and label set: positive grew, negative shrank.

    Only sample types present in both profiles are compared; stacks that did
    not change cancel out and are dropped.
    """
    common = shared_types(base, new)
    merged = merge([select_types(new, common), negate(select_types(base, common))], peaks="sum")
    merged.comments = ["diff: new minus base"]
    merged.timeline = None  # a difference is no moment of either run: no memory-over-time to show
    return merged.compact()


def select_types(profile: Profile, types: list[SampleType]) -> Profile:
    """The profile reduced to *types*, in that order."""
    idx = [profile.type_index(st.type) for st in types]
    samples = [Sample(s.stack, tuple(s.values[i] for i in idx), s.labels) for s in profile.samples]
    return profile.derive(samples, sample_types=types)
