"""From since-start snapshots to per-interval profiles, for continuous mode.

The recorders answer "since the process started": peak since start, in use
now, allocated since start. Pyroscope shows one profile per push, so each
push must say what happened *within its interval*:

- ``inuse_*``: what is live now (a point in time; nothing to subtract).
- ``alloc_*``: allocated since start now, minus the same at the previous push,
  per stack. Exact: those counters only grow.
- ``peak_*``: if the since-start peak grew during the interval, the peak
  happened within it and its breakdown is exact. If not, the interval's own
  peak is not known (the recorders keep only the highest one); the push then
  carries the larger of the in-use snapshots at the interval's two ends, a
  lower bound of the true interval peak, and a pprof comment says so.
"""

from __future__ import annotations

from gpuflame.model import Frame, Profile, select_types
from gpuflame.model.categories import LABEL as CATEGORY
from gpuflame.model.peak import JOINT_OBJECTS, JOINT_SPACE
from gpuflame.model.profile import Labels

Key = tuple[tuple[Frame, ...], Labels]

LOWER_BOUND_NOTE = (
    "gpuflame: peak_* in this interval is a lower bound (the larger in-use state at the interval's ends): "
    "the process's highest peak was earlier"
)


class IntervalWindow:
    """Turns consecutive since-start snapshots into the profiles of the intervals between them."""

    def __init__(self) -> None:
        self._rows: dict[Key, tuple[int, ...]] | None = None
        self._types: list[str] = []
        self._peak_total = 0
        self._end_ns = 0

    def next(self, snapshot: Profile) -> Profile:
        """The interval from the previous snapshot (or the start) to *snapshot*."""
        if JOINT_SPACE in snapshot.type_names():  # a run's bookkeeping between processes, not a view
            snapshot = select_types(
                snapshot, [t for t in snapshot.sample_types if t.type not in (JOINT_SPACE, JOINT_OBJECTS)]
            )
        rows = _rows(snapshot)
        names = snapshot.type_names()
        previous = self._rows if self._types == names else None
        out = snapshot.empty_like()
        out.timeline = out.history = None
        out.peaks = []  # the interval's peak is its own (see LOWER_BOUND_NOTE), not the process's
        out.comments = [c for c in out.comments if c != LOWER_BOUND_NOTE]
        peak_total = _total(rows, names, "peak_space")
        exact_peak = previous is None or peak_total > self._peak_total
        fallback = None if exact_peak else _larger_inuse(previous or {}, rows, names)
        for key, values in _interval_rows(rows, previous, names, fallback):
            out.add(list(key[0]), values, dict(key[1]))
        if not exact_peak and any(n.startswith("peak_") for n in names):
            out.comments.append(LOWER_BOUND_NOTE)
        end = snapshot.time_nanos + snapshot.duration_nanos
        if previous is not None and self._end_ns and end > self._end_ns:
            out.time_nanos, out.duration_nanos = self._end_ns, end - self._end_ns
        self._rows, self._types, self._peak_total, self._end_ns = rows, names, peak_total, end
        return out


def _rows(profile: Profile) -> dict[Key, tuple[int, ...]]:
    """Values per (frames, labels): frame ids differ between snapshots, frames do not."""
    out: dict[Key, list[int]] = {}
    for s in profile.samples:
        key = (tuple(profile.frames[i] for i in s.stack), s.labels)
        row = out.get(key)
        if row is None:
            out[key] = list(s.values)
        else:
            for i, v in enumerate(s.values):
                row[i] += v
    return {k: tuple(v) for k, v in out.items()}


def _total(rows: dict[Key, tuple[int, ...]], names: list[str], name: str) -> int:
    if name not in names:
        return 0
    i = names.index(name)
    return sum(r[i] for r in rows.values())


def _larger_inuse(
    before: dict[Key, tuple[int, ...]], now: dict[Key, tuple[int, ...]], names: list[str]
) -> dict[Key, tuple[int, ...]]:
    """The in-use state (at the interval's start or end) with more bytes."""
    return before if _total(before, names, "inuse_space") > _total(now, names, "inuse_space") else now


def _interval_rows(
    rows: dict[Key, tuple[int, ...]],
    previous: dict[Key, tuple[int, ...]] | None,
    names: list[str],
    peak_from: dict[Key, tuple[int, ...]] | None,
) -> list[tuple[Key, list[int]]]:
    """Per stack: in use as is, allocated as a difference, peak exact or from *peak_from*'s in-use."""
    alloc = [i for i, n in enumerate(names) if n.startswith("alloc_")]
    inuse = {n: i for i, n in enumerate(names)}
    pairs = [(i, "inuse_" + n.removeprefix("peak_")) for i, n in enumerate(names) if n.startswith("peak_")]
    peak = {i: inuse[twin] for i, twin in pairs if twin in inuse}
    out: dict[Key, list[int]] = {}
    allocated = _allocated_within(rows, previous or {}, alloc)
    for key, values in rows.items():
        row = list(values)
        for i in alloc:
            row[i] = allocated.get((key, i), 0)
        if peak_from is not None:
            for i in peak:
                row[i] = 0
        out[key] = row
    if peak_from is not None:
        for key, values in peak_from.items():
            row = out.setdefault(key, [0] * len(names))
            for i, j in peak.items():
                row[i] = values[j]
    return [(k, v) for k, v in out.items() if any(v)]


def _allocated_within(
    rows: dict[Key, tuple[int, ...]], previous: dict[Key, tuple[int, ...]], alloc: list[int]
) -> dict[tuple[Key, int], int]:
    """Each row's allocations within the interval, per ``alloc_*`` column: the rows' since-start counts
    minus the previous snapshot's, summing over the intervals to the since-start count exactly.

    A stack's count only grows, but its split by category does not: a block
    first counted as an activation may be a parameter at the next snapshot
    (the object graph names it), so its bytes leave one row and join
    another. Per row, a difference would push them twice (the row they join
    has nothing to subtract). So the difference is taken per stack and its
    other labels, all categories together, and shared among the rows that
    grew, the ones that grew most first.
    """
    groups: dict[Key, list[Key]] = {}
    for key in [*rows, *(k for k in previous if k not in rows)]:  # in order: ties share alike every run
        groups.setdefault((key[0], _without_category(key[1])), []).append(key)
    out: dict[tuple[Key, int], int] = {}
    for keys in groups.values():
        for i in alloc:
            grown = {k: rows[k][i] - (previous[k][i] if k in previous else 0) for k in keys if k in rows}
            total = sum(rows[k][i] for k in keys if k in rows) - sum(previous[k][i] for k in keys if k in previous)
            left = max(0, total)
            for k in sorted(grown, key=grown.__getitem__, reverse=True):
                share = min(max(0, grown[k]), left)
                out[k, i] = share
                left -= share
    return out


def _without_category(labels: Labels) -> Labels:
    return tuple(pair for pair in labels if pair[0] != CATEGORY)
