"""A small event history as a recorder would log it: three sites, six events (tests of model/history.py and pprof)."""

from __future__ import annotations

from gpuflame.model import Frame, Profile
from gpuflame.model.history import EventLog, History
from gpuflame.model.sample_types import memory_sample_types

T0 = 1_800_000_000_000_000_000
S = 1_000_000_000
FRAMES = [Frame("load_model", "m.py", 3), Frame("alloc_kv", "m.py", 9), Frame("step", "m.py", 20)]
SITES = [((0,), (("device", "cpu"),)), ((1, 0), (("device", "cpu"),)), ((2,), (("device", "cpu"),))]
EVENTS = [(1 * S, 0, 1000), (2 * S, 1, 400), (3 * S, 2, 50), (4 * S, 2, -50), (5 * S, 2, 70), (6 * S, 1, -400)]


def profile_of(
    events: list[tuple[int, int, int]], limit: int = 1000, pid: str = "1", end: int = 10 * S, start: int = 0
) -> Profile:
    """A profile whose history holds *events* (seconds-from-T0 ns, site, +-bytes), as a recorder would log them."""
    log = EventLog(T0 + start, limit)
    for t, site, size in events:
        log.add(T0 + t, site, size)
    track = log.track(T0 + end, (("pid", pid),))
    if not track.folded:
        track.fold = track.start
    p = Profile(memory_sample_types())
    p.time_nanos = T0 + start
    p.history = History(list(FRAMES), list(SITES), [track])
    return p
