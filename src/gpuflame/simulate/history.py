"""Replay a gpuflame profile's event history through the allocator model.

A history (model/history.py) holds, per recording window, each allocation
(+bytes) and free (-bytes) with its stack, but no addresses and no streams:
every request goes on the default stream, a free completes at once, and a
free is matched to the latest live allocation of its stack with the same
size (else the latest of its stack). Each recording window (a process) and
device has its own allocator. The folded part of a long history (its
``base``) is replayed as that many equal allocations at the start.

A run recorded on the CPU (the ``torch`` backend's allocator hook or
dispatch mode) is replayed as if on ``cuda:0``: the prediction says so,
since a CPU run's operators may allocate differently than CUDA kernels do
(cuBLAS and cuDNN workspaces, fused attention kernels, other temporaries).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from gpuflame.model.history import History, Track
from gpuflame.model.phases import NONE as NO_PHASE
from gpuflame.model.phases import PhaseStat
from gpuflame.simulate.allocator import Allocator
from gpuflame.simulate.blocks import Block
from gpuflame.simulate.outcome import Outcome, Sites
from gpuflame.simulate.settings import Settings

CPU_NOTE = (
    "recorded on the CPU: a CPU run's operators may allocate differently than CUDA kernels "
    "(cuBLAS/cuDNN workspaces, attention kernels), so this is a prediction, not a replay"
)
FOLDED_NOTE = "the oldest {n} events were folded when recorded; their live blocks are replayed as equal allocations"
_MATCH_WINDOW = 64  # how far back a free looks for a live allocation of its exact size


@dataclass
class Group:
    """The events of one recording window on one device."""

    track: Track
    device: str  # the history's own label
    name: str  # as the answer shows it
    pid: str = ""
    rank: str = ""


def groups(history: History, device: str | None = None, ranks: Mapping[str, str] | None = None) -> list[Group]:
    """Each (track, device) with events; *device* keeps one (a CPU run answers as ``cuda:0``).

    Each process of a merged run is its own group, replayed on a device of
    its own, named ``cuda:N (pid P, rank R)`` (*ranks*: pid -> rank, where
    the processes said theirs).
    """
    out = []
    for n, track in enumerate(history.tracks):
        labels = {dict(history.sites[s][1]).get("device", "cpu") for s in set(track.sites) | set(track.base)}
        pid = dict(track.labels).get("pid", "")
        rank = (ranks or {}).get(pid, "")
        for label in sorted(labels):
            name = label if label.startswith("cuda") else "cuda:0"
            if len(history.tracks) > 1:
                who = f"pid {pid}" if pid else f"window {n + 1}"
                name += f" ({who}, rank {rank})" if rank else f" ({who})"
            if device is None or name.split(" ")[0] == device:
                out.append(Group(track, label, name, pid, rank))
    return out


class HistoryReplay:
    """One group's events through one allocator."""

    def __init__(
        self,
        history: History,
        group: Group,
        settings: Settings,
        capacity: int | None,
        phases: Sequence[PhaseStat] = (),
        fraction_limit: int | None = None,
    ) -> None:
        self.history, self.group, self.settings, self.capacity = history, group, settings, capacity
        self.fraction_limit = fraction_limit
        pid = dict(group.track.labels).get("pid")
        self.phases = [p for p in phases if p.phase != NO_PHASE and (not pid or not p.pid or p.pid == pid)]
        self.sites = Sites()
        self._site_ids: dict[int, int] = {}

    def _events(self) -> Iterator[tuple[int, int, int]]:
        """(index, history site, size) of this group's events, the folded base first (index -1)."""
        sites, track, label = self.history.sites, self.group.track, self.group.device
        mine = {s for s in set(track.sites) | set(track.base) if dict(sites[s][1]).get("device", "cpu") == label}
        for site, (size, count) in sorted(track.base.items()):
            if site in mine and count > 0 and size > 0:
                for _ in range(count):
                    yield -1, site, size // count
        for i, (site, size) in enumerate(zip(track.sites, track.sizes, strict=True)):
            if site in mine:
                yield i, site, size

    def _site(self, site: int) -> int:
        found = self._site_ids.get(site)
        if found is None:
            found = self._site_ids[site] = self.sites.add_frames(self.history.site_frames(site))
        return found

    def run(self, stop_at: int | None = None) -> tuple[Allocator, Outcome]:
        sim = Allocator(self.settings, self.capacity, fraction_limit=self.fraction_limit)
        out = Outcome(self.group.name, self.settings.describe(), pid=self.group.pid, rank=self.group.rank)
        if not self.group.device.startswith("cuda"):
            out.notes.append(CPU_NOTE)
        if self.group.track.folded:
            out.notes.append(FOLDED_NOTE.format(n=self.group.track.folded))
        live: dict[int, list[Block]] = {}
        peak_seen = (0, 0)
        for i, site, size in self._events():
            if stop_at is not None and i > stop_at:
                break
            if size > 0:
                b = sim.malloc(size, 0, self._site(site))
                if b is None:
                    out.oom = {
                        "event": i if i >= 0 else None,
                        "size": size,
                        "segment_size": sim.segment_for(size),
                        "stack": self.sites.root_first(self._site(site)),
                        "allocated": sim.allocated,
                        "cached": sim.reserved - sim.allocated,
                        "capacity": sim.capacity,
                        "phase": self._phase_at(self.group.track.times[i] if i >= 0 else 0),
                        "at_start": i < 0,  # the folded events before the history's window
                        "time_ns": self.group.track.times[i] if i >= 0 else None,
                    }
                    break
                out.allocations += 1
                live.setdefault(site, []).append(b)
            elif size < 0:
                b = _take(live.get(site), -size)
                if b is not None:
                    sim.free(b)
            out.over_time.add(
                self.group.track.times[i] if i >= 0 else self.group.track.fold, sim.reserved, sim.allocated
            )
            if (sim.reserved_peak, sim.allocated_at_reserved_peak) > peak_seen:
                peak_seen, out.peak_event = (sim.reserved_peak, sim.allocated_at_reserved_peak), i
        out.finish(sim, None, None)
        return sim, out

    def _phase_at(self, t: int) -> str | None:
        """The phase entered last whose span covers *t* (the table keeps each phase's first entry and last exit)."""
        covering = [p for p in self.phases if p.start <= t <= p.end]
        return max(covering, key=lambda p: p.start).phase if covering else None


def _take(blocks: list[Block] | None, size: int) -> Block | None:
    """The latest live block of a stack with *size* requested bytes (else its latest)."""
    if not blocks:
        return None
    for k in range(len(blocks) - 1, max(-1, len(blocks) - 1 - _MATCH_WINDOW), -1):
        if blocks[k].requested == size:
            return blocks.pop(k)
    return blocks.pop()
