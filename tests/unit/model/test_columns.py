"""A profile's samples held as columns (model/columns.py): the same profile to every reader, built only when asked."""

from __future__ import annotations

import random

import numpy as np
import pytest

from gpuflame.model import columns
from gpuflame.model.profile import Frame, Profile, Sample, SampleType

TYPES = [SampleType("peak_space", "bytes"), SampleType("alloc_space", "bytes")]


def _listed(seed: int, n: int = 300) -> Profile:
    """Samples of every shape: empty stacks, repeated frames, zero and negative values, shared label sets."""
    rng = random.Random(seed)
    frames = [Frame(f"f{i}", f"/m{i % 3}.py", i + 1) for i in range(40)]
    label_sets = [(), (("device", "cuda:0"), ("pid", "7")), (("device", "cuda:1"),), (("category", "kv_cache"),)]
    samples = [
        Sample(
            tuple(rng.randrange(len(frames)) for _ in range(rng.randint(0, 12))),
            (rng.choice([0, 5, -3, 1 << 50]), rng.choice([0, 9])),
            rng.choice(label_sets),
        )
        for _ in range(n)
    ]
    return Profile(sample_types=list(TYPES), frames=frames, samples=samples)


def _held(profile: Profile) -> Profile:
    """The same profile with its samples handed over as columns, as the pprof reader does."""
    out = Profile(sample_types=list(TYPES), frames=list(profile.frames))
    out.set_columns(columns.from_samples(profile.samples, len(TYPES)))
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_columns_become_the_same_samples(seed: int) -> None:
    listed = _listed(seed)
    held = _held(listed)
    assert "_columns" in held.__dict__
    assert held.samples == listed.samples
    assert "_columns" not in held.__dict__  # built once, then the list is the profile's
    assert held == listed


def test_label_set_totals_and_the_numbers_read_from_them_agree_without_building_samples() -> None:
    listed, held = _listed(4), _held(_listed(4))
    assert held.label_set_totals() == listed.label_set_totals()
    by_hand: dict = {}
    for s in listed.samples:
        sums, nonzero = by_hand.setdefault(s.labels, ([0, 0], [False, False]))
        for k, v in enumerate(s.values):
            sums[k] += v
            nonzero[k] |= v != 0
    assert [(r.labels, list(r.totals), list(r.nonzero)) for r in listed.label_set_totals()] == [
        (labels, sums, nonzero) for labels, (sums, nonzero) in by_hand.items()
    ]
    for index in range(len(TYPES)):
        assert held.device_totals(index) == listed.device_totals(index)
    assert held.peak_units() == listed.peak_units()
    assert held.peak_description("peak_space") == listed.peak_description("peak_space")
    assert "_columns" in held.__dict__  # none of these asked for a stack


def test_label_set_totals_past_int64_stay_exact() -> None:
    big = [Sample((0,), ((1 << 62) + k, -1)) for k in range(3)]
    held = _held(Profile(sample_types=list(TYPES), frames=[Frame("f")], samples=big))
    assert held.label_set_totals()[0].totals == (3 * (1 << 62) + 3, -3)


def test_label_set_totals_of_the_lowest_int64_stay_exact() -> None:
    """-2**63 twice: numpy's abs of it is -2**63 itself, so a bound taken with abs would sum in int64 and wrap."""
    low = [Sample((0,), (-(1 << 63), 1)) for _ in range(2)]
    held = _held(Profile(sample_types=list(TYPES), frames=[Frame("f")], samples=low))
    assert held.label_set_totals()[0].totals == (-(1 << 64), 2)


def test_setting_samples_drops_the_columns() -> None:
    held = _held(_listed(5))
    held.samples = [Sample((0,), (1, 2))]
    assert "_columns" not in held.__dict__
    assert held.samples == [Sample((0,), (1, 2))]
    assert held.columns().lengths.tolist() == [1]


