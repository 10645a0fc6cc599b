"""Small profiles for the server's and the viewer's tests."""

from __future__ import annotations

from gpuflame.model import Frame, Profile, memory_sample_types


def small_profile(name: str, size: int) -> Profile:
    p = Profile(sample_types=memory_sample_types())
    p.add([Frame(name, "/app/probe.py", 7), Frame("<module>", "/app/probe.py", 1)], [size, 1, size, 1, size, 1])
    return p
