"""Filter verbs: focus, ignore, hide, drop small frames, select by label.

Each returns a new profile over the same frame table (call ``compact()`` to
shed unused frames). Frame patterns accept either spelling of a method
(``Foo.bar`` or ``Foo > bar``) and match anywhere in the name, case-insensitive.
"""

from __future__ import annotations

from typing import Callable

from gpuflame.profile.model import SYNTHETIC, Frame, Profile, Sample
from gpuflame.symbols.names import compile_query, normalize
from gpuflame.units import format_bytes


def frame_matcher(profile: Profile, pattern: str) -> Callable[[int], bool]:
    """A test on frame ids for *pattern*, evaluated once per distinct frame."""
    regex = compile_query(pattern)
    hits = {i for i, f in enumerate(profile.frames) if regex.search(normalize(f.name))}
    return hits.__contains__


def focus(profile: Profile, pattern: str, trim: bool = True) -> Profile:
    """Only the samples whose stack passes through a frame matching *pattern*.

    With *trim* (Grafana's "Focus block"), the outermost matching frame
    becomes the root: the callers below it are cut away.
    """
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
    return profile.derive(out)


def ignore(profile: Profile, pattern: str) -> Profile:
    """Drop every sample whose stack passes through a frame matching *pattern*.

    This is how ``<cached free blocks>`` is taken out of an in-use view.
    """
    hit = frame_matcher(profile, pattern)
    return profile.derive([s for s in profile.samples if not any(hit(f) for f in s.stack)])


def hide(profile: Profile, pattern: str) -> Profile:
    """Remove matching frames from stacks, keeping the samples and their values.

    Used for ``<interpreter trampoline>``: its callers and callees join up.
    A sample left with no frame keeps an empty stack (its bytes stay counted).
    """
    hit = frame_matcher(profile, pattern)
    return profile.derive(
        [Sample(tuple(f for f in s.stack if not hit(f)), s.values, s.labels) for s in profile.samples]
    )


def select_labels(profile: Profile, key: str, values: set[str]) -> Profile:
    """Only the samples whose label *key* has one of *values* (e.g. one pid)."""
    return profile.derive([s for s in profile.samples if s.label(key) in values])


def drop_small(profile: Profile, min_value: int, type_index: int) -> Profile:
    """Cut the flame graph where a frame's total falls under *min_value*.

    A stack is truncated at the first frame (from the root) whose total is
    below the threshold, and what was cut is shown as one synthetic
    ``<frames under N>`` leaf, so totals and the remaining frames' self
    values stay exact.
    """
    totals: dict[tuple[int, ...], int] = {}
    for s in profile.samples:
        v = s.values[type_index]
        root_first = s.stack[::-1]
        for depth in range(1, len(root_first) + 1):
            key = root_first[:depth]
            totals[key] = totals.get(key, 0) + v
    out = profile.derive([])
    small = Frame(f"<frames under {format_bytes(min_value)}>", kind=SYNTHETIC)
    for s in profile.samples:
        root_first = s.stack[::-1]
        keep = len(root_first)
        for depth in range(1, len(root_first) + 1):
            if abs(totals[root_first[:depth]]) < min_value:
                keep = depth - 1
                break
        if keep == len(root_first):
            out.samples.append(s)
        else:
            stack = (out.frame_id(small),) + tuple(reversed(root_first[:keep]))
            out.samples.append(Sample(stack, s.values, s.labels))
    return out
