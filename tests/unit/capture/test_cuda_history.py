"""Peak and allocated over a whole run from a ring-buffered allocator trace.

The snapshots here are HAND-WRITTEN stand-ins for what
``torch.cuda.memory._snapshot()`` returns (no GPU where these tests run),
reduced to the keys gpuflame reads; their frames point at the functions
below, so the recovered names are checked too.
"""

from __future__ import annotations

import inspect
from typing import Any

from gpuflame.capture.recorders.torch_cuda.history import SnapshotHistory
from gpuflame.model import Profile


class Trainer:
    def load(self) -> None:
        pass  # stands for the line that allocates weights

    def step(self) -> None:
        pass  # stands for the line that allocates activations


def cache_blocks() -> None:
    pass  # stands for a module-level function allocating the KV cache


def frame(fn: Any) -> dict[str, Any]:
    lines, start = inspect.getsourcelines(fn)
    return {"filename": __file__, "line": start + 1, "name": fn.__name__}


S1, S2, S3 = [frame(Trainer.load)], [frame(Trainer.step)], [frame(cache_blocks)]


def event(action: str, t: int, addr: int, size: int, frames: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "action": action,
        "addr": addr,
        "size": size,
        "stream": 0,
        "time_us": t,
        "frames": frames,
        "compile_context": "",
        "user_metadata": "",
    }


def block(addr: int, size: int, state: str, frames: list[dict[str, Any]]) -> dict[str, Any]:
    return {"address": addr, "size": size, "requested_size": size, "state": state, "frames": frames}


def snapshot(blocks: list[dict[str, Any]], trace: list[dict[str, Any]]) -> dict[str, Any]:
    total = sum(b["size"] for b in blocks)
    active = sum(b["size"] for b in blocks if b["state"] != "inactive")
    segment = {
        "device": 0,
        "address": 0,
        "total_size": total,
        "allocated_size": active,
        "active_size": active,
        "requested_size": active,
        "stream": 0,
        "segment_type": "large",
        "segment_pool_id": (0, 0),
        "is_expandable": False,
        "frames": [],
        "blocks": blocks,
    }
    return {"segments": [segment], "device_traces": [trace], "allocator_settings": {}, "external_annotations": []}


# The run: weights A (100) and C (50) from Trainer.load, activations B (300)
# from Trainer.step, then cache D (20) and E (30). The ring buffer holds 4 events.
EVENTS = [
    event("alloc", 1, 0, 100, S1),
    event("alloc", 2, 100, 300, S2),
    event("free_completed", 3, 100, 300, S2),
    event("alloc", 4, 400, 50, S1),
    event("free_completed", 5, 0, 100, S1),
    event("alloc", 6, 0, 20, S3),
    event("alloc", 7, 20, 30, S3),
    event("free_completed", 8, 0, 20, S3),
]
FIRST = snapshot(
    [block(0, 100, "active_allocated", S1), block(100, 300, "inactive", []), block(400, 50, "active_allocated", S1)],
    EVENTS[:4],
)
SECOND = snapshot(
    [
        block(0, 20, "inactive", []),
        block(20, 30, "active_allocated", S3),
        block(50, 350, "inactive", []),
        block(400, 50, "active_allocated", S1),
    ],
    EVENTS[4:],
)


def by_leaf(profile: Profile, type_name: str) -> dict[str, int]:
    idx = profile.type_index(type_name)
    out: dict[str, int] = {}
    for s in profile.samples:
        name = profile.frames[s.stack[0]].name if s.stack else ""
        out[name] = out.get(name, 0) + s.values[idx]
    return {k: v for k, v in out.items() if v}


def test_allocated_sums_every_window_and_peak_is_the_highest_window() -> None:
    history = SnapshotHistory(max_entries=4)
    history.add(FIRST)
    run = history.add(SECOND)
    assert by_leaf(run, "alloc_space") == {"Trainer > load": 150, "Trainer > step": 300, "cache_blocks": 50}
    assert by_leaf(run, "alloc_objects") == {"Trainer > load": 2, "Trainer > step": 1, "cache_blocks": 2}
    # the peak (t=2: A and B live) is in the first window only
    peak = by_leaf(run, "peak_space")
    assert peak["Trainer > load"] == 100 and peak["Trainer > step"] == 300
    # in use is the latest snapshot: C and E, plus the cached free blocks
    inuse = by_leaf(run, "inuse_space")
    assert inuse["Trainer > load"] == 50 and inuse["cache_blocks"] == 30
    assert run.totals()["inuse_space"] == 450
    assert any("2 snapshots" in c for c in run.comments)


def test_the_last_snapshot_alone_would_lose_the_early_allocations() -> None:
    alone = SnapshotHistory(max_entries=4).add(SECOND)
    assert "Trainer > step" not in by_leaf(alone, "alloc_space")


def test_a_snapshot_taken_twice_is_not_counted_twice() -> None:
    history = SnapshotHistory()
    history.add(FIRST)
    run = history.add(FIRST)
    assert by_leaf(run, "alloc_space") == {"Trainer > load": 150, "Trainer > step": 300}


def test_events_sharing_the_edge_microsecond_are_each_counted_once() -> None:
    early = [event("alloc", 1, 0, 10, S1), event("alloc", 2, 10, 20, S1)]
    later = early + [event("alloc", 2, 30, 40, S3), event("alloc", 3, 70, 5, S3)]
    blocks = [block(0, 75, "active_allocated", S1)]
    history = SnapshotHistory()
    history.add(snapshot(blocks, early))
    run = history.add(snapshot(blocks, later))
    assert by_leaf(run, "alloc_space") == {"Trainer > load": 30, "cache_blocks": 45}


def test_the_run_peak_is_the_most_allocated_never_below_the_latest_in_use() -> None:
    """An early snapshot with a big cache but few allocations must not outrank a later, fuller one."""
    from gpuflame.formats.torch_snapshot import allocated_bytes

    history = SnapshotHistory()
    first_trace = [event("alloc", 1, 0, 100, S1)]
    history.add(snapshot([block(0, 100, "active_allocated", S1), block(100, 10_000, "inactive", [])], first_trace))
    second_trace = first_trace + [event("alloc", 2, 100, 200, S2)]
    run = history.add(
        snapshot([block(0, 100, "active_allocated", S1), block(100, 200, "active_allocated", S2)], second_trace)
    )
    assert allocated_bytes(run, "peak_space") == 300 >= allocated_bytes(run, "inuse_space") == 300


def test_the_reserved_peak_is_the_highest_any_snapshot_saw() -> None:
    """A 1000-byte segment made and freed (empty_cache()) in the first window: the allocator's reserved peak
    (1450) stays the run's when a later snapshot's trace no longer holds it, one unit per device."""
    blocks = [block(0, 100, "active_allocated", S1), block(100, 350, "inactive", [])]
    first = snapshot(
        blocks,
        [
            event("alloc", 1, 0, 100, S1),
            event("segment_alloc", 2, 1000, 1000, []),
            event("alloc", 3, 1000, 1000, S2),
            event("free_completed", 4, 1000, 1000, S2),
            event("segment_free", 5, 1000, 1000, []),
        ],
    )
    later = snapshot(blocks, [event("alloc", 6, 200, 10, S3), event("free_completed", 7, 200, 10, S3)])
    history = SnapshotHistory()
    assert [u.reserved for u in history.add(first).peaks] == [1450]
    run = history.add(later)
    assert [(u.device, u.reserved, u.reserved_allocated, u.reserved_at) for u in run.peaks] == [
        ("cuda:0", 1450, 1100, 2000)
    ]
