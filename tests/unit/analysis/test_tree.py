"""The flame tree against a naive tree built by walking every sample's stack."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuflame.analysis.prefix_tree import prefix_tree
from gpuflame.analysis.tree import NO_STACK, FlameTree, build_table, build_tree, group_frame
from gpuflame.errors import GpuflameError
from gpuflame.model import Frame, Profile, SampleType
from gpuflame.model.functions import function_frames
from gpuflame.model.profile import SYNTHETIC

FRAMES = [Frame(name, "m.py", i + 1) for i, name in enumerate(["main", "A > f", "B > g", "h", "zeta", "alpha"])]
TYPES = [SampleType("peak_space", "bytes"), SampleType("alloc_space", "bytes")]


def naive_tree(profile: Profile, type_index: int, group_by: str | None = None) -> dict[tuple[Frame, ...], list[int]]:
    """{root-first frame path: [self, total]} from the samples, one stack at a time."""
    nodes: dict[tuple[Frame, ...], list[int]] = defaultdict(lambda: [0, 0])
    bars = function_frames(profile.frames)  # a bar is a function, at its def line
    for s in profile.samples:
        v = s.values[type_index]
        if not v:
            continue
        path = [bars[i] for i in reversed(s.stack)] or [NO_STACK]
        if group_by:
            path.insert(0, group_frame(group_by, s.label(group_by)))
        for depth in range(len(path)):
            node = nodes[tuple(path[: depth + 1])]
            node[1] += v
            if depth == len(path) - 1:
                node[0] += v
    return dict(nodes)


def tree_as_dict(tree: FlameTree) -> dict[tuple[Frame, ...], list[int]]:
    out: dict[tuple[Frame, ...], list[int]] = {}
    for node in tree.walk():
        path = tuple(tree.frame(n) for n in tree.path(node))
        assert path not in out, "a path must be one node"
        out[path] = [tree.node_self(node), tree.node_total(node)]
    return out


stacks = st.lists(st.sampled_from(range(len(FRAMES))), max_size=7)
values = st.sampled_from([0, 1, 7, 4096, 1 << 40, -5])
samples = st.lists(st.tuples(stacks, values, values, st.sampled_from(["0", "1"])), max_size=25)


def make_profile(rows: list[tuple[list[int], int, int, str]]) -> Profile:
    profile = Profile(sample_types=TYPES)
    for stack, peak, alloc, device in rows:
        profile.add([FRAMES[i] for i in stack], [peak, alloc], {"device": device})
    return profile


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(samples)
def test_tree_matches_naive_walk(rows):
    profile = make_profile(rows)
    for index in (0, 1):
        assert tree_as_dict(build_tree(profile, index)) == naive_tree(profile, index)


@settings(max_examples=60, deadline=None)
@given(samples)
def test_grouped_tree_matches_naive_walk(rows):
    profile = make_profile(rows)
    assert tree_as_dict(build_tree(profile, 0, group_by="device")) == naive_tree(profile, 0, "device")


@settings(max_examples=60, deadline=None)
@given(samples)
def test_levels_are_consistent(rows):
    """Vectorised level arrays agree with the node-by-node view."""
    tree = build_tree(make_profile(rows), 0)
    assert sum(tree.node_total(r) for r in tree.roots()) == tree.total
    for depth in range(tree.depth - 1):
        lo, hi = tree.children_range(depth)
        up = tree.level(depth + 1)
        child_totals = [int(up.total[a:b].sum()) for a, b in zip(lo, hi, strict=True)]
        selfs = tree.level_self(depth)
        assert (tree.level(depth).total == selfs + np.array(child_totals, dtype=np.int64)).all()
    assert tree.node_count() == len(list(tree.walk()))


def test_children_in_name_order_whatever_the_frame_table_order():
    profile = Profile(sample_types=TYPES)
    root = Frame("main", "m.py", 1)
    for name in ["zeta", "alpha", "mid"]:
        profile.add([Frame(name, "m.py", 2), root], [10, 10])
    tree = build_tree(profile, 0)
    (main,) = tree.roots()
    assert [tree.frame(c).name for c in tree.children(main)] == ["alpha", "mid", "zeta"]
    assert tree.node_total(main) == 30 and tree.node_self(main) == 0


def test_parent_and_path_read_bottom_up():
    profile = Profile(sample_types=TYPES)
    a, b, c = (Frame(n, "m.py", 1, start_line=1) for n in "abc")
    profile.add([c, b, a], [5, 0])  # leaf first: a calls b calls c
    profile.add([b, a], [3, 0])
    tree = build_tree(profile, 0)
    leaf = next(n for n in tree.walk() if tree.frame(n) == c)
    assert [tree.frame(n) for n in tree.path(leaf)] == [a, b, c]
    mid = tree.parent(leaf)
    assert mid is not None and tree.frame(mid) == b
    assert (tree.node_self(mid), tree.node_total(mid)) == (3, 8)
    assert tree.parent(tree.roots()[0]) is None


def test_zero_samples_and_empty_profile():
    profile = Profile(sample_types=TYPES)
    assert build_tree(profile, 0).depth == 0
    assert build_tree(profile, 0).roots() == []
    profile.add([Frame("a")], [0, 5])
    tree = build_tree(profile, 0)
    assert tree.total == 0 and tree.roots() == []
    assert build_tree(profile, 1).total == 5


def test_empty_stack_is_kept_as_unknown():
    profile = Profile(sample_types=TYPES)
    profile.add([], [9, 0])
    profile.add([Frame("a")], [1, 0])
    tree = build_tree(profile, 0)
    names = {tree.frame(r).name: tree.node_total(r) for r in tree.roots()}
    assert names == {"<unknown>": 9, "a": 1}
    assert tree.frame(next(r for r in tree.roots() if tree.node_total(r) == 9)).kind == SYNTHETIC


def test_duplicate_frames_in_the_table_are_one_function():
    f = Frame("dup", "d.py", 3, start_line=3)
    profile = Profile(sample_types=TYPES, frames=[f, Frame("x"), f])
    profile.samples = []
    from gpuflame.model.profile import Sample

    profile.samples = [Sample((0,), (4, 0)), Sample((2,), (6, 0))]
    tree = build_tree(profile, 0)
    assert [(tree.frame(r), tree.node_total(r)) for r in tree.roots()] == [(f, 10)]


@pytest.mark.slow
def test_wide_frame_tables_use_four_byte_codes():
    profile = Profile(sample_types=TYPES)
    frames = [Frame(f"f{i:05d}") for i in range(70_000)]
    for i in range(0, 70_000, 2):
        profile.add([frames[i], frames[-1 - i]], [i + 1, 0])
        profile.add([frames[i + 1]], [1, 0])
    table = build_table(profile, 0)
    assert table.codes.dtype.itemsize == 4
    assert tree_as_dict(FlameTree(table)) == naive_tree(profile, 0)


def test_values_past_int64_are_refused():
    profile = Profile(sample_types=TYPES)
    profile.add([Frame("a")], [2**62, 0])
    profile.add([Frame("b")], [2**62, 0])
    with pytest.raises(GpuflameError, match="64-bit"):
        build_tree(profile, 0)


def test_exact_totals_beyond_float_precision():
    profile = Profile(sample_types=TYPES)
    big = 2**60 + 1
    profile.add([Frame("a")], [big, 0])
    profile.add([Frame("b"), Frame("a")], [big, 0])
    tree = build_tree(profile, 0)
    assert not tree.table.exact_float
    assert tree.node_total(tree.roots()[0]) == 2 * big


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 4), max_size=6), max_size=14), st.booleans())
def test_prefix_tree_holds_every_stack_once(stacks, leaf_first):
    lengths = np.array([len(s) for s in stacks], dtype=np.intp)
    given_order = [s[::-1] if leaf_first else s for s in stacks]  # leaf first: as pprof holds a stack
    tree = prefix_tree(lengths, np.array([c for s in given_order for c in s], dtype=np.int32), leaf_first)
    for i, stack in enumerate(stacks):  # each stack reads back from its node to the root
        node, walked = int(tree.node_of_stack[i]), []
        while node > 0:
            walked.append(int(tree.code[node]))
            node = int(tree.parent[node])
        assert walked[::-1] == stack
    prefixes = {tuple(s[:k]) for s in stacks for k in range(1, len(s) + 1)}
    assert len(tree.parent) == len(prefixes) + 1  # one node a distinct prefix, and the root
    assert all(tree.parent[n] < n for n in range(1, len(tree.parent)))  # parents first
    children = [(int(p), int(c)) for p, c in zip(tree.parent[1:], tree.code[1:], strict=True)]
    assert children == sorted(children)  # depth by depth, each node's children in code order


def test_the_package_names_load_on_first_use() -> None:
    """gpuflame.analysis's names come from analysis/tree.py when asked (numpy only then); others are refused."""
    import gpuflame.analysis as analysis
    from gpuflame.analysis import tree

    assert (analysis.FlameTree, analysis.build_tree) == (tree.FlameTree, tree.build_tree)
    with pytest.raises(AttributeError):
        analysis.no_such_name  # noqa: B018


