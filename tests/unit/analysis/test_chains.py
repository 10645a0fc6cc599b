"""explain: call chains into a function, read bottom-up, checked against the samples."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuflame.analysis.chains import NoSuchFunctionError, explain, match_functions
from gpuflame.analysis.tree import build_tree
from gpuflame.errors import GpuflameError
from gpuflame.model import Frame, Profile, memory_sample_types
from tests.helpers.guide import GUIDE_KV_CHAIN, GiB, guide_profile


def guide_tree():
    profile = guide_profile()
    return profile, build_tree(profile, profile.pick_type())


@pytest.mark.parametrize(
    "query",
    [
        "GPUModelRunner._allocate_kv_cache_tensors",
        "GPUModelRunner > _allocate_kv_cache_tensors",
        "gpumodelrunner>_allocate_kv_cache_tensors",
        "_allocate_kv_cache_tensors",
        "allocate_kv",
    ],
)
def test_the_guides_example_chain_in_either_spelling(query):
    _, tree = guide_tree()
    ex = explain(tree, query)
    assert [f.name for f in ex.functions] == ["GPUModelRunner > _allocate_kv_cache_tensors"]
    assert len(ex.chains) == 1 and ex.more_chains == 0
    chain = ex.chains[0]
    assert [s.frame.name for s in chain.steps] == GUIDE_KV_CHAIN
    assert chain.total == chain.self == 55 * GiB == ex.total == ex.self
    # orchestration below the allocation has zero self
    assert all(s.self == 0 for s in chain.steps[:-1])
    assert chain.steps[0].total > chain.total  # the entry point holds the other branches too


def test_whole_name_match_wins_over_substring():
    profile = Profile(sample_types=memory_sample_types(inuse=False, alloc=False))
    profile.add([Frame("Model > forward"), Frame("main")], [5, 1])
    profile.add([Frame("Model > forward_hook"), Frame("main")], [7, 1])
    frames = build_tree(profile, 0).frames
    assert [frames[c - 1].name for c in match_functions(frames, "forward")] == ["Model > forward"]
    assert [frames[c - 1].name for c in match_functions(frames, "forw")] == [
        "Model > forward",
        "Model > forward_hook",
    ]


def test_chain_stops_at_the_outermost_recursion_and_lists_callees():
    profile = Profile(sample_types=memory_sample_types(inuse=False, alloc=False))
    main, rec, a, b = Frame("main"), Frame("Tree > visit"), Frame("alloc_a"), Frame("alloc_b")
    profile.add([a, rec, rec, main], [100, 1])
    profile.add([b, rec, main], [30, 1])
    profile.add([rec, main], [5, 1])
    profile.add([a, main], [1000, 1])  # not through visit
    ex = explain(build_tree(profile, 0), "Tree.visit")
    assert ex.total == 135 and ex.self == 5
    (chain,) = ex.chains
    assert [s.frame.name for s in chain.steps] == ["main", "Tree > visit"]
    assert (chain.total, chain.self) == (135, 5)
    assert [(c.frame.name, c.total) for c in chain.callees] == [("Tree > visit", 100), ("alloc_b", 30)]
    assert chain.other_callees == 0


def test_limit_keeps_the_widest_chains_and_counts_the_rest():
    profile = Profile(sample_types=memory_sample_types(inuse=False, alloc=False))
    target = Frame("target")
    for i in range(8):
        profile.add([target, Frame(f"caller{i}"), Frame("main")], [(i + 1) * 10, 1])
    ex = explain(build_tree(profile, 0), "target", limit=3)
    assert [c.total for c in ex.chains] == [80, 70, 60]
    assert ex.more_chains == 5 and ex.more_total == 10 + 20 + 30 + 40 + 50
    assert ex.total == sum(c.total for c in ex.chains) + ex.more_total


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.lists(st.sampled_from("abcd"), min_size=1, max_size=6), st.integers(1, 99)), min_size=1))
def test_chains_partition_the_functions_total(rows):
    profile = Profile(sample_types=memory_sample_types(inuse=False, alloc=False))
    for names, v in rows:
        profile.add([Frame(n) for n in names], [v, 1])
    tree = build_tree(profile, 0)
    if not any("b" in names for names, _ in rows):
        with pytest.raises(NoSuchFunctionError):
            explain(tree, "b")
        return
    ex = explain(tree, "b", limit=1000)
    through = sum(v for names, v in rows if "b" in names)
    assert ex.total == through == sum(c.total for c in ex.chains)
    # self is at the chains' ends (a b that no other b calls); a b that b calls holds nested_self
    assert ex.self == sum(v for names, v in rows if names[0] == "b" and "b" not in names[1:])
    assert ex.self + ex.nested_self == sum(v for names, v in rows if names[0] == "b")
    assert ex.self == sum(c.self for c in ex.chains)
    for chain in ex.chains:
        assert chain.steps[-1].frame.name == "b"
        assert all(s.frame.name != "b" for s in chain.steps[:-1])
    chains = {tuple(s.frame.name for s in c.steps) for c in ex.chains}
    assert len(chains) == len(ex.chains), "chains are distinct"


def test_no_match_suggests_close_names():
    _, tree = guide_tree()
    with pytest.raises(GpuflameError) as err:
        explain(tree, "GPUModelRuner.alocate_kv_cache")
    message = str(err.value)
    assert "\n" not in message
    assert "GPUModelRunner > _allocate_kv_cache_tensors" in message
    with pytest.raises(GpuflameError, match="no function matches 'qqqq'"):
        explain(tree, "qqqq")


def test_explanation_json_is_exact():
    _, tree = guide_tree()
    data = explain(tree, "LlamaMLP.__init__").to_dict()
    assert data["total"] == 14 * GiB
    steps = data["chains"][0]["steps"]
    assert steps[-1]["name"] == "LlamaMLP > __init__" and steps[-1]["line"] == 80
    assert steps[-2]["self"] == 300 * (1 << 20)  # LlamaForCausalLM's own allocation


def test_a_self_no_chain_reaches_is_not_called_the_functions_self() -> None:
    """Two classes' `forward` merged by name (no source): the outer one's chain ends at it; what the inner one
    allocates is within that chain's total, not the outer's self, and the header says so apart."""
    profile = Profile(sample_types=memory_sample_types(inuse=False, alloc=False))
    profile.add(
        [
            Frame("Linear > forward", "/t/linear.py", 1),
            Frame("Module > _call_impl", "/t/module.py", 9),
            Frame("forward", "/m/opt.py", 800),
            Frame("<module>", "/app.py", 1),
        ],
        [9000, 1],
    )
    profile.add([Frame("forward", "/m/opt.py", 810), Frame("<module>", "/app.py", 1)], [100, 1])
    ex = explain(build_tree(profile, 0), "forward")
    [chain] = ex.chains
    assert chain.steps[-1].frame.name == "forward" and chain.steps[-1].self == 100
    assert (ex.total, ex.self, ex.nested_self) == (9100, 100, 9000)
