"""The profile that uses every feature the writers map (the ``rich_profile`` fixture, and the fuzz seeds).

A module of its own, not conftest: ``from conftest import`` finds whichever conftest.py was loaded last
(tests/gpu/ has one too).
"""

from __future__ import annotations

from gpuflame.model import Frame, Profile, memory_sample_types


def build_rich_profile() -> Profile:
    """A small profile using every feature the writers map: kinds, labels, negatives, metadata."""
    p = Profile(sample_types=memory_sample_types())
    p.default_type = "inuse_space"
    p.comments = ["made by the tests", "ünïcode ✓"]
    p.time_nanos = 1_700_000_000_123_456_789
    p.duration_nanos = 42_000_000_000
    module = Frame("<module>", "/app/train.py", 1, start_line=1)
    forward = Frame("LlamaMLP > forward", "/app/modeling_llama.py", 123, start_line=123)
    init = Frame("LlamaMLP > __init__", "/app/modeling_llama.py", 99, start_line=99)
    trampoline = Frame("<interpreter trampoline>", "", 0, "trampoline")
    native_addr = Frame("0x7f15deadbeef", "/usr/lib/libcuda.so.1", 0, "native")
    native_sym = Frame("cudaMalloc", "", 0, "native")
    cached = Frame("<cached free blocks>", "", 0, "synthetic")
    p.add(
        [native_addr, native_sym, forward, trampoline, module],
        [1 << 30, 1, 1 << 29, 1, 3 << 30, 3],
        {"pid": 4242, "device": "cuda:0"},
    )
    p.add([init, module], [512, 2, 0, 0, 512, 2], {"pid": 4242, "device": "cuda:1"})
    p.add([cached], [0, 0, 2 << 20, 1, 0, 0], {"pid": 7, "device": "cuda:0"})
    p.add([forward, module], [-(5 << 32), -1, 7, 1, 0, 0])
    p.add([], [0, 0, 0, 0, 0, 0])
    return p
