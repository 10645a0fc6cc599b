"""The caching-allocator model against the rules of PyTorch's CUDACachingAllocator.cpp, one rule a test."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuflame.errors import GpuflameError
from gpuflame.simulate.allocator import Allocator
from gpuflame.simulate.blocks import allocation_size, round_size
from gpuflame.simulate.settings import DEFAULTS, parse_alloc_conf

MiB = 1 << 20


def test_round_size_and_segment_sizes():
    assert round_size(1, DEFAULTS) == 512
    assert round_size(513, DEFAULTS) == 1024
    assert allocation_size(512) == 2 * MiB  # small pool
    assert allocation_size(MiB + 512) == 20 * MiB  # 1-10 MiB
    assert allocation_size(10 * MiB) == 10 * MiB
    assert allocation_size(11 * MiB + 1) == 12 * MiB  # rounded to 2 MiB


def test_roundup_power2_divisions():
    four = parse_alloc_conf("roundup_power2_divisions:4")
    assert round_size(1200 * 1024, four) == 1280 * 1024  # 1 MiB .. 2 MiB in four steps of 256 KiB
    assert round_size(1 << 21, four) == 1 << 21  # a power of two stays
    per = parse_alloc_conf("roundup_power2_divisions:[256:1,512:2,>:4]")
    assert per.divisions(300 * MiB) == 1 and per.divisions(600 * MiB) == 2 and per.divisions(5000 * MiB) == 4


def test_best_fit_by_size_then_address_and_split():
    a = Allocator(DEFAULTS)
    x = a.malloc(1000)
    y = a.malloc(1000)
    z = a.malloc(1000)
    assert (y.addr - x.addr, z.addr - y.addr) == (1024, 1024)  # one 2 MiB small segment, split from the bottom
    a.free(x)
    a.free(z)
    assert a.malloc(600).addr == x.addr  # two free blocks fit: x (1 KiB) is smaller than z's merged rest
    assert len(a.segments) == 1


def test_fragmentation_at_the_reserved_peak_is_taken_when_most_was_allocated_there():
    a = Allocator(DEFAULTS)
    a.malloc(1000)  # the 2 MiB segment is made: reserved peak reached with 1 KiB allocated
    for _ in range(9):
        a.malloc(100_000)
    assert a.reserved_peak == 2 * MiB and a.allocated_at_reserved_peak == 1024 + 9 * 100_352


def test_large_block_not_split_unless_more_than_one_mib_remains():
    a = Allocator(DEFAULTS)
    b = a.malloc(19 * MiB + 512)  # 20 MiB segment, rest < 1 MiB: not split
    assert b.size == 20 * MiB
    c = a.malloc(2 * MiB)  # another 20 MiB segment, rest 18 MiB: split
    assert c.size == 2 * MiB and len(a.segments) == 2


def test_pending_free_is_not_reused_or_merged():
    a = Allocator(DEFAULTS)
    x = a.malloc(1000)
    a.free_request(x)
    y = a.malloc(1000)
    assert y.addr != x.addr
    a.free_complete(x)
    assert a.malloc(1000).addr == x.addr


def test_max_split_size_keeps_oversize_blocks_whole():
    conf = parse_alloc_conf("max_split_size_mb:64")
    a = Allocator(conf)
    big = a.malloc(100 * MiB)
    a.free(big)
    small = a.malloc(30 * MiB)  # not carved out of the 100 MiB block
    assert small.addr != big.addr and len(a.segments) == 2
    a.free(small)
    assert a.malloc(90 * MiB).addr == big.addr  # within 20 MiB of it: used whole
    with pytest.raises(GpuflameError):
        parse_alloc_conf("max_split_size_mb:20")


def test_release_and_retry_when_the_device_is_full():
    a = Allocator(DEFAULTS, capacity=60 * MiB)
    x = a.malloc(40 * MiB)
    a.free(x)
    y = a.malloc(50 * MiB)  # the 40 MiB segment is released, then 50 MiB fits
    assert y is not None and a.events == [
        ("segment_alloc", x.addr, 40 * MiB),
        ("segment_free", x.addr, 40 * MiB),
        ("segment_alloc", y.addr, 50 * MiB),
    ]
    assert a.malloc(20 * MiB) is None


def test_expandable_segments_grow_in_pages():
    a = Allocator(parse_alloc_conf("expandable_segments:True"))
    x = a.malloc(30 * MiB)
    y = a.malloc(30 * MiB)
    assert y.addr == x.addr + 30 * MiB  # one segment, grown
    assert a.reserved == 60 * MiB  # three 20 MiB pages
    a.free(x)
    a.free(y)
    a.release_cached()
    assert a.reserved == 0


def test_garbage_collection_releases_old_blocks_past_the_threshold():
    """set_per_process_memory_fraction(0.5) of 200 MiB: 100 MiB allowed, the collector's threshold 30 MiB."""
    conf = parse_alloc_conf("garbage_collection_threshold:0.3")
    a = Allocator(conf, capacity=200 * MiB, fraction_limit=100 * MiB)
    assert a.capacity == 100 * MiB  # the fraction caps what cudaMalloc may take
    old = a.malloc(40 * MiB)
    addr = old.addr
    a.free(old)
    a.malloc(50 * MiB)  # no cached block fits, 40 MiB reserved is past 30: the unused block is released first
    assert ("segment_free", addr, 40 * MiB) in a.events
    for without in (Allocator(DEFAULTS, capacity=100 * MiB), Allocator(conf, capacity=100 * MiB)):
        # no collector: the threshold alone does nothing where no memory fraction is set (PyTorch's set_fraction)
        without.free(without.malloc(40 * MiB))
        without.malloc(50 * MiB)
        assert [e[0] for e in without.events] == ["segment_alloc", "segment_alloc"]


