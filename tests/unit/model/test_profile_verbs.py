"""The model's verbs: merge, focus, ignore, hide, drop_small, prune_framework, diff, compact,
select_labels."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuflame.errors import GpuflameError
from gpuflame.model import (
    Frame,
    Profile,
    SampleType,
    diff,
    drop_small,
    focus,
    hide,
    ignore,
    memory_sample_types,
    merge,
    negate,
    prune_framework,
    select_labels,
    select_types,
)
from gpuflame.model.profile import SYNTHETIC, TRAMPOLINE_KIND

PEAK = SampleType("peak_space", "bytes")
ALLOC = SampleType("alloc_space", "bytes")

main = Frame("<module>", "train.py", 1)
train = Frame("Trainer > train", "train.py", 20)
fwd = Frame("LlamaMLP > forward", "model.py", 40)
call_impl = Frame("Module > _call_impl", "/venv/site-packages/torch/nn/modules/module.py", 1500)
linear = Frame("Linear > forward", "/venv/site-packages/torch/nn/modules/linear.py", 116)
empty = Frame("empty", "/venv/site-packages/torch/_refs/__init__.py", 4000)
tramp = Frame("<interpreter trampoline>", kind=TRAMPOLINE_KIND)
cached = Frame("<cached free blocks>", kind=SYNTHETIC)


def stacks(profile: Profile) -> Counter:
    """{(leaf-first frame names, labels): value per type} — what a profile says, frame ids aside."""
    out: Counter = Counter()
    for s in profile.samples:
        out[(tuple(f.name for f in profile.stack_frames(s)), s.labels)] += s.values[0]
    return +out


def small_profile() -> Profile:
    p = Profile(sample_types=[PEAK, ALLOC])
    p.add([empty, linear, call_impl, fwd, call_impl, train, tramp, main], [100, 300], {"pid": 1})
    p.add([fwd, train, main], [10, 30], {"pid": 2})
    p.add([cached], [50, 0], {"pid": 1})
    return p


# -- merge ---------------------------------------------------------------------


def test_merge_unions_types_frames_labels_and_comments():
    a = Profile(sample_types=[PEAK])
    a.add([fwd, main], [5])
    a.comments.append("from a")
    b = Profile(sample_types=[ALLOC, PEAK])
    b.add([fwd, main], [7, 3], {"pid": 9})
    b.comments.append("from a")
    m = merge([a, b], labels=[{"rank": 0}, {"rank": 1, "pid": 1}])
    assert m.type_names() == ["peak_space", "alloc_space"]
    assert m.comments == ["from a"]
    assert len(m.frames) == 2
    rows = {s.labels: s.values for s in m.samples}
    assert rows[(("rank", "0"),)] == (5, 0)
    # a sample's own pid wins over the added one
    assert rows[(("pid", "9"), ("rank", "1"))] == (3, 7)
    assert m.totals() == {"peak_space": 8, "alloc_space": 7}


def test_merge_needs_one_label_set_per_profile():
    with pytest.raises(ValueError):
        merge([Profile(sample_types=[PEAK])], labels=[{}, {}])


# -- focus, ignore, hide, select_labels -------------------------------------


def test_focus_trims_callers_and_keeps_values():
    p = small_profile()
    f = focus(p, "LlamaMLP.forward")
    assert stacks(f) == Counter(
        {
            (
                ("empty", "Linear > forward", "Module > _call_impl", "LlamaMLP > forward"),
                (("pid", "1"),),
            ): 100,
            (("LlamaMLP > forward",), (("pid", "2"),)): 10,
        }
    )
    untrimmed = focus(p, "llamamlp > forward", trim=False)
    assert sum(s.values[0] for s in untrimmed.samples) == 110
    assert all(p.stack_frames(s)[-1] == main for s in untrimmed.samples)


def test_focus_on_recursion_uses_the_outermost_frame():
    p = Profile(sample_types=[PEAK])
    p.add([call_impl, fwd, call_impl, main], [4])
    f = focus(p, "_call_impl")
    assert stacks(f) == Counter({(("Module > _call_impl", "LlamaMLP > forward", "Module > _call_impl"), ()): 4})


def test_ignore_drops_samples_through_a_frame():
    p = small_profile()
    assert stacks(ignore(p, "<cached free blocks>")) == Counter(
        {k: v for k, v in stacks(p).items() if "<cached free blocks>" not in k[0]}
    )
    assert sum(s.values[0] for s in ignore(p, "Trainer.train").samples) == 50


def test_hide_removes_frames_and_keeps_bytes():
    p = small_profile()
    h = hide(p, "<interpreter trampoline>")
    assert all(tramp not in h.stack_frames(s) for s in h.samples)
    assert h.totals() == p.totals()
    gone = hide(p, "cached")
    assert [h.stack for h in gone.samples if h.values[0] == 50] == [()]  # bytes stay, stack empty


def test_select_labels():
    p = small_profile()
    assert sum(s.values[0] for s in select_labels(p, "pid", {"1"}).samples) == 150
    assert sum(s.values[0] for s in select_labels(p, "pid", {"1", "2"}).samples) == 160
    assert select_labels(p, "device", {"cuda:0"}).samples == []


def test_patterns_accept_regex_and_both_spellings():
    p = small_profile()
    assert len(focus(p, "^trainer.train$").samples) == 2
    assert len(focus(p, "Trainer > train").samples) == 2
    assert len(focus(p, "trainer.tra").samples) == 2


# -- drop_small ------------------------------------------------------------------


def naive_drop_small(profile: Profile, min_value: int, index: int) -> Counter:
    """The definition, prefix by prefix: cut at the root-most prefix whose total is under min."""
    totals: Counter = Counter()
    for s in profile.samples:
        names = tuple(f.name for f in reversed(profile.stack_frames(s)))
        for d in range(1, len(names) + 1):
            totals[names[:d]] += s.values[index]
    out: Counter = Counter()
    for s in profile.samples:
        names = tuple(f.name for f in reversed(profile.stack_frames(s)))
        keep = len(names)
        for d in range(1, len(names) + 1):
            if abs(totals[names[:d]]) < min_value:
                keep = d - 1
                break
        cut = names[:keep] if keep == len(names) else names[:keep] + ("<frames under 32 B>",)
        out[(tuple(reversed(cut)), s.labels)] += s.values[0]
    return +out


@settings(max_examples=120, deadline=None)
@given(
    st.lists(
        st.tuples(st.lists(st.sampled_from([main, train, fwd, linear]), max_size=5), st.integers(-40, 100)),
        max_size=20,
    )
)
def test_drop_small_matches_its_definition(rows):
    p = Profile(sample_types=[PEAK, ALLOC])
    for stack, v in rows:
        p.add(stack, [v, 1])
    out = drop_small(p, 32, 0)
    assert stacks(out) == naive_drop_small(p, 32, 0)
    assert out.totals() == p.totals()


def test_drop_small_labels_the_cut():
    p = small_profile()
    out = drop_small(p, 60, 0)
    names = {tuple(f.name for f in out.stack_frames(s)) for s in out.samples}
    # <module> -> Trainer > train holds 10 B (the 100 B stack goes through the trampoline)
    assert ("<frames under 60 B>", "<module>") in names
    assert ("<frames under 60 B>",) in names  # <cached free blocks>: 50 B at the root
    small = next(f for f in out.frames if f.name.startswith("<frames under"))
    assert small.kind == SYNTHETIC


# -- prune_framework ---------------------------------------------------------------


def test_prune_framework_keeps_the_api_the_user_called():
    p = small_profile()
    pruned = prune_framework(p)
    got = {tuple(f.name for f in pruned.stack_frames(s)) for s in pruned.samples}
    assert (
        "Linear > forward",  # the innermost class method of the leaf run: what the memory is
        "Module > _call_impl",  # torch entry called by user code
        "LlamaMLP > forward",
        "Trainer > train",
        "<interpreter trampoline>",
        "<module>",
    ) in got
    assert pruned.totals() == p.totals()
    dropped = prune_framework(p, keep_entry=False)
    assert ("LlamaMLP > forward", "Trainer > train", "<interpreter trampoline>", "<module>") in {
        tuple(f.name for f in dropped.stack_frames(s)) for s in dropped.samples
    }


def test_prune_framework_leaves_framework_only_stacks_whole():
    p = Profile(sample_types=[PEAK])
    p.add([empty, linear], [3])
    assert stacks(prune_framework(p)) == stacks(p)
    other = prune_framework(small_profile(), ["jax"])
    assert stacks(other) == stacks(small_profile())


# -- diff, negate, select_types, compact -------------------------------------------


def test_diff_is_new_minus_base_per_stack():
    base = small_profile()
    new = Profile(sample_types=[ALLOC, PEAK])
    new.add([fwd, train, main], [30, 25], {"pid": 2})  # grew by 15 in peak
    new.add([train, main], [0, 7], {"pid": 2})  # new stack
    d = diff(base, new)
    assert d.type_names() == ["alloc_space", "peak_space"]
    assert d.comments == ["diff: new minus base"]
    rows = {(tuple(f.name for f in d.stack_frames(s)), s.labels): s.values for s in d.samples}
    assert rows[(("LlamaMLP > forward", "Trainer > train", "<module>"), (("pid", "2"),))] == (0, 15)
    assert rows[(("Trainer > train", "<module>"), (("pid", "2"),))] == (0, 7)
    assert rows[(("<cached free blocks>",), (("pid", "1"),))] == (0, -50)
    assert len(rows) == 4  # unchanged stacks cancel out
    assert sum(v[1] for v in rows.values()) == new.totals()["peak_space"] - base.totals()["peak_space"]


def test_diff_without_common_types():
    with pytest.raises(GpuflameError, match="share no sample type"):
        diff(Profile(sample_types=[PEAK]), Profile(sample_types=[ALLOC]))


def test_negate_and_select_types():
    p = small_profile()
    assert negate(p).totals() == {k: -v for k, v in p.totals().items()}
    only = select_types(p, [ALLOC])
    assert only.type_names() == ["alloc_space"]
    assert only.totals() == {"alloc_space": p.totals()["alloc_space"]}


def test_compact_merges_equal_stacks_and_drops_unused_frames():
    p = Profile(sample_types=memory_sample_types(inuse=False, alloc=False))
    p.add([fwd, main], [1, 1], {"pid": 1})
    p.add([fwd, main], [2, 1], {"pid": 1})
    p.add([fwd, main], [4, 1], {"pid": 2})
    p.add([train, main], [0, 0])
    p.default_type = "peak_space"
    p.comments.append("note")
    c = p.compact()
    assert sorted((s.labels, s.values) for s in c.samples) == [
        ((("pid", "1"),), (3, 2)),
        ((("pid", "2"),), (4, 1)),
    ]
    assert c.frames == [fwd, main]
    assert c.default_type == "peak_space" and c.comments == ["note"]
    assert c.totals() == p.totals()


few_frames = st.builds(Frame, name=st.sampled_from(["f", "g", "h"]), line=st.integers(0, 2))


@settings(max_examples=60, deadline=None)
@given(st.lists(few_frames, max_size=3), st.lists(few_frames, max_size=12))
def test_frame_ids_in_bulk_are_frame_id_one_by_one(before, frames):
    """A reader's bulk frame_ids (one dict pass when every frame is new) gives frame_id's ids and table."""
    bulk, one = Profile(sample_types=[]), Profile(sample_types=[])
    for p in (bulk, one):
        p.frame_ids(before)
    assert bulk.frame_ids(frames) == [one.frame_id(f) for f in frames]
    assert bulk.frames == one.frames and len(set(bulk.frames)) == len(bulk.frames)
    assert bulk.frame_ids(frames) == one.frame_ids(frames)  # asked again: nothing new
