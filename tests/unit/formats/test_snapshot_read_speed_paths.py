"""The shortcuts that make reading a snapshot cheaper keep its meaning (speed itself is bench/'s)."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest

from gpuflame.formats import torch_snapshot
from gpuflame.formats.snapshot_trace import _times_within
from gpuflame.model.profile import Profile
from tests.helpers.paths import DATA

SMALL = DATA / "torch-snapshot-silmont2000-mem_snapshot.pickle.gz"


def test_the_collector_stays_paused_from_the_read_to_the_end_of_the_conversion(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Re-enabled between them, it walked every object of the snapshot just read."""
    monkeypatch.setenv("GPUFLAME_CACHE_DIR", str(tmp_path))
    seen: list[bool] = []
    real = torch_snapshot.from_snapshot

    def spy(snapshot: Any, **kwargs: Any) -> Profile:
        seen.append(gc.isenabled())
        return real(snapshot, **kwargs)

    monkeypatch.setattr(torch_snapshot, "from_snapshot", spy)
    assert gc.isenabled()
    profile = torch_snapshot.decode(SMALL.read_bytes())
    assert seen == [False]
    assert gc.isenabled()  # and given back
    assert profile.samples


@pytest.mark.parametrize(
    ("times", "ok"),
    [
        ((5, 6, 7), True),
        ((5,), True),
        ((4, 6), False),  # before the window
        ((5, 11), False),  # after it
        ((5, True), False),  # a bool is not a time
        ((5, 6.0), False),
        ((5, None), False),
        ((5, 2**70), False),
    ],
)
def test_times_within_the_window(times: tuple[Any, ...], ok: bool) -> None:
    assert _times_within(times, 5, 10) is ok
