"""A clock a test drives, in place of ``time.time_ns``, so no test depends on how fast the machine runs.

Each reading moves it on by one microsecond (so events stay in order and
never share a time), and :meth:`FakeClock.advance` is the test's sleep: a
recorded gap is exactly as long as the test says, however loaded the
machine. Every ``gpuflame`` module that bound ``time.time_ns`` to a name
of its own (``now = time.time_ns``) reads this clock too.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

START_NS = 1_767_225_600_000_000_000  # 2026-01-01 00:00 UTC
TICK_NS = 1_000


class FakeClock:
    def __init__(self, start_ns: int = START_NS) -> None:
        self.ns = start_ns

    def __call__(self) -> int:
        self.ns += TICK_NS
        return self.ns

    def advance(self, seconds: float) -> None:
        self.ns += round(seconds * 1e9)


@contextmanager
def driven_clock(start_ns: int = START_NS) -> Iterator[FakeClock]:
    """``time.time_ns`` (and every gpuflame module's own name for it) reads a :class:`FakeClock` within."""
    clock, real = FakeClock(start_ns), time.time_ns
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(time, "time_ns", clock)
        _swap(real, clock)
        try:
            yield clock
        finally:
            # a gpuflame module first imported within bound the fake clock to a name of its own: give it the real
            # one back, or every later test of this process reads a clock that stopped (seen under pytest -n)
            _swap(clock, real)


def _swap(old: object, new: object) -> None:
    """Every gpuflame module's name for *old* now names *new*."""
    for name, module in list(sys.modules.items()):
        if name.startswith("gpuflame"):
            for attr, value in list(vars(module).items()):
                if value is old:
                    setattr(module, attr, new)
