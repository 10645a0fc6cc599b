"""The front of simulate/: read an input's allocation history, replay it per device, try other settings."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from gpuflame import limits
from gpuflame.errors import GpuflameError, ProfileFormatError
from gpuflame.files import read_bytes
from gpuflame.formats import safe_pickle
from gpuflame.formats.load_save import detect, loads
from gpuflame.model.history import History
from gpuflame.model.phases import PhaseStat
from gpuflame.simulate import snapshot as snapshots
from gpuflame.simulate.allocator import Allocator
from gpuflame.simulate.explain import breakdown, why
from gpuflame.simulate.gpus import CUDA_CONTEXT, MAX_DEVICE, STEP
from gpuflame.simulate.history import HistoryReplay, groups
from gpuflame.simulate.outcome import Outcome, Sites
from gpuflame.simulate.settings import DEFAULTS, Settings, from_recorded, parse_alloc_conf

NO_HISTORY = (
    "{source} has no allocation history to replay (a PyTorch snapshot needs a trace: "
    "torch.cuda.memory._record_memory_history before the run; a gpuflame profile needs its event history)"
)
NOT_RECORDED = "the snapshot does not record its allocator settings: PyTorch's defaults assumed"


SHORT_TRACE = (
    "{source}: the trace holds {n} and no allocation to replay "
    "(torch 2.0 keeps 1 entry by default: record with _record_memory_history(True, trace_alloc_max_entries=N) "
    "there, max_entries=N from torch 2.1, before the run)"
)


def _no_allocations(source: str, snap: dict[str, Any]) -> str:
    """Why a snapshot cannot be replayed: no trace at all, or a trace too short to hold an allocation."""
    traces = snap.get("device_traces")
    n = sum(len(t) for t in traces if isinstance(t, list)) if isinstance(traces, list) else 0
    if not n:
        return NO_HISTORY.format(source=source)
    return SHORT_TRACE.format(source=source, n="1 entry" if n == 1 else f"{n:,} entries")


@dataclass
class Input:
    """A snapshot dict or a profile's history, and the settings it was recorded under."""

    source: str
    snapshot: dict[str, Any] | None = None
    history: History | None = None
    phases: list[PhaseStat] = field(default_factory=list)
    recorded: Settings = DEFAULTS
    notes: list[str] = field(default_factory=list)
    ranks: dict[str, str] = field(default_factory=dict)  # pid -> rank, from a merged run's processes


def read_input(path: str) -> Input:
    """Read *path*; bad input (no history) raises GpuflameError."""
    data = read_bytes(path, limits.INFLATED_BYTES)
    if detect(data) == "torch-snapshot":
        snap = snapshots.read(data)
        with _untrusted(path):
            devices = snapshots.traced_devices(snap)
        if not devices:
            raise GpuflameError(_no_allocations(path, snap))
        recorded = from_recorded(snap.get("allocator_settings"))
        return Input(path, snapshot=snap, recorded=recorded or DEFAULTS, notes=[] if recorded else [NOT_RECORDED])
    profile = loads(data, source=path)
    history = profile.history
    if history is None or not any(len(t.times) or t.base for t in history.tracks):
        raise GpuflameError(NO_HISTORY.format(source=path))
    ranks = {p.pid: p.rank for p in profile.processes if p.rank}
    return Input(path, history=history, phases=profile.phases, ranks=ranks)


def settings_for(inp: Input, alloc_conf: str | None) -> Settings:
    """--alloc-conf over the recorded settings (keys it does not name keep their recorded value)."""
    return parse_alloc_conf(alloc_conf, inp.recorded) if alloc_conf else inp.recorded


class Run:
    """One replay of every device of an input."""

    def __init__(
        self,
        inp: Input,
        settings: Settings,
        capacity: int | None = None,
        device: str | None = None,
        fraction_limit: int | None = None,
    ) -> None:
        self.inp, self.settings, self.capacity, self.device = inp, settings, capacity, device
        self.fraction_limit = fraction_limit  # set_per_process_memory_fraction's bytes: the garbage collector acts
        self.recorded = settings == inp.recorded

    def replays(self) -> list[Any]:
        inp = self.inp
        if inp.snapshot is not None:
            devices = snapshots.traced_devices(inp.snapshot)
            if self.device is not None:
                devices = [d for d in devices if f"cuda:{d}" == self.device]
            sites = Sites()
            return [
                snapshots.DeviceReplay(
                    inp.snapshot, d, self.settings, self.recorded, self.capacity, sites, self.fraction_limit
                )
                for d in devices
            ]
        assert inp.history is not None
        return [
            HistoryReplay(inp.history, g, self.settings, self.capacity, inp.phases, self.fraction_limit)
            for g in groups(inp.history, self.device, inp.ranks)
        ]

    def outcomes(self) -> list[Outcome]:
        with _untrusted(self.inp.source):
            replays = self.replays()
            if not replays:
                raise GpuflameError(f"{self.inp.source} has no allocation history on {self.device}")
            out = []
            for r in replays:
                _, o = r.run()
                if not (o.oom and o.oom["at_start"]):
                    at_peak, _ = r.run(stop_at=o.peak_event)  # the allocator as it stood at its reserved peak
                    o.at_reserved_peak = breakdown(at_peak)
                o.notes[:0] = self.inp.notes
                out.append(o)
            return out

    def smallest_devices(self, fraction: float | None = None) -> list[int | None]:
        """Per device (in outcomes' order), the smallest ``--gpu-memory`` (a multiple of 64 MiB) on which the
        replay does not run out of memory, found by bisection: it fits there and not 64 MiB below (None: no
        device up to 1 TiB fits). *fraction*: the program's set_per_process_memory_fraction."""
        with _untrusted(self.inp.source):
            return [_smallest(r, fraction) for r in self.replays()]

    def at_peaks(self) -> list[tuple[Allocator, Outcome, Sites]]:
        """Each device's allocator as it stood at its simulated reserved peak (a second replay up to it)."""
        found = []
        with _untrusted(self.inp.source):
            for r in self.replays():
                _, o = r.run()
                sim, _ = r.run(stop_at=o.peak_event)
                found.append((sim, o, r.sites))
        return found


