"""One view of a profile: which moment, which samples, which frames, which sample type, how grouped.

Every front end (the CLI's analysis commands, ``gpuflame serve``'s query
parameters, the notebook magic, the pytest plugin) builds one
:class:`Selection` and calls :meth:`Selection.apply`, so the same choice
means the same view everywhere. Filters apply in one fixed order, whatever
order they were given in: first the moment, then which samples count
(labels, cached blocks, ignore, focus), then the stacks' shape (hide,
prune), and small bars are cut last, once the tree they are measured in is
final. A filter that matches nothing is a note of the view (pprof does the
same); a label or focus that leaves nothing of a non-empty profile is an
error, since the view would be empty (of a moment: one the whole recording
never had; one that held nothing then is a moment of 0 B).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuflame.boundary import ranks
from gpuflame.errors import GpuflameError
from gpuflame.model import drop_small, moment, prune_framework
from gpuflame.model.filter import (
    focus_matched,
    frame_matcher,
    hide_matched,
    ignore_matched,
    select_labels_matched,
)
from gpuflame.model.moment import When, parse_when
from gpuflame.model.profile import Frame, Profile
from gpuflame.symbols.names import CACHED_FREE, TRAMPOLINE_NAME
from gpuflame.units import format_bytes, parse_size

if TYPE_CHECKING:
    from gpuflame.analysis.tree import FlameTree


@dataclass(frozen=True)
class View:
    """A profile as selected: the profile shown, the sample type shown first, and what the filters noted."""

    profile: Profile
    type_index: int
    selection: Selection
    notes: tuple[str, ...] = ()

    def tree(self) -> FlameTree:
        """The flame tree of the view, grouped and by line as the selection asks."""
        from gpuflame.analysis.tree import build_tree  # numpy: not for a command that only converts

        return build_tree(self.profile, self.type_index, group_by=self.selection.group_by, lines=self.selection.lines)


@dataclass(frozen=True, kw_only=True)
class Selection:
    """What to show of a profile. The defaults show all of it: the peak, every sample, every frame."""

    sample_type: str | None = None  # peak_space, inuse, ... (None: peak where present, else inuse, else alloc)
    labels: tuple[tuple[str, str], ...] = ()  # same key: any of; different keys: all of
    no_cached: bool = False  # drop <cached free blocks>
    ignore: tuple[str, ...] = ()  # drop samples through a matching frame
    focus: str | None = None  # keep samples through a matching frame, which becomes the root
    hide: tuple[str, ...] = ()  # remove matching frames, their bytes staying with the callers
    hide_trampolines: bool = False
    prune_framework: tuple[str, ...] = ()  # framework packages whose frames between user frames go
    min_size: int = 0  # fold bars under this many bytes (0: none)
    at: When | None = None  # what was live at this moment
    between: tuple[When, When] | None = None  # what was allocated within this window
    group_by: str | None = None  # one subtree per value of this label (trees only)
    lines: bool = False  # one bar per source line (trees only)

    def apply(self, profile: Profile) -> View:
        """The view of *profile*: its moment, the sample type picked there, the filters in their order."""
        return self.filter(self.at_moment(profile))

    def at_moment(self, profile: Profile) -> Profile:
        """The profile of the moment or window asked for, else *profile* itself.

        A label or focus is checked against the whole recording here: one it never had is an error, one
        that held nothing at the moment leaves the moment empty (0 B), as a process idle at the peak does.
        """
        if self.at is not None:
            shown = moment.at(profile, self.at)
        elif self.between is not None:
            shown = moment.between(profile, *self.between)
        else:
            return profile
        self._known_in(profile)
        return shown

    def _known_in(self, recording: Profile) -> None:
        """Raise for a label value or a focus the whole *recording* never had (a typo, as without a moment)."""
        for key, values in self._wanted_labels().items():
            have = recording.label_values(key)
            if not values & set(have) and not _described(recording, key, values):
                raise _no_label(key, values, have)
        if self.focus:
            hit = frame_matcher(recording, self.focus)
            if not any(hit(i) for i in range(len(recording.frames))):
                raise GpuflameError(f"--focus: {_no_match_message(recording.frames, self.focus)}")

    def filter(self, profile: Profile) -> View:
        """*profile* (already at its moment) with the sample type picked and the filters applied."""
        index = profile.pick_type(self.sample_type)
        notes: list[str] = []
        recording, profile = profile, self._labels(profile)
        notes += _own_peaks_elsewhere(recording, profile, index, self.labels)
        if self.no_cached:
            profile = ignore_matched(profile, CACHED_FREE).profile
        for pattern in self.ignore:
            profile = _noted(ignore_matched(profile, pattern), profile, "--ignore", pattern, notes)
        if self.focus:
            focused = focus_matched(profile, self.focus)
            if not focused.matched and profile.samples and not profile.moment:  # a moment's: at_moment checked
                raise GpuflameError(f"--focus: {_no_match_message(profile.frames, self.focus)}")
            profile = focused.profile
        for pattern in self.hide:
            profile = _noted(hide_matched(profile, pattern), profile, "--hide", pattern, notes)
        if self.hide_trampolines:  # a flag, not a pattern: a profile without trampolines is no mistake
            profile = hide_matched(profile, TRAMPOLINE_NAME).profile
        if self.prune_framework:
            profile = prune_framework(profile, list(self.prune_framework))
        if self.min_size:
            profile = drop_small(profile, self.min_size, index)
        return View(profile, index, self, tuple(notes))

    def _wanted_labels(self) -> dict[str, set[str]]:
        wanted: dict[str, set[str]] = {}
        for key, value in self.labels:
            wanted.setdefault(key, set()).add(value)
        return wanted

    def _labels(self, profile: Profile) -> Profile:
        for key, values in self._wanted_labels().items():
            selected = select_labels_matched(profile, key, values)
            idle = _described(profile, key, values)  # a process of the run that held nothing: 0 B, as at a moment
            if not selected.matched and profile.samples and not profile.moment and not idle:
                raise _no_label(key, values, profile.label_values(key))
            profile = selected.profile
        return profile

    def words(self) -> list[str]:
        """The filters as a user would type them on a command line: a header of a filtered view says so."""
        words = [f"--label {shlex.quote(f'{k}={v}')}" for k, v in self.labels]
        words += ["--no-cached"] if self.no_cached else []
        words += [f"--ignore {shlex.quote(p)}" for p in self.ignore]
        words += [f"--focus {shlex.quote(self.focus)}"] if self.focus else []
        words += [f"--hide {shlex.quote(p)}" for p in self.hide]
        words += ["--hide-trampolines"] if self.hide_trampolines else []
        words += [f"--prune-framework={','.join(self.prune_framework)}"] if self.prune_framework else []
        words += [f"--min-size {self.min_size}"] if self.min_size else []
        return words

    @classmethod
    def from_query(cls, query: Mapping[str, Sequence[str]]) -> Selection:
        """A selection from URL query parameters named as the command line's options (``?focus=f&hide=g``).

        ``label`` is ``KEY=VALUE`` and repeats; ``between`` is given twice;
        a flag is on when present (``?no-cached``), unless ``0`` or ``false``.
        ValueError names the parameter that cannot be read.
        """
        unknown = sorted(set(query) - set(QUERY_NAMES))
        if unknown:
            raise ValueError(f"unknown parameter {unknown[0]!r} (known: {', '.join(QUERY_NAMES)})")

        def one(name: str) -> str | None:
            values = query.get(name) or []
            if len(values) > 1:
                raise ValueError(f"{name}: give it once (got {len(values)})")
            return values[0] if values else None

        def flag(name: str) -> bool:
            value = one(name)
            return value is not None and value.strip().lower() not in ("0", "false", "no", "off")

        between = [_when("between", v) for v in query.get("between") or []]
        if between and len(between) != 2:
            raise ValueError(f"between: give two times, between=T1&between=T2 (got {len(between)})")
        if between and query.get("at"):
            raise ValueError("at and between: give one of them (an instant, or a window)")
        size, at, prune, focus = one("min-size"), one("at"), one("prune-framework"), one("focus")
        return cls(
            sample_type=one("type") or None,
            labels=tuple(_label(v) for v in query.get("label") or []),
            no_cached=flag("no-cached"),
            ignore=_patterns("ignore", query.get("ignore") or []),
            focus=_patterns("focus", [focus])[0] if focus is not None else None,
            hide=_patterns("hide", query.get("hide") or []),
            hide_trampolines=flag("hide-trampolines"),
            prune_framework=tuple(p for p in (prune or "").split(",") if p.strip()),
            min_size=_size(size) if size else 0,
            at=_when("at", at) if at else None,
            between=(between[0], between[1]) if between else None,
            group_by=one("group-by") or None,
            lines=flag("lines"),
        )


QUERY_NAMES = (
    "type",
    "label",
    "no-cached",
    "ignore",
    "focus",
    "hide",
    "hide-trampolines",
    "prune-framework",
    "min-size",
    "at",
    "between",
    "group-by",
    "lines",
)  # the command line's option names


def _noted(result: tuple[Profile, bool], before: Profile, option: str, pattern: str, notes: list[str]) -> Profile:
    """A pattern that matched nothing is a typo more often than not: say so (pprof: "matched no samples")."""
    profile, matched = result
    if not matched and before.samples:
        notes.append(f"{option} changed nothing: {_no_match_message(before.frames, pattern)}")
    return profile


def _patterns(name: str, values: Sequence[str]) -> tuple[str, ...]:
    if any(not v.strip() for v in values):
        raise ValueError(f"{name}: the name is empty (an empty pattern would match every function)")
    return tuple(values)


def _label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"label: expected KEY=VALUE, got {text!r}")
    return key, value


def _when(name: str, text: str) -> When:
    try:
        return parse_when(text)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise ValueError(f"min-size: {exc}") from None


def _no_match_message(frames: list[Frame], query: str) -> str:
    from gpuflame.analysis.chains import no_match_message  # numpy, with the chains

    return no_match_message(frames, query)


PROCESS_KEYS = ("pid", *ranks.LABELS)  # labels every process of a run is described by


def _own_peaks_elsewhere(
    recording: Profile, shown: Profile, index: int, labels: Sequence[tuple[str, str]]
) -> list[str]:
    """A process picked by --label that held nothing at the peak, though it held memory at its own: say when.

    ``top --label pid=N`` of a DataLoader worker showed 0 B at the run's joint peak and nothing more;
    the run had said 'own peak 2.01 KiB at 1.209 s', and --at 1.209 missed it by half a millisecond.
    """
    if shown.moment or shown.sample_types[index].type != "peak_space" or shown.totals().get("peak_space"):
        return []
    picked = [i for i in recording.processes if any(k in PROCESS_KEYS and str(getattr(i, k)) == v for k, v in labels)]
    zero = moment.origin(recording)
    notes = []
    for info in picked:
        if info.peak and zero and info.peak_ns >= zero:
            t = f"{(info.peak_ns - zero) / 1e9:.9f}".rstrip("0").rstrip(".")
            notes.append(
                f"pid {info.pid} held nothing at the run's joint peak; its own peak, {format_bytes(info.peak)}, "
                f"was {t} s into the strip (--at {t} shows it)"
            )
    return notes


def _no_label(key: str, values: set[str], have: Sequence[str]) -> GpuflameError:
    """A --label that no sample has (of a moment: that the whole recording never had), with the values there are."""
    return GpuflameError(
        f"no sample has label {key}={'|'.join(sorted(values))} ({key} values here: {', '.join(have) or 'none'})"
    )


def _described(profile: Profile, key: str, values: set[str]) -> bool:
    """Whether a process the run describes (model/processes.py) has *key* in *values*: it is in the file."""
    return key in PROCESS_KEYS and any(str(getattr(info, key)) in values for info in profile.processes)
