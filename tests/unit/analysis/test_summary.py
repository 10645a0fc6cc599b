"""The short answer (analysis/summary.py) and cutting a host's frames (model.cut_callers)."""

from __future__ import annotations

from gpuflame.analysis.hotspots import function_stats, top_functions
from gpuflame.analysis.summary import summarize, top_stacks, widest_leaf
from gpuflame.analysis.tree import build_tree
from gpuflame.model import Frame, Profile, cut_callers, memory_sample_types

HOST = Frame("pytest_pyfunc_call", "/site-packages/_pytest/python.py", 160)
RUNNER = Frame("<module>", "/site-packages/pytest/__main__.py", 9)
TEST = Frame("test_model", "/repo/tests/test_model.py", 10)
MLP = Frame("LlamaMLP > forward", "/site/modeling_llama.py", 120)
MLP_OTHER_LINE = Frame("LlamaMLP > forward", "/site/modeling_llama.py", 125)
ATTN = Frame("LlamaAttention > forward", "/site/modeling_llama.py", 300)


def profile() -> Profile:
    p = Profile(sample_types=memory_sample_types())
    p.add([MLP, TEST, HOST, RUNNER], [4 << 20, 1, 0, 0, 4 << 20, 1])
    p.add([MLP_OTHER_LINE, TEST, HOST, RUNNER], [2 << 20, 1, 2 << 20, 1, 2 << 20, 1])
    p.add([ATTN, TEST, HOST, RUNNER], [6 << 20, 1, 0, 0, 6 << 20, 1])
    p.add([HOST, RUNNER], [1024, 1, 0, 0, 1024, 1])  # the host itself allocated
    p.add([Frame("<no Python stack>", kind="synthetic")], [512, 1, 0, 0, 512, 1])
    return p


def test_cut_callers_makes_what_the_host_called_the_root() -> None:
    cut = cut_callers(profile(), lambda f: "_pytest" in f.file)
    stacks = [[cut.frames[i].name for i in s.stack] for s in cut.samples]
    assert stacks == [
        ["LlamaMLP > forward", "test_model"],
        ["LlamaMLP > forward", "test_model"],
        ["LlamaAttention > forward", "test_model"],
        [],  # the host's own allocation: no stack of the test's left, its bytes stay counted
        ["<no Python stack>"],  # no host frame: left whole
    ]
    assert cut.totals() == profile().totals()


def test_widest_leaf_merges_lines_and_agrees_with_the_report() -> None:
    p = profile()
    for type_name in ("peak_space", "inuse_space", "alloc_space"):
        index = p.type_index(type_name)
        leaf = widest_leaf(p, index)
        [expected] = top_functions(function_stats(build_tree(p, index).table), "self", 1)
        assert leaf is not None and (leaf.frame.name, leaf.self) == (expected.frame.name, expected.self)
    # the two lines of LlamaMLP > forward are one function: 6 MiB, tied with LlamaAttention, first by name
    assert widest_leaf(p, p.type_index("peak_space")).frame.name == "LlamaAttention > forward"
    assert widest_leaf(p, p.type_index("inuse_space")).self == 2 << 20


def test_summary_of_an_empty_type_has_no_top() -> None:
    p = Profile(sample_types=memory_sample_types())
    p.add([TEST], [0, 0, 0, 0, 100, 1])
    summary = summarize(p, "peak_space")
    assert summary.top is None and summary.total("alloc_space") == 100


def test_top_stacks_widest_first_read_bottom_up() -> None:
    p = cut_callers(profile(), lambda f: "_pytest" in f.file).compact()
    stacks = top_stacks(build_tree(p, p.type_index("peak_space")), limit=2)
    assert [([f.name for f in s.frames], s.value) for s in stacks] == [
        (["test_model", "LlamaAttention > forward"], 6 << 20),
        (["test_model", "LlamaMLP > forward"], 6 << 20),
    ]
    assert round(stacks[0].percent, 2) == round(100 * (6 << 20) / ((12 << 20) + 1024 + 512), 2)
