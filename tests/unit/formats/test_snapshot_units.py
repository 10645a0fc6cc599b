"""One unit for every view of a snapshot: properties over random allocator histories.

The snapshots are HAND-WRITTEN STAND-INS: random workloads run through the
caching-allocator simulation of tests/fixtures/make_snapshots.py (512-byte
rounding, 2 MiB segments, a ring buffer that may drop the oldest events,
frees left pending on another stream, ``empty_cache``). For every one:
peak >= in use and alloc >= peak - (bytes live before the trace), in the
bytes the allocations asked for, and in use + rounding + cached = reserved.
The real snapshots of tests/data are checked for the same.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpuflame.formats import torch_snapshot
from gpuflame.model import Profile
from gpuflame.symbols.names import ALLOCATOR_ROUNDING, CACHED_FREE
from tests.helpers.paths import DATA

make_snapshots = pytest.importorskip("tests.fixtures.make_snapshots")  # needs torch (a test dependency)

RESERVE = (CACHED_FREE, ALLOCATOR_ROUNDING)  # what the allocator holds beyond the allocations


class RecordedDevice(make_snapshots.Device):
    """The simulated allocator, also keeping every event the ring buffer drops."""

    def __init__(self, max_entries: int | None, seed: int) -> None:
        super().__init__(0, max_entries=max_entries, seed=seed)
        self.every_event: list[dict[str, Any]] = []

    def _record(self, action: str, addr: int, size: int, frames: Any) -> None:
        super()._record(action, addr, size, frames)
        self.every_event.append(self.trace[-1])

    def live_before_trace(self) -> int:
        """Requested bytes alive when the kept trace begins, from the full history."""
        dropped = self.every_event[: len(self.every_event) - len(self.trace)]
        live: dict[int, int] = {}
        for e in dropped:
            if e["action"] == "alloc":
                live[e["addr"]] = e["size"]
            elif e["action"] == "free_completed":
                live.pop(e["addr"], None)
        return sum(live.values())


def split(profile: Profile, type_name: str) -> tuple[int, int]:
    """(live allocations, the allocator's reserve) of one view."""
    i = profile.type_index(type_name)
    live = reserve = 0
    for s in profile.samples:
        if profile.frames[s.stack[0]].name in RESERVE:
            reserve += s.values[i]
        else:
            live += s.values[i]
    return live, reserve


STACKS = None


def stacks() -> list[list[dict[str, Any]]]:
    global STACKS
    if STACKS is None:
        s = make_snapshots.Stacks()
        STACKS = [s.attn_q, s.mlp_gate, s.kv_cache, make_snapshots.backward_thread_frames()]
    return STACKS


ops = st.lists(
    st.tuples(
        st.sampled_from(["alloc", "alloc", "alloc", "free", "pending", "empty_cache"]),
        st.integers(1, 3 << 20),
        st.integers(0, 3),
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops, ring=st.one_of(st.none(), st.integers(5, 80)), seed=st.integers(0, 10))
# found by this test: the ring lost the first alloc, whose free is only requested (pending) at the end; the
# replay takes that request as the free, and the block was counted at the peak twice (before the trace, and alive)
@example(ops=[("alloc", 1, 0)] * 5 + [("pending", 1, 0)], ring=5, seed=0)
def test_peak_is_at_least_in_use_in_one_unit(ops, ring, seed) -> None:
    dev = RecordedDevice(ring, seed)
    live: list[int] = []
    for action, size, which in ops:
        if action == "alloc":
            live.append(dev.malloc(size, stacks()[which]))
        elif action in ("free", "pending") and live:
            dev.free(live.pop(which % len(live)), pending=action == "pending")
        elif action == "empty_cache":
            dev.empty_cache()
    snap = make_snapshots.snapshot([dev])
    if not snap["device_traces"][0]:
        return
    profile = torch_snapshot.from_snapshot(snap)
    reserved = sum(seg["total_size"] for seg in snap["segments"])
    inuse_live, inuse_reserve = split(profile, "inuse_space")
    peak_live, _ = split(profile, "peak_space")
    alloc = split(profile, "alloc_space")[0]
    asked = sum(b["requested_size"] for seg in snap["segments"] for b in seg["blocks"] if b["state"] != "inactive")
    assert inuse_live == asked  # in use counts what was asked for
    assert inuse_live + inuse_reserve == reserved  # + rounding + cached = reserved
    assert peak_live >= inuse_live
    assert alloc >= peak_live - dev.live_before_trace()


@pytest.mark.parametrize("path", sorted(DATA.glob("torch-snapshot-*.pickle.gz")), ids=lambda p: p.name)
def test_real_snapshots_keep_the_same_properties(path: Path) -> None:
    data = path.read_bytes()
    profile = torch_snapshot.decode(data)
    snap = torch_snapshot.safe_pickle.loads(torch_snapshot.gunzip(data))
    reserved = sum(seg["total_size"] for seg in snap["segments"])
    inuse_live, inuse_reserve = split(profile, "inuse_space")
    peak_live, _ = split(profile, "peak_space")
    assert inuse_live + inuse_reserve == reserved
    assert peak_live >= inuse_live
    rounding = sum(
        b["size"] - b["requested_size"] for seg in snap["segments"] for b in seg["blocks"] if b["state"] != "inactive"
    )
    i = profile.type_index("inuse_space")
    shown = sum(s.values[i] for s in profile.samples if profile.frames[s.stack[0]].name == ALLOCATOR_ROUNDING)
    assert shown == rounding > 0
    assert torch_snapshot.UNITS_NOTE in profile.comments


def test_a_replay_below_the_end_state_takes_the_end_as_the_peak() -> None:
    """No free_completed events (frees count when requested) but a free still pending at the end."""
    frames = [{"filename": __file__, "line": 1, "name": "f"}]

    def event(action: str, t: int, addr: int) -> dict[str, Any]:
        return {"action": action, "addr": addr, "size": 100, "stream": 0, "time_us": t, "frames": frames}

    blocks = [
        {"address": 0, "size": 512, "requested_size": 100, "state": "active_pending_free", "frames": frames},
        {"address": 512, "size": 512, "requested_size": 100, "state": "active_allocated", "frames": frames},
        {"address": 1024, "size": 1024, "requested_size": 0, "state": "inactive", "frames": []},
    ]
    snap = {
        "segments": [{"device": 0, "address": 0, "total_size": 2048, "blocks": blocks}],
        "device_traces": [[event("alloc", 1, 0), event("free_requested", 2, 0), event("alloc", 3, 512)]],
    }
    profile = torch_snapshot.from_snapshot(snap)
    assert split(profile, "peak_space") == (200, 2048 - 200) == split(profile, "inuse_space")
    assert any("peak_* is that end state" in c for c in profile.comments)
