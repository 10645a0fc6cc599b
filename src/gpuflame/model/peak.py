"""What a profile's peak is: a moment that happened, or a bound, and of what.

A process's own peak is exact: the blocks live at its highest total. Put
several processes (or several recording windows) together and "the peak"
can mean very different things; summing each one's peak gives a number that
never happened (a parent holding 4 MB and two children of 2 MB run one after
the other never held 8 MB). So every profile says, per device, what its
``peak_*`` values are, as a list of :class:`PeakUnit`:

- ``process``: one process's own highest total (exact);
- ``joint``: the highest total of the processes that shared a device, at
  one moment on a clock they shared, with what each held then (exact; the
  capture side keeps a small shared table per run and device for it);
- ``max``: the highest of recording windows that did not overlap in time
  (exact: they never held memory at once);
- ``partial``: a joint peak some of whose processes left no profile (killed,
  lost at exit): the total they held together is known, and what the
  profiles there held at that moment, not the rest;
- ``sampled``: the largest of a few samples (JAX): the true peak may be higher;
- ``upper-bound``: each window's own peak summed, windows that overlapped in
  time with no common clock: a bound, not a moment.

pprof has no field for it, so the units ride as ONE ``comment`` line,
:data:`PREFIX` followed by compact JSON, which gpuflame's reader takes back
out of the comments (as the timeline's). A damaged one is dropped with a note.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace

from gpuflame.defaults import MIN_INTERVAL_S
from gpuflame.model import comments as comment_data
from gpuflame.units import format_bytes

PREFIX = "gpuflame-peak-v1:"
DAMAGED_NOTE = "the description of this profile's peak is damaged and was left out"

PROCESS = "process"
JOINT = "joint"
MAX = "max"
SAMPLED = "sampled"
BOUND = "upper-bound"
PARTIAL = "partial"
KINDS = (PROCESS, JOINT, MAX, SAMPLED, BOUND, PARTIAL)
EXACT = (PROCESS, JOINT, MAX)

# per-process files of a run: what was live in the process at the run's joint
# peak (as far as it knew); ``gpuflame run`` turns them into peak_* and drops them
JOINT_SPACE = "joint_peak_space"
JOINT_OBJECTS = "joint_peak_objects"

_MAX_UNITS = 4096


@dataclass(frozen=True)
class PeakUnit:
    """What the ``peak_*`` values of one device are."""

    device: str
    kind: str = PROCESS
    start: int = 0  # recording window, epoch ns; 0 = unknown (then it overlaps everything)
    end: int = 0
    pid: str = ""  # the process of a ``process`` unit
    processes: int = 1  # processes (or windows) the number covers
    windows: int = 1  # non-overlapping windows it was the highest of (``max``)
    samples: int = 0  # ``sampled``: how many samples were taken
    table: str = ""  # a run's shared table (generation) this process published to
    epoch: int = 0  # the table's epoch at this process's joint mark
    table_max: int = 0  # the table's highest total at that epoch (``partial``: what all held together)
    why: str = ""  # why a merge could not be exact
    # a PyTorch snapshot's trace: the most the caching allocator reserved at any moment (0: unknown),
    # the live allocations then (their requested bytes) and when (epoch ns); not the peak's own moment
    reserved: int = 0
    reserved_allocated: int = 0
    reserved_at: int = 0

    def overlaps(self, other: PeakUnit) -> bool:
        """Whether the two windows may have held memory at once (unknown times may)."""
        if not (self.start and self.end and other.start and other.end):
            return True
        return self.start < other.end and other.start < self.end

    def describe(self, only_pid: str = "") -> str:
        """One line that says what the number is, in plain words (*only_pid*: one process's part shown)."""
        text = self._what(only_pid)
        return f"{text}; {self.why}" if self.why else text

    def _what(self, only_pid: str) -> str:
        on = f" on {self.device}" if self.device else ""
        if self.kind == JOINT and only_pid:
            return (
                f"pid {only_pid}'s share of one moment: the highest total of the {self.processes} "
                f"processes{on} together"
            )
        if self.kind == JOINT:
            return (
                f"live at one moment: the highest total of the {self.processes} processes{on} together, "
                "each process's share at that moment"
            )
        if self.kind == PARTIAL:
            shown = (
                "the 1 profile here shows what its process held then"
                if self.processes == 1
                else f"the {self.processes} profiles here show what each held then"
            )
            return (
                f"part of one moment: the run's processes{on} held {_size(self.table_max)} together at their "
                f"highest total; {shown}, and the rest "
                "was in processes whose profile is missing (not given, killed, or lost at exit)"
            )
        if self.kind == MAX:
            return (
                f"the highest of {self.windows} recording windows{on} that did not overlap in time, "
                "live at its highest total"
            )
        if self.kind == SAMPLED:
            return (
                f"the largest total of {self.samples} samples of live buffers{on}: the true peak may be "
                "higher (gpuflame run --interval samples more often)"
            )
        if self.kind == BOUND and self.samples:
            return (
                f"sum of each process's own peak{on} ({self.processes} processes or recording windows "
                "that overlapped in time, each at its own moment, some the largest of a few samples): "
                "not a moment that happened, and the true peak may be higher or lower"
            )
        if self.kind == BOUND:
            return (
                f"sum of each process's own peak{on} ({self.processes} processes or recording windows "
                "that overlapped in time, each at its own moment): an upper bound, not a moment that happened"
            )
        who = f" of pid {self.pid}" if self.pid else ""
        return f"live at the moment of the highest total{who}{on}"

    def to_json(self) -> dict[str, object]:
        defaults = PeakUnit("")
        return {k: v for k, v in asdict(self).items() if k == "device" or v != getattr(defaults, k)}


def _size(n: int) -> str:
    return f"{format_bytes(n)} ({n:,} B)"


def describe(units: Sequence[PeakUnit], only_pid: str = "") -> str:
    """What the peak of a profile is, in one line (*only_pid*: the samples shown are one process's)."""
    return "; ".join(u.describe(only_pid) for u in units)


def is_joint(units: Sequence[PeakUnit]) -> bool:
    """Whether the processes' shares are of one moment they held together (a joint peak, or part of one)."""
    return any(u.kind in (JOINT, PARTIAL) for u in units)


def is_exact(units: Sequence[PeakUnit]) -> bool:
    return all(u.kind in EXACT for u in units)


def run_note(units: Sequence[PeakUnit], interval_s: float = 0.0) -> str:
    """One line for the end of ``gpuflame run`` when its peak is not a moment that happened; '' when it is.

    *interval_s*: the run's ``--interval`` (0: none); at the shortest there is, the way to sample more
    often is a phase mark where the memory peaks, not that interval again.
    """
    sampled = [u for u in units if u.kind == SAMPLED]
    if sampled:
        fewest = min(u.samples for u in sampled)
        more = (
            "gpuflame.phase(...) around the step that peaks samples at its start and end"
            if 0 < interval_s <= MIN_INTERVAL_S
            else f"--interval {MIN_INTERVAL_S * 1000:g}ms samples more often"
        )
        return f"the JAX peak is the largest of {fewest} samples of live buffers: the true peak may be higher; {more}"
    if not is_exact(units):
        return "the peak is " + describe([u for u in units if u.kind not in EXACT])
    return ""


def to_comment(units: Sequence[PeakUnit]) -> str:
    """The pprof comment that stores *units*: readable text first, for other pprof tools."""
    payload = {"text": describe(units), "units": [u.to_json() for u in units]}
    return PREFIX + json.dumps(payload, separators=(",", ":"), ensure_ascii=False)


def from_comment(comment: str) -> list[PeakUnit]:
    """Parse one peak comment; ValueError when it is damaged (it is untrusted input)."""
    try:
        payload = json.loads(comment[len(PREFIX) :])
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"damaged peak description: {exc}") from None
    raw = payload.get("units") if isinstance(payload, dict) else None
    if not isinstance(raw, list) or len(raw) > _MAX_UNITS:
        raise ValueError("damaged peak description: no list of units")
    kinds = {f.name: type(getattr(PeakUnit(""), f.name)) for f in fields(PeakUnit)}
    units = []
    for entry in raw:
        if not isinstance(entry, dict) or not isinstance(entry.get("device"), str):
            raise ValueError("damaged peak description: a unit has no device")
        values = {}
        for key, value in entry.items():
            if key in kinds and type(value) is kinds[key] and (type(value) is not int or value >= 0):
                values[key] = value
        unit = PeakUnit(**values)
        if unit.kind not in KINDS:
            raise ValueError(f"damaged peak description: unknown kind {unit.kind!r}")
        units.append(unit)
    return units


def split_comments(comments: Sequence[str]) -> tuple[list[PeakUnit], list[str]]:
    """The peak units stored in *comments* (the last such comment's), and the other comments in order."""
    found, rest = comment_data.split_comments(comments, PREFIX, from_comment, DAMAGED_NOTE)
    return (found[-1] if found else []), rest


def with_why(unit: PeakUnit, why: str) -> PeakUnit:
    return replace(unit, why=why)
