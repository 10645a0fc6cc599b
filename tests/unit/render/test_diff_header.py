"""diff's header line: the change of the totals in percent (render/terminal.py's render_comparison)."""

from __future__ import annotations

import pytest

from gpuflame.analysis.compare import Comparison
from gpuflame.render.console import make_console
from gpuflame.render.terminal import render_comparison


@pytest.mark.parametrize(
    ("base", "new", "said"),
    [(0, 0, "(0 B, +0.0%)"), (0, 2048, "(+2.00 KiB, new)"), (1024, 2048, "(+1.00 KiB, +100.0%)")],
)
def test_the_header_says_the_change(capsys, base: int, new: int, said: str) -> None:
    """0 B -> 0 B (diff a.pb.gz b.pb.gz --at T before both first allocations) read '(0 B, new)'."""
    cmp = Comparison("inuse_space", "bytes", "total", base, new, [], [], 0)
    render_comparison(make_console(), cmp, "a.pb.gz", "b.pb.gz")
    assert said in capsys.readouterr().out
