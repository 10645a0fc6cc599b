"""`report` calls a snapshot's figures exact only where its trace reaches back to the first allocation they count.

A torch 2.0 snapshot recorded with the default ring buffer holds one trace
entry (the ``snapshot`` action, no ``time_us``): every block alive in it was
allocated before the trace began, so its peak is the window's only. Built
from a real snapshot (tests/data) by cutting its trace down, as torch 2.0
would have kept it.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

from gpuflame.formats.load_save import load
from gpuflame.simulate.snapshot import read
from gpuflame.units import format_bytes
from tests.helpers.paths import DATA

ACTIVE = ("active_allocated", "active_pending_free", "active_awaiting_free")


def cut(tmp_path: Path, trace: list[dict[str, Any]]) -> tuple[Path, dict[str, Any]]:
    snap = read((DATA / "torch-snapshot-silmont2000-mem_snapshot.pickle.gz").read_bytes())
    snap["device_traces"][0] = trace
    path = tmp_path / "cut.pickle"
    path.write_bytes(pickle.dumps(snap))
    return path, snap


def comments(path: Path) -> list[str]:
    return [c for c in load(path).comments if c.startswith("cuda:0: ")]


def test_a_torch_2_0_one_entry_trace_is_not_called_exact(tmp_path: Path) -> None:
    path, snap = cut(tmp_path, [{"action": "snapshot", "addr": 0, "size": 0, "stream": 0, "frames": []}])
    alive = [b for s in snap["segments"] for b in s["blocks"] if b["state"] in ACTIVE]
    notes = comments(path)
    assert not any("exact" in c for c in notes), notes
    (reach,) = [c for c in notes if "does not reach back" in c]
    assert (
        "it holds 1 event (torch 2.0 keeps 1 by default: _record_memory_history(True, trace_alloc_max_entries=N)"
        in reach
    )
    held = format_bytes(sum(b["requested_size"] for b in alive))
    assert f"; {len(alive)} allocations alive in it ({held}) were made before it began." in reach


def test_one_free_of_an_older_allocation_is_said_in_the_singular(tmp_path: Path) -> None:
    snap = read((DATA / "torch-snapshot-silmont2000-mem_snapshot.pickle.gz").read_bytes())
    old = next(b for s in snap["segments"] for b in s["blocks"] if b["state"] in ACTIVE)
    trace = [
        {"action": "free_requested", "addr": old["address"], "size": old["requested_size"], "stream": 0,
         "frames": [], "time_us": 5},
        {"action": "free_completed", "addr": old["address"], "size": old["requested_size"], "stream": 0,
         "frames": [], "time_us": 6},
    ]  # fmt: skip
    path, _ = cut(tmp_path, trace)
    (reach,) = [c for c in comments(path) if "does not reach back" in c]
    assert "it holds 2 events" in reach
    assert "1 free in it is of an allocation made before it began, so at least 1 earlier event is lost" in reach


def test_a_trace_from_the_first_allocation_is_not_qualified() -> None:
    notes = comments(DATA / "torch-snapshot-silmont2000-mem_snapshot.pickle.gz")
    assert not any("does not reach back" in c for c in notes), notes