def _fits(replay: Any, total: int, fraction: float | None) -> bool:
    """Whether *replay* runs without running out of memory on a device of *total* bytes."""
    replay.capacity = total - CUDA_CONTEXT
    replay.fraction_limit = None if fraction is None else int(fraction * total)
    _, out = replay.run()
    return out.oom is None


def _smallest(replay: Any, fraction: float | None) -> int | None:
    replay.capacity = replay.fraction_limit = None
    _, free = replay.run()  # no device limit: what it reserves when nothing ever fails
    need = free.simulated["reserved_peak"] / (fraction or 1.0)
    hi = max(-(-(int(need) + CUDA_CONTEXT) // STEP) * STEP, CUDA_CONTEXT + STEP)
    while not _fits(replay, hi, fraction):  # a collector or a release can make a larger device fail: look higher
        if hi >= MAX_DEVICE:
            return None
        hi = min(hi * 2, MAX_DEVICE)
    lo = CUDA_CONTEXT  # no device: the CUDA context takes it all
    while hi - lo > STEP:
        mid = lo + (hi - lo) // STEP // 2 * STEP
        if _fits(replay, mid, fraction):
            hi = mid
        else:
            lo = mid
    return hi


@contextmanager
def _untrusted(source: str) -> Iterator[None]:
    """A snapshot is untrusted input: a value of the wrong kind or a missing key is one line, not a traceback."""
    try:
        yield
    except GpuflameError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError, RecursionError) as exc:
        raise ProfileFormatError(
            f"{source}: not a valid PyTorch memory snapshot "
            f"({type(exc).__name__}: {safe_pickle.one_line(str(exc), 100)})"
        ) from None


# what --suggest tries, each over the recorded settings (the garbage collector: see Candidate)
CANDIDATES = (
    "expandable_segments:True",
    "max_split_size_mb:128",
    "max_split_size_mb:512",
    "roundup_power2_divisions:4",
    "roundup_power2_divisions:8",
)
GC_CANDIDATE = "garbage_collection_threshold:0.6"


@dataclass
class Candidate:
    """One setting tried: the change, the whole PYTORCH_CUDA_ALLOC_CONF to export, and any code it needs.

    The garbage collector runs only where the program set a memory
    fraction, so it is tried only on a known device size: under the
    user's ``--memory-fraction``, else under
    ``set_per_process_memory_fraction(1.0)``, a line of code the
    suggestion spells out.
    """

    change: str
    settings: Settings
    fraction_limit: int | None = None
    code: str | None = None
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def export(self) -> str:
        return f"export PYTORCH_CUDA_ALLOC_CONF={self.settings.describe()}"

    @property
    def advice(self) -> str:
        """The one change and how to make it."""
        how = f"`{self.export}`"
        if self.code:
            how += f" and call `{self.code}` in the program before its first CUDA allocation"
        return how


def candidates(inp: Input, capacity: int | None, fraction: float | None) -> list[Candidate]:
    """The settings --suggest tries: each acts on this run (the ones equal to the recorded settings are left out).

    Under the program's memory fraction (*fraction*) every one is replayed under that limit too.
    """
    total = None if capacity is None else capacity + CUDA_CONTEXT
    limit = None if total is None or fraction is None else int(fraction * total)
    out = []
    for conf in CANDIDATES:
        settings = parse_alloc_conf(conf, inp.recorded)
        if settings != inp.recorded:
            out.append(Candidate(conf, settings, limit))
    if total is None:
        return out  # no device size: no memory fraction, so no collector
    settings = parse_alloc_conf(GC_CANDIDATE, inp.recorded)
    if fraction is None:
        code = "torch.cuda.set_per_process_memory_fraction(1.0)"
        out.append(Candidate(f"{GC_CANDIDATE} with a memory fraction set", settings, total, code))
    elif settings != inp.recorded:  # (equal: the recorded threshold acts already, under the program's fraction)
        out.append(Candidate(GC_CANDIDATE, settings, limit))
    return out


def explain(outcomes: list[Outcome], base: list[Outcome], device_known: bool) -> None:
    """Each outcome's why, measured beside *base* (the same devices under the settings compared with)."""
    for o, b in zip(outcomes, base, strict=True):
        if o.simulated.get("reserved_peak") != b.simulated.get("reserved_peak"):
            o.why = why(o.at_reserved_peak, b.at_reserved_peak, device_known)


def suggest(inp: Input, capacity: int | None, device: str | None, fraction: float | None = None) -> list[Candidate]:
    """Each candidate setting with its outcomes."""
    tried = candidates(inp, capacity, fraction)
    for c in tried:
        run = Run(inp, c.settings, capacity, device, c.fraction_limit)
        c.outcomes = run.outcomes()
        gc_fraction = None if c.fraction_limit is None else (fraction or 1.0)
        for o, least in zip(c.outcomes, run.smallest_devices(gc_fraction), strict=True):
            o.min_gpu_memory, o.searched = least, True
    return tried
