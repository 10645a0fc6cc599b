"""What a trace shows the program did to the allocator is input to the replay: empty_cache(), a full device, streams.

Small traces written here by hand, in the layout torch's ``_snapshot()``
gives, each showing one thing the recorded allocator did that the replay
must take from the trace (no real trace in tests/data has these).
"""

from __future__ import annotations

from typing import Any

from gpuflame.simulate.replay import Input, Run
from gpuflame.simulate.settings import DEFAULTS

MiB = 1 << 20
A, B, C = 0x7F00_0000_0000, 0x7F00_4000_0000, 0x7F00_8000_0000


def snapshot(trace: list[tuple[str, int, int]], segments: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    entries = [
        {"action": a, "addr": addr, "size": size, "stream": 0, "time_us": 1000 + i, "frames": []}
        for i, (a, addr, size) in enumerate(trace)
    ]
    return {"segments": segments or [], "device_traces": [entries]}


def replay(snap: dict[str, Any]):
    (out,) = Run(Input("<test>", snapshot=snap), DEFAULTS).outcomes()
    return out


def test_empty_cache_in_the_trace_is_replayed():
    out = replay(
        snapshot(
            [
                ("segment_alloc", A, 20 * MiB),
                ("alloc", A, 5 * MiB),
                ("free_requested", A, 5 * MiB),
                ("free_completed", A, 5 * MiB),
                ("segment_free", A, 20 * MiB),  # torch.cuda.empty_cache()
                ("segment_alloc", B, 20 * MiB),
                ("alloc", B, 5 * MiB),
            ],
            [
                {
                    "device": 0,
                    "address": B,
                    "total_size": 20 * MiB,
                    "stream": 0,
                    "segment_type": "large",
                    "blocks": [
                        {"address": B, "size": 5 * MiB, "requested_size": 5 * MiB, "state": "active_allocated"},
                        {"address": B + 5 * MiB, "size": 15 * MiB, "state": "inactive"},
                    ],
                }
            ],
        )
    )
    assert out.segment_events_equal and out.placed_same == 1.0


def test_a_full_device_in_the_trace_releases_and_retries():
    """The cached 20 MiB segment is released before the 30 MiB one is made: the recording ran out of room."""
    trace = [
        ("segment_alloc", A, 20 * MiB),
        ("alloc", A, 5 * MiB),
        ("free_requested", A, 5 * MiB),
        ("free_completed", A, 5 * MiB),
        ("segment_free", A, 20 * MiB),
        ("segment_alloc", C, 30 * MiB),
        ("alloc", C, 30 * MiB),  # cudaMalloc failed
    ]
    segs = [
        {
            "device": 0,
            "address": C,
            "total_size": 30 * MiB,
            "stream": 0,
            "segment_type": "large",
            "blocks": [{"address": C, "size": 30 * MiB, "requested_size": 30 * MiB, "state": "active_allocated"}],
        }
    ]
    out = replay(snapshot(trace, segs))
    assert out.segment_events_equal and out.placed_same == 1.0
    assert out.simulated["reserved_peak"] == out.recorded["reserved_peak"] == 30 * MiB


def test_a_free_waiting_for_its_stream_is_not_reused():
    trace = [
        ("segment_alloc", A, 2 * MiB),
        ("alloc", A, 4096),
        ("free_requested", A, 4096),
        ("alloc", A + 4096, 4096),  # the first block still waits for its stream
        ("free_completed", A, 4096),
        ("alloc", A, 4096),
    ]
    out = replay(
        snapshot(
            trace,
            [{"device": 0, "address": A, "total_size": 2 * MiB, "stream": 0, "segment_type": "small", "blocks": []}],
        )
    )
    assert out.placed_same == 1.0 and out.segment_events_equal


def test_an_oom_entry_gives_the_device_capacity():
    trace = [("segment_alloc", A, 20 * MiB), ("alloc", A, 5 * MiB), ("oom", 0, 40 * MiB)]
    trace_entries = snapshot(trace)
    trace_entries["device_traces"][0][2]["device_free"] = 10 * MiB
    del trace_entries["device_traces"][0][2]["addr"]
    out = replay(trace_entries)
    assert out.capacity == 30 * MiB and out.oom is not None and out.oom["size"] == 40 * MiB


def test_empty_cache_is_replayed_under_other_settings_too():
    from gpuflame.simulate.settings import parse_alloc_conf

    snap = snapshot(
        [
            ("segment_alloc", A, 20 * MiB),
            ("alloc", A, 5 * MiB),
            ("free_requested", A, 5 * MiB),
            ("free_completed", A, 5 * MiB),
            ("segment_free", A, 20 * MiB),
            ("alloc", B, 4096),
        ]
    )
    (out,) = Run(Input("<test>", snapshot=snap), parse_alloc_conf("expandable_segments:True")).outcomes()
    assert out.simulated["segments_freed"] == 1  # the 20 MiB page unmapped


def test_a_recorded_oom_avoided_on_a_larger_gpu_is_said():
    trace = [
        ("segment_alloc", A, 20 * MiB),
        ("alloc", A, 4 * MiB),
        ("free_requested", A, 4 * MiB),
        ("free_completed", A, 4 * MiB),
        ("alloc", A, 4 * MiB),
        ("oom", 0, 18 * MiB),
    ]
    snap = snapshot(trace)
    snap["device_traces"][0][5]["device_free"] = 0  # 20 MiB reserved, the device full
    (recorded,) = Run(Input("<test>", snapshot=snap), DEFAULTS).outcomes()
    assert recorded.oom is not None and recorded.capacity == 20 * MiB
    (out,) = Run(Input("<test>", snapshot=snap), DEFAULTS, capacity=100 * MiB).outcomes()
    assert out.oom is None and out.first_difference is None
    assert any("ran out of memory at trace event 5: not in this replay" in n for n in out.notes)


def test_the_oom_answer_names_the_phase_from_gpuflames_marks():
    from gpuflame.formats.snapshot_phases import PHASES_KEY

    snap = snapshot(
        [("segment_alloc", A, 20 * MiB), ("alloc", A, 5 * MiB), ("segment_alloc", B, 16 * MiB), ("alloc", B, 16 * MiB)]
    )
    snap[PHASES_KEY] = [[1000, "load"], [1002, "train"]]  # as gpuflame's torch-cuda backend adds them
    (out,) = Run(Input("<test>", snapshot=snap), DEFAULTS, capacity=22 * MiB).outcomes()
    assert out.oom is not None and out.oom["phase"] == "train" and out.oom["event"] == 3


def test_a_new_expandable_segment_is_placed_at_the_recorded_base_when_the_device_size_is_unknown():
    # As on a real 80 GB GPU recorded with expandable_segments:True: each pool's segment reserves
    # about 9/8 of the device's memory, so the small pool's segment starts ~95 GB above the large
    # pool's, well inside the 1 TiB the replay reserves for a segment when no oom entry gives the
    # device's size. The recorded first map is still where the new segment begins.
    from gpuflame.simulate.settings import parse_alloc_conf

    large, small = 0x6_0200_0000, 0x1C_4600_0000
    snap = snapshot(
        [
            ("segment_map", large, 20 * MiB),
            ("alloc", large, 16 * MiB),
            ("segment_map", small, 2 * MiB),
            ("alloc", small, 4096),
            ("alloc", small + 4096, 4096),
            ("segment_map", large + 20 * MiB, 20 * MiB),
            ("alloc", large + 16 * MiB, 20 * MiB),
        ],
        [
            {
                "device": 0,
                "address": large,
                "total_size": 40 * MiB,
                "stream": 0,
                "segment_type": "large",
                "is_expandable": True,
                "blocks": [
                    {"address": large, "size": 16 * MiB, "requested_size": 16 * MiB, "state": "active_allocated"},
                    {
                        "address": large + 16 * MiB,
                        "size": 20 * MiB,
                        "requested_size": 20 * MiB,
                        "state": "active_allocated",
                    },
                    {"address": large + 36 * MiB, "size": 4 * MiB, "state": "inactive"},
                ],
            },
            {
                "device": 0,
                "address": small,
                "total_size": 2 * MiB,
                "stream": 0,
                "segment_type": "small",
                "is_expandable": True,
                "blocks": [
                    {"address": small, "size": 4096, "requested_size": 4096, "state": "active_allocated"},
                    {"address": small + 4096, "size": 4096, "requested_size": 4096, "state": "active_allocated"},
                    {"address": small + 8192, "size": 2 * MiB - 8192, "state": "inactive"},
                ],
            },
        ],
    )
    settings = parse_alloc_conf("expandable_segments:True")
    (out,) = Run(Input("<test>", snapshot=snap, recorded=settings), settings).outcomes()
    assert out.capacity is None
    assert out.segment_events_equal and out.first_difference is None
    assert out.placed_same == 1.0