@pytest.mark.parametrize(
    "text",
    [
        "foo:1",
        "expandable_segments:maybe",
        "garbage_collection_threshold:2",
        "roundup_power2_divisions:3",
        "max_split_size_mb",
    ],
)
def test_bad_alloc_conf_is_one_error(text):
    with pytest.raises(GpuflameError, match="--alloc-conf"):
        parse_alloc_conf(text)


CONFS = [
    "",
    "expandable_segments:True",
    "max_split_size_mb:64",
    "roundup_power2_divisions:4",
    "garbage_collection_threshold:0.7",
]
ops = st.lists(st.tuples(st.booleans(), st.integers(1, 64 * MiB), st.integers(0, 50)), min_size=1, max_size=120)


def _replay(conf: str, seq, capacity=None, fraction_limit=None):
    a = Allocator(parse_alloc_conf(conf) if conf else DEFAULTS, capacity=capacity, fraction_limit=fraction_limit)
    live = []
    for is_alloc, size, pick in seq:
        if is_alloc or not live:
            b = a.malloc(size, stream=pick % 2)
            if b is None:
                break
            live.append(b)
        else:
            a.free(live.pop(pick % len(live)))
        assert a.allocated <= a.reserved
        assert a.allocated == sum(b.size for b in live)
    return a


@settings(max_examples=60, deadline=None)
@given(seq=ops, conf=st.sampled_from(CONFS))
def test_allocated_never_exceeds_reserved(seq, conf):
    a = _replay(conf, seq, capacity=256 * MiB, fraction_limit=256 * MiB)  # a fraction set: the collector acts
    assert a.allocated_peak <= a.reserved_peak


@settings(max_examples=60, deadline=None)
@given(seq=ops, conf=st.sampled_from(CONFS))
def test_what_if_never_reserves_less_than_the_bytes_asked_for(seq, conf):
    """Whatever the settings, the reserved peak covers the most bytes ever asked for at once."""
    other = _replay(conf, seq)
    live, asked, most = [], 0, 0
    for is_alloc, size, pick in seq:
        if is_alloc or not live:
            live.append(size)
            asked += size
        else:
            asked -= live.pop(pick % len(live))
        most = max(most, asked)
    assert other.reserved_peak >= most


def test_settings_describe_round_trip():
    conf = replace(DEFAULTS, expandable_segments=True)
    assert parse_alloc_conf(conf.describe()) == conf


def _recorded(conf: str, seq) -> dict:
    """A snapshot whose trace this model wrote (a capacity forces releases and retries), as torch lays it out."""
    settings_ = parse_alloc_conf(conf) if conf else DEFAULTS
    # an expandable segment's address space is the device's memory x 9/8, which a snapshot does not record:
    # the replay takes it as unbounded, so the recording here runs without a device limit
    a = Allocator(settings_, capacity=None if settings_.expandable_segments else 160 * MiB)
    trace, live, waiting, t = [], [], [], 0

    def entry(action, addr, size, stream=0):
        nonlocal t
        t += 1
        trace.append({"action": action, "addr": addr, "size": size, "stream": stream, "time_us": t, "frames": []})

    for is_alloc, size, pick in seq:
        if pick == 7:  # torch.cuda.empty_cache()
            seen = len(a.events)
            a.release_cached()
            for action, addr, n in a.events[seen:]:
                entry(action, addr, n)
        waiting = [b for b in waiting if b.pending]  # a release completes the waiting frees (said in the trace)
        if pick % 5 == 0 and waiting:  # a stream finishes with a block freed earlier
            b = waiting.pop(0)
            entry("free_completed", b.addr, b.requested, b.stream)
            a.free_complete(b)
        if is_alloc or not live:
            seen = len(a.events)
            b = a.malloc(size, stream=pick % 2)
            for action, addr, seg_size in a.events[seen:]:
                entry(action, addr, seg_size)
            if b is None:
                break
            entry("alloc", b.addr, size, b.stream)
            live.append(b)
        else:
            b = live.pop(pick % len(live))
            entry("free_requested", b.addr, b.requested, b.stream)
            a.free_request(b)
            if pick % 3:
                entry("free_completed", b.addr, b.requested, b.stream)
                a.free_complete(b)
            else:
                waiting.append(b)
    return {"segments": _end_segments(a), "device_traces": [trace]}


