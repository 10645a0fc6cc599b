"""The memory timeline: downsampling, its pprof comment, and the verbs that carry it."""

from __future__ import annotations

import base64
import zlib

import pytest

from gpuflame.formats import pprof
from gpuflame.model import Frame, Profile, memory_sample_types, merge
from gpuflame.model import filter as pfilter
from gpuflame.model.diff import diff
from gpuflame.model.timeline import DAMAGED_NOTE, PREFIX, Timeline, downsample, split_comments

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


def test_a_decompression_bomb_is_refused() -> None:
    bomb = PREFIX + base64.b64encode(zlib.compress(b" " * (80 << 20))).decode()
    assert split_comments([bomb]) == (None, [DAMAGED_NOTE])


def test_downsampling_keeps_the_peak_first_and_last_points() -> None:
    points = [(t, (t * 7919) % 1000) for t in range(10_000)]
    points[4321] = (4321, 5000)
    out = downsample(points, 2000)
    assert len(out) <= 2000
    assert (4321, 5000) in out and out[0] == points[0] and out[-1] == points[-1]
    assert [t for t, _ in out] == sorted(t for t, _ in out)
    assert downsample(points[:50], 2000) == points[:50]


def test_filters_and_compact_keep_the_timeline() -> None:
    p = profile_with_timeline()
    assert pfilter.ignore(p, "f").timeline == p.timeline
    assert p.compact().timeline == p.timeline


def test_merge_relabels_series_with_the_merge_labels() -> None:
    a, b = profile_with_timeline(), profile_with_timeline()
    out = merge([a, b], labels=[{"pid": 1}, {"pid": 2}])
    assert set(out.timeline.series) == {
        (("device", "cuda:0"), ("pid", "1")), (("device", "cuda:1"), ("pid", "1")),
        (("device", "cuda:0"), ("pid", "2")), (("device", "cuda:1"), ("pid", "2")),
    }
    assert not any("timeline" in c for c in out.comments)


def test_merge_without_labels_keeps_the_first_of_clashing_series_and_says_so() -> None:
    a, b = profile_with_timeline(), profile_with_timeline()
    b.timeline = Timeline({DEV0: [(T0, 1)]})
    out = merge([a, b])
    assert out.timeline.series[DEV0] == a.timeline.series[DEV0]
    assert any("1 memory timeline series left out" in c for c in out.comments)
    assert merge([Profile(sample_types=memory_sample_types()[:1])]).timeline is None


def test_a_diff_has_no_timeline() -> None:
    assert diff(profile_with_timeline(), profile_with_timeline()).timeline is None