def test_columns_of_a_listed_profile_round_trip() -> None:
    listed = _listed(6)
    made = listed.columns()
    assert made.lengths.tolist() == [len(s.stack) for s in listed.samples]
    assert made.frames.tolist() == [f for s in listed.samples for f in s.stack]
    assert [made.label_sets[i] for i in made.label_ids.tolist()] == [s.labels for s in listed.samples]
    assert made.to_samples() == listed.samples


def test_the_verbs_work_on_a_profile_held_as_columns() -> None:
    listed, held = _listed(7), _held(_listed(7))
    assert held.compact() == listed.compact()
    assert held.totals() == listed.totals()
    assert len(held) == len(listed.samples)


def test_a_profile_without_samples_has_empty_columns() -> None:
    made = Profile(sample_types=list(TYPES)).columns()
    assert made.lengths.shape == (0,) and made.values.shape == (0, 2) and made.label_sets == []
    assert made.to_samples() == []
    assert columns.stack_tuples(np.zeros(0, dtype=np.int64), []) == []


def test_a_read_while_the_list_is_being_built_sees_every_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    """serve answers requests on threads: one reading ``samples`` while another builds the list must not see []."""
    listed = _listed(8)
    held = _held(listed)
    seen: list[list[Sample]] = []
    build = columns.SampleColumns.to_samples
    calls = []

    def build_and_look(self: columns.SampleColumns) -> list[Sample]:
        calls.append(self)
        if len(calls) == 1:  # the other thread's read, in the middle of this one's
            seen.append(list(held.samples))
        return build(self)

    monkeypatch.setattr(columns.SampleColumns, "to_samples", build_and_look)
    assert held.samples == listed.samples
    assert seen == [listed.samples]


def test_samples_of_a_profile_without_sample_types_make_columns() -> None:
    """A file may declare no sample types (the commands then say so): the columns still hold its samples."""
    made = columns.from_samples([Sample((0,), ()), Sample((), ())], 0)
    assert made.values.shape == (2, 0)
    assert made.to_samples() == [Sample((0,), ()), Sample((), ())]


def test_totals_of_columns_past_int64_stay_exact() -> None:
    big = [Sample((0,), ((1 << 62) + k, -(1 << 62))) for k in range(3)] + [Sample((), (-(1 << 63), 0))]
    listed = Profile(sample_types=list(TYPES), frames=[Frame("f")], samples=big)
    held = _held(listed)
    assert held.totals() == listed.totals() == {"peak_space": 3 + 3 * (1 << 62) - (1 << 63), "alloc_space": -3 << 62}
    assert "_columns" in held.__dict__


def test_label_set_totals_of_columns_are_summed_once_and_follow_the_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    """report reads them five times (peak words, devices, processes...): one sum, and a copy each caller may change."""
    listed, held = _listed(9), _held(_listed(9))
    sums = columns.SampleColumns.label_set_totals
    calls = []
    monkeypatch.setattr(columns.SampleColumns, "label_set_totals", lambda self: calls.append(1) or sums(self))
    first = held.label_set_totals()
    first.clear()
    assert held.label_set_totals() == listed.label_set_totals()
    assert len(calls) == 1
    held.samples = held.samples[:1]  # the list replaces the columns: the sums are of the list
    assert held.label_set_totals() == Profile(sample_types=list(TYPES), samples=listed.samples[:1]).label_set_totals()


def test_label_keys_and_values_of_columns_are_read_without_samples() -> None:
    listed, held = _listed(10), _held(_listed(10))
    assert held.label_keys() == listed.label_keys() == ["category", "device", "pid"]
    assert held.label_values("device") == listed.label_values("device") == ["cuda:0", "cuda:1"]
    assert held.has_label("category") and not held.has_label("rank") and listed.has_label("pid")
    assert held.columns().leaf_ids().tolist() == [s.stack[0] if s.stack else -1 for s in listed.samples]
    assert "_columns" in held.__dict__
