"""Proof on real GPU traces: under the recorded settings the replay makes the recorded segments and placements.

Every real snapshot in tests/data (recorded on GPUs by other people) is
replayed; the ones with segment events must match them exactly (count,
sizes, order), with the recorded reserved peak, and >= 99% of allocations
at the recorded segment and offset. The five whose traces start after every
segment was made (no segment events) are held to the same placement bar.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuflame.simulate.replay import Run, read_input, settings_for
from gpuflame.simulate.snapshot import read
from tests.helpers.paths import DATA

WITH_SEGMENT_EVENTS = ["torch-snapshot-DeComFL-memory.pickle.gz", "torch-snapshot-silmont2000-mem_snapshot.pickle.gz"]
STARTED_LATE = [
    "torch-snapshot-Wedsonlin-medium_128_inference.pickle.gz",
    "torch-snapshot-silmont2000-memory_forward_fp32_128.pickle.gz",
    "torch-snapshot-MAGMA27-memory_snapshot.pickle.gz",
    "torch-snapshot-bcrafton-memory_snapshot.pickle.gz",
    "torch-snapshot-notHanmin-memory_snapshot.pickle.gz",
]


@pytest.mark.parametrize("name", WITH_SEGMENT_EVENTS + STARTED_LATE)
def test_recorded_settings_reproduce_the_recording(name):
    inp = read_input(str(DATA / name))
    (out,) = Run(inp, settings_for(inp, None)).outcomes()
    assert out.segment_events_equal is True
    assert out.simulated["reserved_peak"] == out.recorded["reserved_peak"]
    assert out.simulated["segments_allocated"] == out.recorded["segments_allocated"]
    assert out.placed_same >= 0.99
    assert out.wrapped == (name in STARTED_LATE)


def test_the_numbers_of_one_real_trace():
    inp = read_input(str(DATA / "torch-snapshot-DeComFL-memory.pickle.gz"))
    (out,) = Run(inp, settings_for(inp, None)).outcomes()
    assert (out.allocations, out.simulated["segments_allocated"], out.simulated["reserved_peak"]) == (
        7946,
        61,
        1897922560,
    )


def test_a_smaller_gpu_runs_out_with_the_stack_of_the_failing_allocation():
    inp = read_input(str(DATA / "torch-snapshot-DeComFL-memory.pickle.gz"))
    (out,) = Run(inp, settings_for(inp, None), capacity=1536 << 20).outcomes()
    assert out.oom is not None and out.oom["size"] > 0
    assert out.oom["stack"][0] == "<module>" and out.oom["allocated"] + out.oom["cached"] <= 1536 << 20
    assert out.placed_same is None  # another device size is not checked against the recording


def test_other_settings_are_side_by_side_with_the_recording():
    inp = read_input(str(DATA / "torch-snapshot-DeComFL-memory.pickle.gz"))
    (out,) = Run(inp, settings_for(inp, "expandable_segments:True")).outcomes()
    assert out.recorded["reserved_peak"] == 1897922560
    assert out.simulated["allocated_peak"] <= out.simulated["reserved_peak"]
    assert out.placed_same is None


def _reserved_peak_by_hand(path: Path) -> tuple[int, int]:
    """(reserved peak, reserved at the end) of device 0, from the raw snapshot: the end's segments with the
    trace's segment events undone give the start; the events replayed from there give every moment."""
    snap = read(path.read_bytes())
    end = sum(s["total_size"] for s in snap["segments"] if s.get("device", 0) == 0)
    sign = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}
    trace = sorted(snap["device_traces"][0], key=lambda e: e["time_us"])
    reserved = end - sum(sign.get(e["action"], 0) * e["size"] for e in trace)
    peak = reserved
    for e in trace:
        reserved += sign.get(e["action"], 0) * e["size"]
        peak = max(peak, reserved)
    return peak, end


@pytest.mark.parametrize("name", WITH_SEGMENT_EVENTS + STARTED_LATE)
def test_report_says_the_true_reserved_peak(name, capsys):
    """report's reserved peak is the most the allocator held at any moment, as simulate's recorded one."""
    import json

    from gpuflame.cli.main import main

    peak, _ = _reserved_peak_by_hand(DATA / name)
    assert main(["report", str(DATA / name), "--json"]) == 0
    (found,) = json.loads(capsys.readouterr().out)["reserved_peak"]
    assert found["device"] == "cuda:0" and found["reserved"] == peak
    assert 0 < found["allocated"] <= peak
    inp = read_input(str(DATA / name))
    (out,) = Run(inp, settings_for(inp, None)).outcomes()
    assert out.recorded["reserved_peak"] == peak