def _end_segments(a: Allocator) -> list[dict]:
    """The snapshot's segments, as torch lists them: an expandable segment as each of its mapped ranges."""
    out = []
    for seg in a.segments.values():
        kind = "small" if seg.small else "large"
        if not seg.expandable:
            out.append(
                {
                    "device": 0,
                    "address": seg.addr,
                    "total_size": seg.size,
                    "stream": seg.stream,
                    "segment_type": kind,
                    "blocks": [],
                }
            )
            continue
        pool = a.small if seg.small else a.large
        b = pool.unmapped_blocks.get(seg.addr) or pool.blocks.get(seg.addr)
        while b is not None and b.prev is not None:
            b = b.prev
        ranges: list[list[int]] = []
        while b is not None:
            if b.mapped and ranges and ranges[-1][0] + ranges[-1][1] == b.addr:
                ranges[-1][1] += b.size
            elif b.mapped:
                ranges.append([b.addr, b.size])
            b = b.next
        out += [
            {
                "device": 0,
                "address": r,
                "total_size": n,
                "stream": seg.stream,
                "segment_type": kind,
                "is_expandable": True,
                "blocks": [],
            }
            for r, n in ranges
        ]
    return out


@settings(max_examples=80, deadline=None)
@given(seq=ops, conf=st.sampled_from(CONFS))
def test_a_trace_this_model_wrote_replays_exactly(seq, conf):
    """Streams, waiting frees, empty_cache(), releases on a full device, garbage collection, expandable segments'
    maps and unmaps: the replay takes each from the trace and makes the same segments, peak and placements."""
    from gpuflame.simulate.replay import Input, Run

    settings_ = parse_alloc_conf(conf) if conf else DEFAULTS
    snap = _recorded(conf, seq)
    (out,) = Run(Input("<model>", snapshot=snap, recorded=settings_), settings_).outcomes()
    assert out.segment_events_equal, out.notes
    assert out.placed_same in (None, 1.0), out.first_difference
    assert out.simulated["reserved_peak"] == out.recorded["reserved_peak"]


def test_a_retry_after_a_full_device_does_not_search_the_cache_again():
    """A release completes a waiting free; the retried malloc makes a segment even though that block now fits."""
    import random

    from gpuflame.simulate.replay import Input, Run

    rng = random.Random(117)  # a sequence where exactly this happens (found by the property above)
    seq = [(rng.random() < 0.6, rng.randint(1, 64 * MiB), rng.randint(0, 50)) for _ in range(120)]
    (out,) = Run(Input("<model>", snapshot=_recorded("", seq)), DEFAULTS).outcomes()
    assert out.segment_events_equal and out.placed_same == 1.0, out.first_difference


def test_the_causes_at_the_peak_are_measured():
    """Each cause built by hand: a rest of 1 MiB or less is not split off a large block; a freed segment stays
    reserved; a 4 MiB request on stream 1 cannot use stream 0's cached 30 MiB and makes a 20 MiB segment."""
    from gpuflame.simulate.explain import breakdown

    a = Allocator(DEFAULTS)
    a.malloc(8 * MiB)  # a 20 MiB segment, split: 12 MiB free beside it
    a.malloc(19 * MiB + 512 * 1024)  # a 20 MiB segment: the 512 KiB rest stays in the block
    a.free(a.malloc(30 * MiB))  # a 30 MiB segment, whole and free
    a.malloc(4 * MiB, stream=1)  # a 20 MiB segment on stream 1, 16 MiB free beside it
    assert breakdown(a) == {
        "unsplit": 512 * 1024,
        "unreleased": 30 * MiB,
        "split_free": 12 * MiB + 16 * MiB,
        "pages": 0,
        "other_stream": 20 * MiB,
    }
    assert a.reserved - a.allocated == 30 * MiB + 28 * MiB


def test_expandable_pages_rounded_are_measured():
    """3 MiB in an expandable segment maps one 20 MiB page: 17 MiB of it rounded up, next to unmapped space."""
    from gpuflame.simulate.explain import breakdown

    a = Allocator(parse_alloc_conf("expandable_segments:True"))
    a.malloc(3 * MiB)
    assert breakdown(a)["pages"] == 17 * MiB and a.reserved == 20 * MiB
