"""The front of simulate/: read an input's allocation history, replay it per device, try other settings."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from gpuflame.errors import GpuflameError, ProfileFormatError
from gpuflame.files import read_bytes
from gpuflame.formats import safe_pickle
from gpuflame.formats.load_save import detect, loads
from gpuflame.model.history import History
from gpuflame.model.phases import PhaseStat
from gpuflame.simulate import snapshot as snapshots
from gpuflame.simulate.allocator import Allocator
from gpuflame.simulate.history import HistoryReplay, groups
from gpuflame.simulate.outcome import Outcome, Sites
from gpuflame.simulate.settings import DEFAULTS, Settings, from_recorded, parse_alloc_conf

NO_HISTORY = (
    "{source} has no allocation history to replay (a PyTorch snapshot needs a trace: "
    "torch.cuda.memory._record_memory_history before the run; a gpuflame profile needs its event history)"
)
NOT_RECORDED = "the snapshot does not record its allocator settings: PyTorch's defaults assumed"


@dataclass
class Input:
    """A snapshot dict or a profile's history, and the settings it was recorded under."""

    source: str
    snapshot: dict[str, Any] | None = None
    history: History | None = None
    phases: list[PhaseStat] = field(default_factory=list)
    recorded: Settings = DEFAULTS
    notes: list[str] = field(default_factory=list)


def read_input(path: str) -> Input:
    """Read *path*; bad input (no history) raises GpuflameError."""
    data = read_bytes(path)
    if detect(data) == "torch-snapshot":
        snap = snapshots.read(data)
        with _untrusted(path):
            devices = snapshots.traced_devices(snap)
        if not devices:
            raise GpuflameError(NO_HISTORY.format(source=path))
        recorded = from_recorded(snap.get("allocator_settings"))
        return Input(path, snapshot=snap, recorded=recorded or DEFAULTS, notes=[] if recorded else [NOT_RECORDED])
    profile = loads(data, source=path)
    history = profile.history
    if history is None or not any(len(t.times) or t.base for t in history.tracks):
        raise GpuflameError(NO_HISTORY.format(source=path))
    return Input(path, history=history, phases=profile.phases)


def settings_for(inp: Input, alloc_conf: str | None) -> Settings:
    """--alloc-conf over the recorded settings (keys it does not name keep their recorded value)."""
    return parse_alloc_conf(alloc_conf, inp.recorded) if alloc_conf else inp.recorded


class Run:
    """One replay of every device of an input."""

    def __init__(self, inp: Input, settings: Settings, capacity: int | None = None, device: str | None = None) -> None:
        self.inp, self.settings, self.capacity, self.device = inp, settings, capacity, device
        self.recorded = settings == inp.recorded

    def replays(self) -> list[Any]:
        inp = self.inp
        if inp.snapshot is not None:
            devices = snapshots.traced_devices(inp.snapshot)
            if self.device is not None:
                devices = [d for d in devices if f"cuda:{d}" == self.device]
            sites = Sites()
            return [
                snapshots.DeviceReplay(inp.snapshot, d, self.settings, self.recorded, self.capacity, sites)
                for d in devices
            ]
        assert inp.history is not None
        return [
            HistoryReplay(inp.history, g, self.settings, self.capacity, inp.phases)
            for g in groups(inp.history, self.device)
        ]

    def outcomes(self) -> list[Outcome]:
        with _untrusted(self.inp.source):
            replays = self.replays()
            if not replays:
                raise GpuflameError(f"{self.inp.source} has no allocation history on {self.device}")
            out = []
            for r in replays:
                _, o = r.run()
                o.notes[:0] = self.inp.notes
                out.append(o)
            return out

    def at_peaks(self) -> list[tuple[Allocator, Outcome, Sites]]:
        """Each device's allocator as it stood at its simulated reserved peak (a second replay up to it)."""
        found = []
        with _untrusted(self.inp.source):
            for r in self.replays():
                _, o = r.run()
                sim, _ = r.run(stop_at=o.peak_event)
                found.append((sim, o, r.sites))
        return found


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


# what --suggest tries, each over the recorded settings
CANDIDATES = (
    "expandable_segments:True",
    "max_split_size_mb:128",
    "max_split_size_mb:512",
    "roundup_power2_divisions:4",
    "roundup_power2_divisions:8",
    "garbage_collection_threshold:0.6",
)


def suggest(inp: Input, capacity: int | None, device: str | None) -> list[tuple[str, list[Outcome]]]:
    """Each candidate setting and its outcomes (garbage collection only acts where a capacity is known)."""
    out = []
    for conf in CANDIDATES:
        settings = parse_alloc_conf(conf, inp.recorded)
        if settings == inp.recorded:
            continue
        out.append((conf, Run(inp, settings, capacity, device).outcomes()))
    return out
