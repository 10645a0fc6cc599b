"""Function statistics and the report's four sections, checked against the samples."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuflame.analysis.hotspots import (
    TARGET_MIN_RATIO,
    TARGET_MIN_SHARE,
    WRAPPER_MAX_RATIO,
    WRAPPER_MIN_SHARE,
    build_report,
    function_stats,
    top_functions,
)
from gpuflame.analysis.tree import NO_STACK, build_table, build_tree
from gpuflame.model import Frame, Profile, memory_sample_types
from gpuflame.model.profile import SYNTHETIC, TRAMPOLINE_KIND
from tests.helpers.guide import GUIDE_KV_CHAIN, GiB, guide_profile


def naive_stats(profile: Profile, type_index: int) -> tuple[Counter, Counter]:
    """(self, total) per frame, straight from the samples."""
    self_: Counter = Counter()
    total: Counter = Counter()
    for s in profile.samples:
        v = s.values[type_index]
        frames = profile.stack_frames(s)
        self_[frames[0] if frames else NO_STACK] += v
        for f in set(frames) or {NO_STACK}:
            total[f] += v
    return self_, total


def stats_dict(profile: Profile, type_index: int) -> tuple[dict, dict]:
    stats = function_stats(build_table(profile, type_index))
    self_ = {stats.frame(c): int(stats.self[c]) for c in range(1, len(stats.frames) + 1) if stats.self[c]}
    total = {stats.frame(c): int(stats.total[c]) for c in range(1, len(stats.frames) + 1) if stats.total[c]}
    return self_, total


FRAMES = [Frame(n, "r.py", i, start_line=i) for i, n in enumerate(["main", "loop", "A > f", "B > g", "leaf"])]


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.lists(st.sampled_from(FRAMES), max_size=8), st.integers(-(2**40), 2**40)),
        max_size=30,
    )
)
def test_function_stats_match_samples(rows):
    """Self by leaf; total once per sample even when recursion repeats a frame."""
    profile = Profile(sample_types=memory_sample_types(peak=True, inuse=False, alloc=False))
    for stack, v in rows:
        profile.add(stack, [v, 1])
    want_self, want_total = naive_stats(profile, 0)
    got_self, got_total = stats_dict(profile, 0)
    assert got_self == {f: v for f, v in want_self.items() if v}
    assert got_total == {f: v for f, v in want_total.items() if v}


def test_recursion_counts_once_in_total():
    profile = Profile(sample_types=memory_sample_types(inuse=False, alloc=False))
    rec, main = Frame("walk", "t.py", 3, start_line=3), Frame("main", "t.py", 1, start_line=1)
    profile.add([rec, rec, rec, main], [100, 1])
    profile.add([rec, main], [10, 1])
    self_, total = stats_dict(profile, 0)
    assert total[rec] == 110 and self_[rec] == 110
    assert total[main] == 110 and main not in self_


def test_top_functions_by_self_and_total():
    profile = guide_profile()
    index = profile.pick_type()
    want_self, want_total = naive_stats(profile, index)
    stats = function_stats(build_table(profile, index))
    by_self = top_functions(stats, "self", 3)
    assert [e.frame for e in by_self] == [f for f, _ in want_self.most_common(3)]
    assert [e.self for e in by_self] == [v for _, v in want_self.most_common(3)]
    by_total = top_functions(stats, "total", 100)
    assert {e.frame: e.total for e in by_total} == dict(want_total)
    assert [e.total for e in by_total] == sorted((e.total for e in by_total), reverse=True)


def test_report_sections_follow_the_quick_reference_table():
    profile = guide_profile()
    index = profile.pick_type()
    assert profile.sample_types[index].type == "peak_space"
    want_self, want_total = naive_stats(profile, index)
    grand = sum(s.values[index] for s in profile.samples)
    report = build_report(profile, build_tree(profile, index), limit=10)

    assert report.total == grand
    assert {t.type: t.total for t in report.totals} == profile.totals()
    assert report.comments == profile.comments

    # what allocates the most: by self, the KV cache first
    assert [(e.frame, e.self) for e in report.leaves] == [(f, v) for f, v in want_self.most_common() if v > 0]
    assert report.leaves[0].frame.name == "GPUModelRunner > _allocate_kv_cache_tensors"
    assert abs(report.leaves[0].percent - 100 * 55 * GiB / grand) < 1e-9

    # targets: wide, mostly self, real code
    for e in report.targets:
        assert e.self >= TARGET_MIN_SHARE * grand and e.self >= TARGET_MIN_RATIO * e.total
        assert e.frame.kind not in (SYNTHETIC, TRAMPOLINE_KIND)
    expected_targets = [
        f
        for f, v in want_self.most_common()
        if v >= TARGET_MIN_SHARE * grand
        and v >= TARGET_MIN_RATIO * want_total[f]
        and f.kind not in (SYNTHETIC, TRAMPOLINE_KIND)
    ]
    assert [e.frame for e in report.targets] == expected_targets
    assert "<cached free blocks>" not in [e.frame.name for e in report.targets]

    # skippable: wide with ~zero self, widest first
    expected_wrappers = [
        f
        for f, v in sorted(want_total.items(), key=lambda kv: -kv[1])
        if v >= WRAPPER_MIN_SHARE * grand and want_self[f] <= WRAPPER_MAX_RATIO * v
    ]
    assert {e.frame for e in report.wrappers} == set(expected_wrappers)
    assert [e.total for e in report.wrappers] == sorted((e.total for e in report.wrappers), reverse=True)
    names = [e.frame.name for e in report.wrappers]
    assert "<module>" in names and "EngineCore > __init__" in names
    assert "GPUModelRunner > _allocate_kv_cache_tensors" not in names


def test_widest_root_is_followed_to_where_it_splits():
    profile = guide_profile()
    index = profile.pick_type()
    report = build_report(profile, build_tree(profile, index))
    root = report.roots[0]
    assert [e.frame.name for e in root.trunk] == GUIDE_KV_CHAIN[:5]
    engine = sum(s.values[index] for s in profile.samples if len(s.stack) > 1)
    assert root.root.total == engine == root.split.total
    assert [b.frame.name for b in root.branches] == [
        "EngineCore > _initialize_kv_caches",
        "Worker > load_model",
        "Worker > compile_or_warm_up_model",
    ]
    assert root.branches[0].total == 55 * GiB
    assert root.rest == root.split.total - sum(b.total for b in root.branches) == 0
    assert report.roots[1].root.frame.name == "<cached free blocks>"
    assert report.roots[1].branches == []


def test_report_of_an_empty_selection():
    profile = guide_profile()
    profile.samples = []
    report = build_report(profile, build_tree(profile, 0))
    assert report.total == 0
    assert report.leaves == report.roots == report.targets == report.wrappers == []


def test_report_json_has_exact_values():
    profile = guide_profile()
    index = profile.pick_type()
    data = build_report(profile, build_tree(profile, index)).to_dict()
    assert data["sample_type"] == "peak_space" and data["unit"] == "bytes"
    assert data["widest_leaves"][0]["self"] == 55 * GiB
    assert data["widest_leaves"][0]["file"].endswith("gpu_model_runner.py")
    assert data["widest_leaves"][0]["line"] == 2010
    assert set(data) >= {
        "widest_leaves",
        "widest_roots",
        "optimisation_targets",
        "skippable_wrappers",
        "totals",
    }


def test_a_function_at_two_lines_is_one_function_unless_lines_are_asked_for() -> None:
    """A bar is a function (as in Grafana and pprof): lines of one function add up."""
    from gpuflame.analysis.hotspots import function_stats as stats_of
    from gpuflame.analysis.tree import build_table as table_of
    from gpuflame.model import Frame as F
    from gpuflame.model import Profile as P
    from gpuflame.model import SampleType as T

    p = P(sample_types=[T("inuse_space", "bytes")])
    main_ = F("main", "/app/run.py", 3)
    p.add([F("LlamaMLP > __init__", "/app/m.py", 12, start_line=10), main_], [100])
    p.add([F("LlamaMLP > __init__", "/app/m.py", 15, start_line=10), main_], [40])
    p.add([F("LlamaMLP > __init__", "/other/m.py", 12), main_], [1])  # another file: another function
    by_function = stats_of(table_of(p, 0))
    names = {(by_function.frame(int(c)).file, int(by_function.self[c])) for c in by_function.ranked("self")}
    assert names == {("/app/m.py", 140), ("/other/m.py", 1)}
    shown = [by_function.frame(int(c)) for c in by_function.ranked("self")]
    assert shown[0].line == 10  # where the function is defined, not a line it ran
    by_line = stats_of(table_of(p, 0, lines=True))
    assert sorted(int(by_line.self[c]) for c in by_line.ranked("self")) == [1, 40, 100]
