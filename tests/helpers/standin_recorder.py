"""A recorder with no backend behind it, for the session's own logic (writes, failures, signals)."""

from __future__ import annotations

from gpuflame.model import Frame, Profile, memory_sample_types


class StandInRecorder:
    """Reports one fixed allocation; can be told to fail at each step."""

    name = "stand-in"

    def __init__(self, fail_on: str = "") -> None:
        self.fail_on = fail_on
        self.started = self.stopped = False

    def start(self) -> None:
        if self.fail_on == "start":
            raise RuntimeError("boom at start")
        self.started = True

    def stop(self) -> None:
        if self.fail_on == "stop":
            raise RuntimeError("boom at stop")
        self.stopped = True

    def snapshot(self) -> Profile:
        if self.fail_on == "snapshot":
            raise RuntimeError("boom at snapshot")
        p = Profile(sample_types=memory_sample_types())
        p.add([Frame("Cache > grow", "/app/cache.py", 7)], [4096, 1, 1024, 1, 8192, 2], {"device": "cpu"})
        return p
