"""The terminal flame graph: widths, self, grouping and folding of narrow bars."""

from __future__ import annotations

import json
import random

from gpuflame.analysis.tree import build_tree
from gpuflame.cli.main import main
from gpuflame.formats import save
from gpuflame.model import Frame, Profile, SampleType
from gpuflame.render.flame_text import flame_lines

F = {
    n: Frame(n, f"/app/{n.split(' ')[0].lower()}.py", 10 + i, start_line=10 + i)
    for i, n in enumerate(
        [
            "<module>",
            "main",
            "Model > __init__",
            "LlamaMLP > __init__",
            "Linear > __init__",
            "generate",
            "StaticCache > __init__",
            "forward",
            "LlamaMLP > forward",
            "tiny",
        ]
    )
}


def build(stacks: list[tuple[list[str], int]]) -> Profile:
    """Stacks are given root first, as one reads a flame graph bottom-up."""
    p = Profile(sample_types=[SampleType("inuse_space", "bytes")])
    for names, value in stacks:
        p.add([F[n] for n in reversed(names)], [value])
    return p


STACKS = [
    (["<module>", "main", "Model > __init__", "LlamaMLP > __init__", "Linear > __init__"], 4000),
    (["<module>", "main", "generate", "StaticCache > __init__"], 9000),
    (["<module>", "main", "generate", "forward", "LlamaMLP > forward"], 500),
    (["<module>", "main", "tiny"], 5),
]


def prefix_total(stacks: list[tuple[list[str], int]], prefix: list[str]) -> int:
    return sum(v for names, v in stacks if names[: len(prefix)] == prefix)


def test_expanded_lines_are_every_prefix_with_its_total_and_self() -> None:
    tree = build_tree(build(STACKS), 0)
    lines = flame_lines(tree, min_percent=0, expand=True)
    seen = []
    path: list[str] = []
    for line in lines:
        assert len(line.frames) == 1
        path = path[: line.depth] + [line.frame.name]
        seen.append(tuple(path))
        assert line.total == prefix_total(STACKS, path)
        assert line.self == sum(v for names, v in STACKS if names == path)
    expected = {tuple(names[:d]) for names, _ in STACKS for d in range(1, len(names) + 1)}
    assert set(seen) == expected and len(seen) == len(expected)


def test_children_come_widest_first() -> None:
    lines = flame_lines(build_tree(build(STACKS), 0), min_percent=0, expand=True)
    under_main = [line for line in lines if line.depth == 2]
    assert [line.frame.name for line in under_main] == ["generate", "Model > __init__", "tiny"]


def test_single_child_zero_self_runs_collapse_into_one_group() -> None:
    lines = flame_lines(build_tree(build(STACKS), 0), min_percent=0)
    first = lines[0]
    assert [f.name for f in first.frames] == ["<module>", "main"]
    chain = next(line for line in lines if line.frame.name == "Linear > __init__")
    assert [f.name for f in chain.frames] == ["Model > __init__", "LlamaMLP > __init__", "Linear > __init__"]
    assert chain.self == 4000 and chain.total == 4000


def test_narrow_bars_fold_into_one_line_that_keeps_their_bytes() -> None:
    rng = random.Random(3)
    stacks = [(["<module>", "main", "generate", "StaticCache > __init__"], 100_000)]
    stacks += [(["<module>", "main", "tiny"], rng.randint(1, 50)) for _ in range(3)]
    lines = flame_lines(build_tree(build(stacks), 0), min_percent=1.0)
    folded = [line for line in lines if line.hidden]
    assert len(folded) == 1
    assert folded[0].total == prefix_total(stacks, ["<module>", "main", "tiny"])


def test_depth_limit() -> None:
    lines = flame_lines(build_tree(build(STACKS), 0), min_percent=0, max_depth=2, expand=True)
    assert max(line.depth for line in lines) == 1


def test_cli_flame_prints_names_and_json(tmp_path, capsys) -> None:
    path = tmp_path / "p.pb.gz"
    save(build(STACKS), path)
    assert main(["flame", str(path)]) == 0
    out = capsys.readouterr().out
    assert "StaticCache > __init__" in out and "LlamaMLP > __init__" in out
    assert main(["flame", str(path), "--json", "--expand", "--min-percent", "0"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["total"] == sum(v for _, v in STACKS)
    assert data["lines"][0]["frames"][0]["name"] == "<module>"
    assert data["lines"][0]["frames"][0]["line"] == F["<module>"].line


def test_cli_flame_focus_makes_the_frame_the_root(tmp_path, capsys) -> None:
    path = tmp_path / "p.pb.gz"
    save(build(STACKS), path)
    assert main(["flame", str(path), "--json", "--focus", "generate", "--min-percent", "0"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["lines"][0]["frames"][0]["name"] == "generate"
    assert data["total"] == prefix_total(STACKS, ["<module>", "main", "generate"])
