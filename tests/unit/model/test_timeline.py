"""The memory timeline: downsampling, its pprof comment, and the verbs that carry it."""

from __future__ import annotations

import base64
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuflame.formats import pprof
from gpuflame.model import Frame, Profile, memory_sample_types, merge
from gpuflame.model import filter as pfilter
from gpuflame.model.diff import diff
from gpuflame.model.timeline import DAMAGED_NOTE, PREFIX, Timeline, bucket_size, downsample, split_comments

DEV0 = (("device", "cuda:0"),)
DEV1 = (("device", "cuda:1"),)
T0 = 1_767_225_600_000_000_000


def profile_with_timeline() -> Profile:
    p = Profile(sample_types=memory_sample_types()[:1], comments=["a plain note"])
    p.add([Frame("f", "/app/a.py", 3)], [100], {"device": "cuda:0"})
    p.timeline = Timeline()
    p.timeline.add_series(DEV0, [(T0, 10), (T0 + 5_000, 110), (T0 + 9_000, 40)])
    p.timeline.add_series(DEV1, [(T0 + 1_000, 0), (T0 + 2_000, 7)])
    return p


def test_pprof_round_trip_keeps_the_timeline_out_of_the_comments() -> None:
    p = profile_with_timeline()
    raw = pprof.encode_raw(p)
    assert PREFIX.encode() in raw  # stored as a pprof comment, so other tools keep it
    back = pprof.decode(pprof.encode(p))
    assert back.timeline == p.timeline
    assert back.comments == ["a plain note"]
    assert back.timeline.peak(DEV0) == (T0 + 5_000, 110)


def test_a_profile_without_timeline_writes_no_timeline_comment() -> None:
    p = profile_with_timeline()
    p.timeline = None
    assert PREFIX.encode() not in pprof.encode_raw(p)
    assert pprof.decode(pprof.encode(p)).timeline is None


@pytest.mark.parametrize(
    "damaged",
    [
        PREFIX,
        PREFIX + "!!not base64!!",
        PREFIX + base64.b64encode(b"not zlib").decode(),
        PREFIX + base64.b64encode(zlib.compress(b"{not json")).decode(),
        PREFIX + base64.b64encode(zlib.compress(b'{"series":[{"labels":[],"t":[1,2],"b":[3]}]}')).decode(),
        PREFIX + base64.b64encode(zlib.compress(b'{"series":[{"labels":[],"t":[1],"b":[-3]}]}')).decode(),
        PREFIX + base64.b64encode(zlib.compress(b'{"series":[{"labels":[[1,2]],"t":[1],"b":[3]}]}')).decode(),
        PREFIX + base64.b64encode(zlib.compress(b'{"series":[{"labels":[],"t":[1e3],"b":[3]}]}')).decode(),
        PREFIX + base64.b64encode(zlib.compress(b"[1]")).decode(),
        PREFIX + "\u00e9",
    ],
)
def test_a_damaged_timeline_is_dropped_with_a_plain_note(damaged: str) -> None:
    p = profile_with_timeline()
    p.timeline = None
    p.comments = ["before", damaged, "after"]
    back = pprof.decode(pprof.encode(p))
    assert back.timeline is None
    assert back.comments == ["before", DAMAGED_NOTE, "after"]


def test_a_timeline_written_before_spikes_were_kept_still_reads() -> None:
    """The payload did not change: a v1 comment as earlier versions wrote it (times as differences)."""
    payload = b'{"series":[{"labels":[["device","cpu"]],"t":[1767225600000000000,5000,4000],"b":[10,110,40]}]}'
    old = PREFIX + base64.b64encode(zlib.compress(payload, 9)).decode()
    timeline, rest = split_comments(["note", old])
    assert rest == ["note"]
    assert timeline.series == {(("device", "cpu"),): [(T0, 10), (T0 + 5_000, 110), (T0 + 9_000, 40)]}


@pytest.mark.slow
def test_a_decompression_bomb_is_refused() -> None:
    bomb = PREFIX + base64.b64encode(zlib.compress(b" " * (80 << 20))).decode()
    assert split_comments([bomb]) == (None, [DAMAGED_NOTE])


