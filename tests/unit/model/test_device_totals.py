"""A profile's total per device, summed over every label set that names the device."""

from __future__ import annotations

from gpuflame.model.profile import Profile, Sample, SampleType


def test_totals_sum_every_label_set_of_a_device() -> None:
    profile = Profile(
        sample_types=[SampleType("peak_space", "bytes"), SampleType("alloc_space", "bytes")],
        samples=[
            Sample((0,), (5, 1), (("device", "cuda:0"), ("pid", "1"))),
            Sample((0,), (7, 2), (("device", "cuda:0"), ("pid", "2"))),
            Sample((0,), (11, 4), (("device", "cuda:1"),)),
            Sample((0,), (13, 8), ()),
            Sample((0,), (17, 16), (("device", ""),)),
        ],
    )
    assert profile.device_totals(0) == {"cuda:0": 12, "cuda:1": 11, "": 30}
    assert profile.device_totals(1) == {"cuda:0": 3, "cuda:1": 4, "": 24}


def test_a_repeated_device_label_counts_where_sample_label_reads_it() -> None:
    sample = Sample((0,), (3,), (("device", "cuda:0"), ("device", "cuda:1")))
    profile = Profile(sample_types=[SampleType("peak_space", "bytes")], samples=[sample])
    assert profile.device_totals(0) == {sample.label("device"): 3}
