"""Diff: what changed between two profiles, as one profile of signed values."""

from __future__ import annotations

import os

from gpuflame.errors import GpuflameError
from gpuflame.model.merge import merge
from gpuflame.model.profile import PYTHON, Profile, Sample, SampleType

MODULE = "<module>"  # a script's (or module's) top-level code


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


def renamed_scripts(base: Profile, new: Profile) -> dict[str, str]:
    """Base file -> new file for a script that was renamed between the two runs (``train.py`` -> ``train_v2.py``).

    A candidate is a file whose top-level code (``<module>``) is in one
    profile while no frame of the other names that file. One candidate on
    each side is a pair; several are paired where their file names (without
    the folder) are equal, one to one. Anything else stays as it is.
    """
    base_only = _module_files(base) - _files(new)
    new_only = _module_files(new) - _files(base)
    if len(base_only) == 1 and len(new_only) == 1:
        return {next(iter(base_only)): next(iter(new_only))}
    pairs = {}
    for name in {os.path.basename(f) for f in base_only}:
        olds = [f for f in base_only if os.path.basename(f) == name]
        news = [f for f in new_only if os.path.basename(f) == name]
        if len(olds) == 1 and len(news) == 1:
            pairs[olds[0]] = news[0]
    return pairs


def renamed(profile: Profile, files: dict[str, str]) -> Profile:
    """*profile* with every frame of a file in *files* moved to its new name (the same stacks and values)."""
    if not files:
        return profile
    out = profile.derive()
    out.frames = [f._replace(file=files[f.file]) if f.file in files else f for f in profile.frames]
    out._frame_ids = {f: i for i, f in enumerate(out.frames)}  # the new names are no file of this profile yet
    return out


def _module_files(profile: Profile) -> set[str]:
    return {f.file for f in profile.frames if f.name == MODULE and f.kind == PYTHON and f.file}


def _files(profile: Profile) -> set[str]:
    return {f.file for f in profile.frames if f.file}
