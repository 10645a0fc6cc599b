"""What grew and what shrank between two profiles, by function.

The per-stack difference comes from :func:`gpuflame.model.diff.diff`
(``new - base``); a function's change is then the change of its self or
once-per-sample total, which is exact because both are sums over samples.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuflame.analysis.hotspots import FunctionStats, function_stats
from gpuflame.analysis.tree import build_table, frame_dict
from gpuflame.model.diff import diff, renamed, renamed_scripts
from gpuflame.model.functions import function_key
from gpuflame.model.profile import Frame, Profile

GREW, SHRANK, NEW, VANISHED = "grew", "shrank", "new", "vanished"


def renamed_note(old: str, new: str) -> str:
    """What ``diff`` and the diff page say of a renamed script compared as one file."""
    return f"{old} (base) and {new} (new): one script renamed, its <module> and functions matched by name"


@dataclass(frozen=True)
class Change:
    """One function's value in each profile; ``percent`` is relative to base (None when new)."""

    frame: Frame
    base: int
    new: int
    status: str

    @property
    def delta(self) -> int:
        return self.new - self.base

    @property
    def percent(self) -> float | None:
        return 100.0 * self.delta / self.base if self.base else None

    def to_dict(self) -> dict[str, object]:
        change = self.percent
        return {
            **frame_dict(self.frame),
            "base": self.base,
            "new": self.new,
            "delta": self.delta,
            "percent_change": None if change is None else round(change, 3),
            "status": self.status,
        }


@dataclass(frozen=True)
class Comparison:
    """The functions that changed most, in each direction, for one sample type."""

    type: str
    unit: str
    by: str
    base_total: int
    new_total: int
    grew: list[Change]
    shrank: list[Change]
    changed: int
    aligned: tuple[tuple[str, str], ...] = ()  # (base file, new file): a renamed script compared by name

    @property
    def delta(self) -> int:
        return self.new_total - self.base_total

    def to_dict(self) -> dict[str, object]:
        return {
            "sample_type": self.type,
            "unit": self.unit,
            "by": self.by,
            "base_total": self.base_total,
            "new_total": self.new_total,
            "delta": self.delta,
            "changed_functions": self.changed,
            "grew": [c.to_dict() for c in self.grew],
            "shrank": [c.to_dict() for c in self.shrank],
            "aligned": [{"base": old, "new": new} for old, new in self.aligned],
        }


def compare(
    base: Profile,
    new: Profile,
    type_name: str | None = None,
    by: str = "total",
    limit: int = 10,
    lines: bool = False,
    align: bool = True,
) -> Comparison:
    """Compare *base* and *new* by function for one sample type (default as ``Profile.pick_type``).

    *align*: a script renamed between the runs (its ``<module>`` in one
    file of each, :func:`~gpuflame.model.diff.renamed_scripts`) is compared
    as one file, its functions by name; the pairs are in ``aligned``.
    """
    files = renamed_scripts(base, new) if align else {}
    base = renamed(base, files)
    delta_profile = diff(base, new)
    index = delta_profile.pick_type(type_name)
    sample_type = delta_profile.sample_types[index]
    delta = function_stats(build_table(delta_profile, index, lines=lines))
    before = function_stats(build_table(base, base.type_index(sample_type.type), lines=lines))
    changes = _changes(_by_frame(before, by, lines), _by_frame(delta, by, lines))
    grew = sorted((c for c in changes if c.delta > 0), key=lambda c: -c.delta)
    shrank = sorted((c for c in changes if c.delta < 0), key=lambda c: c.delta)
    return Comparison(
        type=sample_type.type,
        unit=sample_type.unit,
        by=by,
        base_total=before.grand_total,
        new_total=before.grand_total + delta.grand_total,
        grew=grew[:limit],
        shrank=shrank[:limit],
        changed=len(changes),
        aligned=tuple(sorted(files.items())),
    )


def _by_frame(stats: FunctionStats, by: str, lines: bool) -> dict[tuple[object, ...], tuple[Frame, int]]:
    """Values by function and, when bars are lines, by line.

    Keyed by function rather than by frame: the two profiles may show a
    function at different first lines.
    """
    values = stats.self if by == "self" else stats.total
    out: dict[tuple[object, ...], tuple[Frame, int]] = {}
    for code in stats.ranked(by):
        frame = stats.frame(int(code))
        key = (*function_key(frame), frame.line if lines else None)
        out[key] = (frame, int(values[code]))
    return out


def _changes(
    base: dict[tuple[object, ...], tuple[Frame, int]], delta: dict[tuple[object, ...], tuple[Frame, int]]
) -> list[Change]:
    out = []
    for key, (frame, d) in delta.items():
        before = base.get(key, (frame, 0))[1]
        after = before + d
        if not before:
            status = NEW
        elif not after:
            status = VANISHED
        else:
            status = GREW if d > 0 else SHRANK
        out.append(Change(frame, before, after, status))
    return out