def test_downsampling_keeps_the_peak_first_and_last_points() -> None:
    points = [(t, (t * 7919) % 1000) for t in range(10_000)]
    points[4321] = (4321, 5000)
    out = downsample(points, 2000)
    assert len(out) <= 2000 and min(b for _, b in out) == 0
    assert (4321, 5000) in out and out[0] == points[0] and out[-1] == points[-1]
    assert [t for t, _ in out] == sorted(t for t, _ in out)
    assert downsample(points[:50], 2000) == points[:50]


MB = 1_000_000


def value_at(points: list[tuple[int, int]], t: int) -> int:
    """The step line's value at time *t*: the last point at or before it."""
    return [b for tp, b in points if tp <= t][-1]


def spiky_series() -> tuple[list[tuple[int, int]], list[int]]:
    """Issue 10's strip: 1 MB held, five 4 MB spikes of 3 us each, 200 ms apart, small churn between."""
    points, spikes, t = [(T0, MB)], [], T0
    for _ in range(5):
        for _churn in range(2000):  # churn of 10 B allocations around the 1 MB, every 100 us
            t += 100_000
            points += [(t, MB + 10), (t + 1_000, MB)]
        t += 100_000
        spikes.append(t)
        points += [(t, 5 * MB), (t + 3_000, MB)]
    points.append((t + 100_000, MB))
    return points, spikes


def test_a_spike_of_microseconds_rises_and_falls_after_downsampling() -> None:
    points, spikes = spiky_series()
    out = downsample(points, 3000)
    assert len(points) > 20_000 and len(out) <= 3000
    for t in spikes:
        assert (t, 5 * MB) in out  # the spike, at its exact time and bytes
        after = [b for tp, b in out if tp > t][0]
        assert after <= MB + 10  # and the fall right after it: not a flat 5 MB line
        assert value_at(out, t + 50_000_000) <= MB + 10  # between spikes the line is at the 1 MB held
    assert max(out, key=lambda p: p[1]) == (spikes[0], 5 * MB)  # the peak: the first of equal highs
    assert out[-1] == points[-1] and out[0] == points[0]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 1 << 40), min_size=0, max_size=400), st.integers(5, 60))
def test_downsampling_keeps_every_excursion_within_one_bucket(sizes: list[int], max_points: int) -> None:
    points = [(T0 + 7 * i, b) for i, b in enumerate(sizes)]
    out = downsample(points, max_points)
    assert len(out) <= max(max_points, len(points)) and len(out) <= len(points)
    position = {p: i for i, p in reversed(list(enumerate(points)))}
    where = [position[p] for p in out]
    assert where == sorted(set(where))  # original points, in order, none twice
    if not points:
        return
    assert out[0] == points[0] and out[-1] == points[-1]  # start and end state exact
    assert max(out, key=lambda p: p[1]) == max(points, key=lambda p: p[1])  # the peak, first of ties
    assert min(b for _, b in out) == min(sizes)
    size = bucket_size(len(points), max_points)
    for i, (_, b) in enumerate(points):  # every high and every low has a kept match close by
        near = [out[k][1] for k, j in enumerate(where) if abs(j - i) < size]
        assert max(near) >= b >= min(near)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 1 << 40), min_size=0, max_size=300), st.integers(5, 40))
def test_a_series_set_from_its_columns_is_the_series_set_from_its_points(sizes: list[int], max_points: int) -> None:
    """A trace's columns are downsampled before any point is made: the same points as from the pairs."""
    times = [T0 + 3 * i for i in range(len(sizes))]
    by_points, by_columns = Timeline(), Timeline()
    by_points.add_series(DEV0, list(zip(times, sizes, strict=True)), max_points)
    by_columns.add_columns(DEV0, times, sizes, max_points)
    assert by_columns.series == by_points.series
    assert len(by_columns.series[DEV0]) <= max_points


def test_the_total_places_each_series_on_its_own_start_and_end() -> None:
    """Two processes, one after the other: each counts only while it ran."""
    first = [(T0, 100), (T0 + 10, 300), (T0 + 20, 50)]  # ran 0..20
    second = [(T0 + 30, 200), (T0 + 40, 10)]  # ran 30..40
    tl = Timeline({(("pid", "1"),): first, (("pid", "2"),): second})
    line = tl.total()
    assert line == [(T0, 100), (T0 + 10, 300), (T0 + 20, 50), (T0 + 20, 0), (T0 + 30, 200), (T0 + 40, 10)]
    assert value_at(line, T0 + 25) == 0  # the first ended: it contributes 0 after its end
    assert max(b for _, b in line) == 300  # never 300 + 200: they were never live together
    assert tl.total((("pid", "2"),)) == second
    assert tl.total((("pid", "3"),)) == []


