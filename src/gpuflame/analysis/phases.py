"""Peak per phase, in order: the profile's phase table (model/phases.py) as ``report`` shows it."""

from __future__ import annotations

from dataclasses import dataclass

from gpuflame.analysis.categories import CategoryTotal, sums_by
from gpuflame.model import moment
from gpuflame.model.phases import LABEL, NONE, PhaseStat, ordered
from gpuflame.model.profile import Profile


@dataclass(frozen=True)
class PhaseRow:
    """One phase of one process, its times as seconds on the viewer's strip (0: the first allocation)."""

    stat: PhaseStat
    start_s: float
    end_s: float
    peak_s: float | None  # None: the recorder does not know when (the dispatch recorder)
    rank: str = ""  # the process's rank, where it said one (model/processes.py)

    def to_dict(self) -> dict[str, object]:
        s = self.stat
        return {
            "phase": s.phase,
            "device": s.device,
            "pid": s.pid,
            "rank": int(self.rank) if self.rank else None,
            "start_s": self.start_s,
            "end_s": self.end_s,
            "peak": s.peak,
            "peak_s": self.peak_s,
            "inuse_end": s.inuse_end,
            "top_function": s.top,
            "top_bytes": s.top_bytes,
            "start_ns": s.start,
            "end_ns": s.end,
            "peak_time_ns": s.peak_time,
            # exact: every allocation seen (the torch backends); else the peak is the largest of
            # `samples` samples of live buffers (JAX), a lower bound
            "exact": not s.samples,
            "samples": s.samples,
        }


def phase_rows(profile: Profile) -> list[PhaseRow]:
    """Each phase in the order it began, time outside any phase (``<none>``, all its stretches in one row)
    last; empty when the recording marked none."""
    rows = _none_last(ordered(profile.phases))
    # the strip's clock, which --at/--between and the viewer read (not the session's start: torch's import
    # can lie between the two, and a phase shown at 2.1 s must be found at 2.1 s on the strip)
    origin = moment.origin(profile) or min((r.start for r in rows if r.start), default=0)

    def seconds(ns: int) -> float:
        return round(max(0, ns - origin) / 1e9, 6)

    ranks = {p.pid: p.rank for p in profile.processes}
    return [
        PhaseRow(
            r, seconds(r.start), seconds(r.end), seconds(r.peak_time) if r.peak_time else None, ranks.get(r.pid, "")
        )
        for r in rows
    ]


def phase_totals(profile: Profile, type_index: int) -> list[CategoryTotal]:
    """Bytes by the phase they were allocated in (the ``phase`` label), in the order the phases began."""
    if not profile.has_label(LABEL):
        return []
    began = {r.phase: i for i, r in enumerate(_none_last(ordered(profile.phases)))}
    return sums_by(profile, type_index, lambda s: s.label(LABEL) or NONE, lambda n: (began.get(n, len(began)), n))


def _none_last(rows: list[PhaseStat]) -> list[PhaseStat]:
    """``<none>`` gathers every unmarked stretch (before the first phase, between, after the last): its start
    says little about when its peak was, so it comes after the phases rather than first."""
    return sorted(rows, key=lambda r: r.phase == NONE)
