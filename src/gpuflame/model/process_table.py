"""One row per process of a profile: who it was, its own peak and when, what it held at the joint peak.

A merged run's ``peak_*`` values are what each process held at the run's
joint peak (``model/merge.py``); each process's own highest total and its
moment come from its description (``model/processes.py``). ``report``
shows one table per process, sorted by rank, and how uneven the ranks were
(the largest own peak over the smallest); ``gpuflame run`` says the same in
a line per process. Data only: the words are ``render/``'s (and the
launcher's, which imports no analysis and no rich: this module is the
model's so that ``gpuflame run`` reads it too).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuflame.model.categories import LABEL as CATEGORY
from gpuflame.model.moment import origin
from gpuflame.model.processes import ProcessInfo
from gpuflame.model.profile import Profile

PEAK = "peak_space"


@dataclass
class ProcessRow:
    """One process: :class:`ProcessInfo` (what it said of itself) and what the profile holds of it."""

    info: ProcessInfo
    at_joint_peak: int = 0  # what it held at the profile's peak (the run's joint peak when merged)
    by_category: list[tuple[str, int]] = field(default_factory=list)  # the same, per category, largest first
    peak_s: float | None = None  # its own peak, seconds into the strip (None: not known)
    # "": the two fields above are at the peak; else a moment's (--at, --between) type, inuse_space or
    # alloc_space, and they are what it held then or allocated in the window
    moment: str = ""

    @property
    def name(self) -> str:
        """``rank 1`` where known, else ``pid 2608``."""
        return f"rank {self.info.rank}" if self.info.rank else f"pid {self.info.pid}"

    def to_dict(self) -> dict[str, object]:
        i = self.info
        return {
            "pid": _number(i.pid),
            "rank": int(i.rank) if i.rank else None,
            "local_rank": int(i.local_rank) if i.local_rank else None,
            "world_size": int(i.world_size) if i.world_size else None,
            "command": list(i.argv),
            "devices": list(i.devices),
            "peak": i.peak or None,
            "peak_ns": i.peak_ns or None,
            "peak_s": self.peak_s,
            **(
                {"at_moment": self.at_joint_peak, "at_moment_by_category": dict(self.by_category)}
                if self.moment
                else {"at_joint_peak": self.at_joint_peak, "at_joint_peak_by_category": dict(self.by_category)}
            ),
        }


@dataclass(frozen=True)
class Uneven:
    """How uneven the ranks were: the largest own peak over the smallest."""

    largest: ProcessRow
    smallest: ProcessRow
    of: str  # "ranks": what was compared (JSON's "of")

    @property
    def ratio(self) -> float:
        return self.largest.info.peak / self.smallest.info.peak

    def to_dict(self) -> dict[str, object]:
        return {
            "of": self.of,
            "ratio": round(self.ratio, 4),
            "largest": _who(self.largest),
            "smallest": _who(self.smallest),
        }


def spread_word(ratio: float) -> str:
    """'uneven', or 'even' where the ratio reads 1.00x: two equal peaks were called 'uneven ... 1.00x'."""
    return "even" if f"{ratio:.2f}" == "1.00" else "uneven"


def _who(row: ProcessRow) -> dict[str, object]:
    return {"pid": _number(row.info.pid), "rank": int(row.info.rank) if row.info.rank else None, "peak": row.info.peak}


def _number(pid: str) -> int | str:
    """A pid as a number; another tool's file may label its samples with any text."""
    return int(pid) if pid.isascii() and pid.isdigit() else pid


def process_rows(profile: Profile) -> list[ProcessRow]:
    """A row per process with samples in *profile* (a filtered view keeps only its own), by rank then pid.

    A process that did not describe itself (another tool's file, gpuflame's
    before it did) still gets a row: its pid, and what it held at the peak.
    """
    described = {i.pid: i for i in profile.processes}
    held: dict[str, dict[str, int]] = {}
    shown = _shown_type(profile)
    index = profile.type_index(shown) if shown else -1
    for row in profile.label_set_totals():
        labels = dict(row.labels)
        pid = labels.get("pid")
        if not pid:
            continue
        cats = held.setdefault(pid, {})
        if index >= 0 and row.totals[index]:
            name = labels.get(CATEGORY, "")
            cats[name] = cats.get(name, 0) + row.totals[index]
    zero = origin(profile)
    rows = []
    for pid, cats in held.items():
        info = described.get(pid) or ProcessInfo(pid)
        when = (info.peak_ns - zero) / 1e9 if info.peak_ns and zero and info.peak_ns >= zero else None
        by_category = sorted(((k or "(none)", v) for k, v in cats.items()), key=lambda kv: (-kv[1], kv[0]))
        rows.append(ProcessRow(info, sum(cats.values()), by_category, when, "" if shown == PEAK else shown))
    return sorted(rows, key=lambda r: r.info.sort_key())


def _shown_type(profile: Profile) -> str:
    """peak_space; a moment's own bytes type where the profile is one (it has no peak: each row read 0 B)."""
    names = profile.type_names()
    if PEAK in names:
        return PEAK
    if profile.moment:
        return next((t for t in ("inuse_space", "alloc_space") if t in names), "")
    return ""


def uneven(rows: list[ProcessRow]) -> Uneven | None:
    """The largest own peak over the smallest, of the ranks; None under two ranks with a peak.

    Only ranks are compared: processes without one are a program's helpers (a DataLoader's
    workers beside their main process: '6183.86x' said nothing), not peers of one job.
    """
    by_rank: dict[str, ProcessRow] = {}
    for r in rows:  # a rank's other processes (DataLoader workers inherit RANK): its largest stands for it
        if not (r.info.rank and r.info.peak):
            continue
        held = by_rank.get(r.info.rank)
        if held is None or r.info.peak > held.info.peak:
            by_rank[r.info.rank] = r
    if len(by_rank) < 2:
        return None
    # one sort, not max() and min(): where every peak is equal those both return the first row, and the
    # line named one process twice ('pid 5697 peaked at 1.00 MiB, pid 5697 at 1.00 MiB')
    ordered = sorted(by_rank.values(), key=lambda r: r.info.peak)
    return Uneven(ordered[-1], ordered[0], "ranks")