def test_the_total_of_overlapping_series_sums_what_was_live_together() -> None:
    a = [(T0, 100), (T0 + 50, 100)]  # ran 0..50
    b = [(T0 + 10, 7), (T0 + 20, 9), (T0 + 80, 1)]  # ran 10..80, held 9 after the first ended
    line = Timeline({DEV0: a, DEV1: b}).total()
    assert value_at(line, T0 + 5) == 100  # b not yet started: not counted from time 0
    assert value_at(line, T0 + 15) == 107 and value_at(line, T0 + 30) == 109
    assert value_at(line, T0 + 60) == 9 and line[-1] == (T0 + 80, 1)
    assert line[0] == (T0, 100)
    ended_at_zero = Timeline({DEV0: [(T0, 5), (T0 + 10, 0)], DEV1: [(T0 + 2, 1), (T0 + 20, 1)]}).total()
    assert ended_at_zero == [(T0, 5), (T0 + 2, 6), (T0 + 10, 1), (T0 + 20, 1)]  # its end changes nothing: no repeat


def test_points_several_series_share_a_time_at_are_one_moment() -> None:
    """JAX writes every device's total at its sample's time: device 0 fell 32 -> 0 while device 1 rose 4 -> 20.

    Summed series by series, the line passed through 36 + 16 = 52 at that time, a moment that never was.
    """
    dev0 = [(T0, 32), (T0 + 10, 0)]
    dev1 = [(T0, 4), (T0 + 10, 20)]
    for series in ({DEV0: dev0, DEV1: dev1}, {DEV1: dev1, DEV0: dev0}):
        line = Timeline(series).total()
        assert line == [(T0, 36), (T0 + 10, 20)]
        assert max(b for _, b in line) == 36
    one = Timeline({DEV0: [(T0, 5), (T0 + 10, 9), (T0 + 10, 2)], DEV1: [(T0 + 3, 1), (T0 + 20, 1)]}).total()
    # one series' points at one time are each real
    assert one == [(T0, 5), (T0 + 3, 6), (T0 + 10, 10), (T0 + 10, 3), (T0 + 10, 1), (T0 + 20, 1)]


def test_filters_and_compact_keep_the_timeline() -> None:
    p = profile_with_timeline()
    assert pfilter.ignore(p, "f").timeline == p.timeline
    assert p.compact().timeline == p.timeline


def test_merge_relabels_series_with_the_merge_labels() -> None:
    a, b = profile_with_timeline(), profile_with_timeline()
    out = merge([a, b], labels=[{"pid": 1}, {"pid": 2}])
    assert set(out.timeline.series) == {
        (("device", "cuda:0"), ("pid", "1")),
        (("device", "cuda:1"), ("pid", "1")),
        (("device", "cuda:0"), ("pid", "2")),
        (("device", "cuda:1"), ("pid", "2")),
    }
    assert not any("timeline" in c for c in out.comments)


def test_merge_without_labels_keeps_the_first_of_clashing_series_and_says_so() -> None:
    a, b = profile_with_timeline(), profile_with_timeline()
    b.timeline = Timeline({DEV0: [(T0, 1)]})
    out = merge([a, b])
    assert out.timeline.series[DEV0] == a.timeline.series[DEV0]
    assert any("1 memory timeline series left out" in c for c in out.comments)
    assert merge([Profile(sample_types=memory_sample_types()[:1])]).timeline is None


def test_merge_joins_two_windows_of_one_process_one_after_the_other() -> None:
    """Two gpuflame.profile() windows of one process: one series, nothing counted between them."""
    a, b = profile_with_timeline(), profile_with_timeline()
    later = [(T0 + 50_000, 30), (T0 + 60_000, 20)]
    b.timeline = Timeline({DEV0: later})
    for out in (merge([a, b]), merge([b, a])):
        line = out.timeline.series[DEV0]
        assert line == [*a.timeline.series[DEV0], (T0 + 9_000, 0), *later]
        assert value_at(out.timeline.total((DEV0[0],)), T0 + 30_000) == 0
        assert not any("left out" in c for c in out.comments)


def test_a_diff_has_no_timeline() -> None:
    assert diff(profile_with_timeline(), profile_with_timeline()).timeline is None
