"""``--at`` counts live allocations only; on a snapshot that also holds the allocator's reserve it says so."""

from __future__ import annotations

from gpuflame.formats import load
from gpuflame.model.moment import ALLOCATIONS_ONLY, PEAK, at, parse_when
from gpuflame.symbols.names import CACHED_FREE
from tests.helpers.paths import DATA
from tests.unit.model.test_history import S, profile_of


def test_a_moment_of_a_snapshot_with_cached_blocks_says_it_counts_allocations_only() -> None:
    """At the peak's instant, --at gave 12.x GiB where the report's peak said 13.2 GiB, with no word why."""
    profile = load(DATA / "torch-snapshot-MAGMA27-memory_snapshot.pickle.gz")
    assert any(frame.name == CACHED_FREE for frame in profile.frames)
    moment = at(profile, PEAK)
    assert moment.totals()["inuse_space"] < profile.totals()["peak_space"]
    assert ALLOCATIONS_ONLY in moment.comments


def test_a_moment_of_a_profile_without_a_reserve_says_nothing_of_it() -> None:
    """The torch CPU hook's profiles hold no reserve: their moments and their peak count the same bytes."""
    profile = profile_of([(1 * S, 0, 100), (2 * S, 1, 50)])
    moment = at(profile, parse_when("3s"))
    assert moment.totals()["inuse_space"] == 150
    assert ALLOCATIONS_ONLY not in moment.comments
