"""diff by function: what grew, what shrank, what is new or gone."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuflame.analysis.compare import GREW, NEW, SHRANK, VANISHED, compare
from gpuflame.errors import GpuflameError
from gpuflame.model import Frame, Profile, SampleType, memory_sample_types

FRAMES = [Frame(n, "c.py", i, start_line=i) for i, n in enumerate(["main", "A > f", "B > g", "h"])]


def totals_by_function(profile: Profile, index: int) -> Counter:
    out: Counter = Counter()
    for s in profile.samples:
        for f in set(profile.stack_frames(s)):
            out[f] += s.values[index]
    return out


def profile_of(rows) -> Profile:
    profile = Profile(sample_types=memory_sample_types(inuse=False, alloc=False))
    for stack, v in rows:
        profile.add([FRAMES[i] for i in stack], [v, 1])
    return profile


rows = st.lists(
    st.tuples(st.lists(st.sampled_from(range(4)), min_size=1, max_size=5), st.integers(1, 1000)), max_size=12
)


@pytest.mark.slow
@settings(max_examples=120, deadline=None)
@given(rows, rows)
def test_changes_match_per_function_totals(base_rows, new_rows):
    base, new = profile_of(base_rows), profile_of(new_rows)
    cmp = compare(base, new, limit=100)
    before, after = totals_by_function(base, 0), totals_by_function(new, 0)
    want = {f: (before[f], after[f]) for f in set(before) | set(after) if before[f] != after[f]}
    got = {c.frame: (c.base, c.new) for c in cmp.grew + cmp.shrank}
    assert got == want
    assert cmp.base_total == sum(s.values[0] for s in base.samples)
    assert cmp.new_total == sum(s.values[0] for s in new.samples)
    assert [c.delta for c in cmp.grew] == sorted((c.delta for c in cmp.grew), reverse=True)
    assert [c.delta for c in cmp.shrank] == sorted(c.delta for c in cmp.shrank)
    for c in cmp.grew + cmp.shrank:
        assert c.status == (NEW if not c.base else VANISHED if not c.new else GREW if c.delta > 0 else SHRANK)


def test_new_vanished_and_percent():
    base = profile_of([([1, 0], 100), ([2, 0], 50)])
    new = profile_of([([1, 0], 150), ([3, 0], 20)])
    cmp = compare(base, new)
    changes = {c.frame.name: c for c in cmp.grew + cmp.shrank}
    assert changes["A > f"].status == GREW and changes["A > f"].percent == 50.0
    assert changes["h"].status == NEW and changes["h"].percent is None
    assert changes["B > g"].status == VANISHED and changes["B > g"].percent == -100.0
    assert changes["main"].delta == 20
    data = cmp.to_dict()
    assert data["delta"] == 20 and data["base_total"] == 150 and data["new_total"] == 170
    assert {c["name"]: c["status"] for c in data["grew"] + data["shrank"]}["h"] == NEW


def test_by_self():
    base = profile_of([([1, 0], 100)])
    new = profile_of([([0], 40), ([1, 0], 100)])  # main now allocates itself
    cmp = compare(base, new, by="self")
    assert [(c.frame.name, c.base, c.new) for c in cmp.grew] == [("main", 0, 40)]
    assert cmp.shrank == []


def test_type_choice_and_errors():
    base, new = profile_of([([0], 1)]), profile_of([([0], 2)])
    assert compare(base, new, "peak_space").type == "peak_space"
    with pytest.raises(GpuflameError, match="no sample type"):
        compare(base, new, "inuse_space")
    other = Profile(sample_types=[SampleType("alloc_space", "bytes")])
    with pytest.raises(GpuflameError, match="share no sample type"):
        compare(base, other)


def test_diff_matches_a_function_seen_at_different_lines_in_each_profile() -> None:
    """The base shows the function at lines 12 and 15, the new one only at 15: same function."""
    from gpuflame.analysis.compare import compare as compare_
    from gpuflame.model import Frame as F
    from gpuflame.model import Profile as P
    from gpuflame.model import SampleType as T

    base = P(sample_types=[T("inuse_space", "bytes")])
    base.add([F("Cache > grow", "/app/c.py", 12)], [100])
    base.add([F("Cache > grow", "/app/c.py", 15)], [100])
    new = P(sample_types=[T("inuse_space", "bytes")])
    new.add([F("Cache > grow", "/app/c.py", 15)], [500])
    result = compare_(base, new)
    assert [(c.frame.name, c.base, c.new) for c in result.grew] == [("Cache > grow", 200, 500)]
    assert result.changed == 1


@pytest.mark.parametrize("base_value, new_value", [(-(1 << 63), 5), (-(1 << 63), (1 << 63) - 1)])
def test_a_difference_past_64_bits_is_one_error(base_value: int, new_value: int) -> None:
    """new - base of values a pprof file can hold (int64) can leave int64: it was OverflowError (exit 3)."""
    types = [SampleType("inuse_space", "bytes")]
    base, new = Profile(sample_types=types), Profile(sample_types=types)
    base.add([Frame("f", "a.py", 1)], [base_value])
    new.add([Frame("f", "a.py", 1)], [new_value])
    with pytest.raises(GpuflameError, match="inuse_space values of this profile do not fit in 64 bits"):
        compare(base, new)
