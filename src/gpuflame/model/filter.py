"""Filter verbs: focus, ignore, hide, drop small frames, select by label.

Each returns a new profile over the same frame table (call ``compact()`` to
shed unused frames). Frame patterns accept either spelling of a method
(``Foo.bar`` or ``Foo > bar``) and match anywhere in the name, case-insensitive.

A filter that matches nothing is a typo more often than not (pprof says so
too): the ``*_matched`` forms return whether the filter changed anything,
so a caller never has to infer it by counting samples or frames.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from gpuflame.model.profile import SYNTHETIC, Frame, Profile, Sample
from gpuflame.symbols.names import compile_query, normalize
from gpuflame.units import format_bytes


def frame_matcher(profile: Profile, pattern: str) -> Callable[[int], bool]:
    """A test on frame ids for *pattern*, evaluated once per distinct frame."""
    regex = compile_query(pattern)
    hits = {i for i, f in enumerate(profile.frames) if regex.search(normalize(f.name))}
    return hits.__contains__


class Filtered(NamedTuple):
    """A filter's result and whether it matched: kept a sample (focus, labels), or dropped or changed one."""

    profile: Profile
    matched: bool


def focus(profile: Profile, pattern: str, trim: bool = True) -> Profile:
    """Only the samples whose stack passes through a frame matching *pattern*.

    With *trim* (Grafana's "Focus block"), the outermost matching frame
    becomes the root: the callers below it are cut away.
    """
    return focus_matched(profile, pattern, trim).profile


def focus_matched(profile: Profile, pattern: str, trim: bool = True) -> Filtered:
    """:func:`focus`, and whether any sample passes through *pattern*."""
    hit = frame_matcher(profile, pattern)
    out: list[Sample] = []
    for s in profile.samples:
        root_most = -1
        for pos in range(len(s.stack) - 1, -1, -1):
            if hit(s.stack[pos]):
                root_most = pos
                break
        if root_most < 0:
            continue
        stack = s.stack[: root_most + 1] if trim else s.stack
        out.append(Sample(stack, s.values, s.labels))
    return Filtered(profile.derive(out), bool(out))


def ignore(profile: Profile, pattern: str) -> Profile:
    """Drop every sample whose stack passes through a frame matching *pattern*.

    This is how ``<cached free blocks>`` is taken out of an in-use view.
    """
    return ignore_matched(profile, pattern).profile


def ignore_matched(profile: Profile, pattern: str) -> Filtered:
    """:func:`ignore`, and whether it dropped a sample."""
    hit = frame_matcher(profile, pattern)
    kept = [s for s in profile.samples if not any(hit(f) for f in s.stack)]
    return Filtered(profile.derive(kept), len(kept) < len(profile.samples))


def hide(profile: Profile, pattern: str) -> Profile:
    """Remove matching frames from stacks, keeping the samples and their values.

    Used for ``<interpreter trampoline>``: its callers and callees join up.
    A sample left with no frame keeps an empty stack (its bytes stay counted).
    """
    return hide_matched(profile, pattern).profile


def hide_matched(profile: Profile, pattern: str) -> Filtered:
    """:func:`hide`, and whether it removed a frame from any stack."""
    hit = frame_matcher(profile, pattern)
    out, removed = [], False
    for s in profile.samples:
        stack = tuple(f for f in s.stack if not hit(f))
        removed = removed or len(stack) < len(s.stack)
        out.append(Sample(stack, s.values, s.labels))
    return Filtered(profile.derive(out), removed)


def select_labels(profile: Profile, key: str, values: set[str]) -> Profile:
    """Only the samples whose label *key* has one of *values* (e.g. one pid)."""
    return select_labels_matched(profile, key, values).profile


def select_labels_matched(profile: Profile, key: str, values: set[str]) -> Filtered:
    """:func:`select_labels`, and whether any sample has one of *values*."""
    kept = [s for s in profile.samples if s.label(key) in values]
    return Filtered(profile.derive(kept), bool(kept))


def drop_small(profile: Profile, min_value: int, type_index: int) -> Profile:
    """Cut the flame graph where a frame's total falls under *min_value*.

    A stack is truncated at the first frame (from the root) whose total is
    below the threshold, and what was cut is shown as one synthetic
    ``<frames under N>`` leaf, so totals and the remaining frames' self
    values stay exact.
    """
    cuts = _cut_depths(profile.samples, min_value, type_index)
    out = profile.derive([])
    small = Frame(f"<frames under {format_bytes(min_value)}>", kind=SYNTHETIC)
    for s, depth in zip(profile.samples, cuts, strict=True):
        if depth < 0:
            out.samples.append(s)
        else:
            kept = s.stack[len(s.stack) - depth :] if depth else ()
            out.samples.append(Sample((out.frame_id(small),) + kept, s.values, s.labels))
    return out


def _cut_depths(samples: list[Sample], min_value: int, type_index: int) -> list[int]:
    """For each sample, the depth (0 = root) of its root-most prefix under *min_value*; -1 if none.

    Prefixes are grouped one depth at a time, and a sample leaves the work
    list once it is cut or its stack ends, so the cost is the frames above
    the cut rather than every frame of every stack (prefixes are never
    copied or hashed whole).
    """
    cuts = [-1] * len(samples)
    group = [0] * len(samples)  # the sample's prefix group at the previous depth
    alive = [i for i, s in enumerate(samples) if s.stack]
    depth = 0
    while alive:
        ids: dict[tuple[int, int], int] = {}
        totals: list[int] = []
        members = []
        for i in alive:
            s = samples[i]
            key = (group[i], s.stack[-1 - depth])
            g = ids.get(key)
            if g is None:
                g = ids[key] = len(totals)
                totals.append(0)
            totals[g] += s.values[type_index]
            members.append(g)
        still = []
        for i, g in zip(alive, members, strict=True):
            if abs(totals[g]) < min_value:
                cuts[i] = depth
            elif len(samples[i].stack) > depth + 1:
                group[i] = g
                still.append(i)
        alive = still
        depth += 1
    return cuts


def cut_callers(profile: Profile, is_caller: Callable[[Frame], bool]) -> Profile:
    """Cut each stack at the leaf-most frame *is_caller* accepts, that frame included.

    For code run by a host (pytest, an IPython kernel): the host's frames
    below the code it ran say nothing about the memory, so what the host
    called becomes the root. Stacks without such a frame stay whole.
    """
    cut = [is_caller(f) for f in profile.frames]
    out: list[Sample] = []
    for s in profile.samples:
        stack = s.stack
        for pos, fid in enumerate(stack):
            if cut[fid]:
                stack = stack[:pos]
                break
        out.append(Sample(stack, s.values, s.labels) if stack is not s.stack else s)
    return profile.derive(out)