def test_prefix_tree_compares_sorted_stacks_piece_by_piece_with_the_same_result(monkeypatch) -> None:
    """analysis/prefix_tree.py compares neighbours PREFIX_ROWS at a time: pieces of 3 give what one piece gives."""
    from gpuflame.analysis import prefix_tree as module

    rng = np.random.default_rng(7)
    lengths = rng.integers(0, 7, 200)
    flat = rng.integers(0, 4, int(lengths.sum())).astype(np.int32)
    whole = prefix_tree(lengths, flat, leaf_first=True)
    monkeypatch.setattr(module, "PREFIX_ROWS", 3)
    pieces = prefix_tree(lengths, flat, leaf_first=True)
    for a, b in zip(whole, pieces, strict=True):
        assert a.tolist() == b.tolist()
    assert len(whole.parent) > 50  # a tree with shared prefixes, not a list of roots


@pytest.mark.parametrize("piece_rows", [3, 1 << 16])
def test_prefix_tree_of_ids_read_through_a_code_table_is_the_tree_of_their_codes(monkeypatch, piece_rows) -> None:
    """code_of: the page's frame ids looked up as function rows a piece at a time, as if looked up first."""
    from gpuflame.analysis import prefix_tree as module

    monkeypatch.setattr(module, "PREFIX_ROWS", piece_rows)
    rng = np.random.default_rng(11)
    lengths = rng.integers(0, 6, 120)
    ids = rng.integers(0, 9, int(lengths.sum())).astype(np.int32)
    code_of = np.array([0, 1, 1, 2, 3, 3, 3, 4, 5], dtype=np.int32)  # frames of one function share a code
    looked_up = prefix_tree(lengths, ids, leaf_first=True, code_of=code_of)
    given = prefix_tree(lengths, code_of[ids], leaf_first=True)
    for a, b in zip(looked_up, given, strict=True):
        assert a.tolist() == b.tolist()


@pytest.mark.parametrize("bound", [0, 1 << 30], ids=["bands of columns", "whole rows"])
@pytest.mark.parametrize("dtype", [">u2", ">u4"])
def test_permute_rows_puts_every_row_where_the_order_says(
    bound: int, dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpuflame.analysis import tree

    monkeypatch.setattr(tree, "PERMUTE_BYTES", bound)
    monkeypatch.setattr(tree, "CHUNK_CELLS", 7)  # bands of one column
    rng = np.random.default_rng(5)
    codes = rng.integers(0, 60000, size=(50, 9)).astype(dtype)
    order = rng.permutation(50)
    expected = codes[order].copy()
    tree.permute_rows(codes, order)
    assert codes.dtype == np.dtype(dtype)
    assert (codes == expected).all()
