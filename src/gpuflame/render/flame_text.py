"""The flame graph in a terminal: an indented tree with a bar per frame.

A terminal cannot draw a 2-D flame graph legibly at 80 columns, so the tree
is drawn as an icicle turned on its side: roots first (the bottom of the
flame graph), callees indented under their caller, each line with a bar whose
length is the frame's total. Like Grafana's panel, runs of frames with one
child and no self collapse into one group line (``--expand`` shows them), and
bars narrower than a threshold are summed into one line per parent.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rich.console import Console
from rich.text import Text

from gpuflame.analysis.tree import FlameTree, Node
from gpuflame.model.profile import Frame
from gpuflame.printable import printable
from gpuflame.render.terminal import NAME_SHOWN, where
from gpuflame.units import format_count, percent

BAR_WIDTH = 24
# A collapsed group longer than this shows its first and last frame and a count.
GROUP_SHOWN = 3


@dataclass
class FlameLine:
    """One printed line: a frame (or a collapsed group of frames) with its widths."""

    depth: int
    frames: list[Frame]
    total: int
    self: int
    hidden: int = 0  # for an "other" line: how many bars were folded into it
    children: list[FlameLine] = field(default_factory=list)

    @property
    def frame(self) -> Frame:
        """The frame the line is named after: the last of a collapsed group."""
        return self.frames[-1]


def flame_lines(
    tree: FlameTree,
    min_percent: float = 1.0,
    max_depth: int | None = None,
    expand: bool = False,
) -> list[FlameLine]:
    """The lines to print, depth first, children widest first."""
    threshold = abs(tree.total) * min_percent / 100.0
    out: list[FlameLine] = []
    _emit(tree, tree.roots(), 0, threshold, max_depth, expand, out)
    return out


def _emit(
    tree: FlameTree,
    nodes: list[Node],
    depth: int,
    threshold: float,
    max_depth: int | None,
    expand: bool,
    out: list[FlameLine],
) -> None:
    ranked = sorted(nodes, key=lambda n: -abs(tree.node_total(n)))
    shown = [n for n in ranked if abs(tree.node_total(n)) >= threshold and threshold >= 0]
    rest = ranked[len(shown) :] if len(shown) < len(ranked) else []
    for node in shown:
        frames, last = [tree.frame(node)], node
        if not expand:
            while True:
                kids = tree.children(last)
                if len(kids) != 1 or tree.node_self(last) != 0:
                    break
                last = kids[0]
                frames.append(tree.frame(last))
        line = FlameLine(depth, frames, tree.node_total(node), tree.node_self(last))
        out.append(line)
        if max_depth is None or depth + 1 < max_depth:
            _emit(tree, tree.children(last), depth + 1, threshold, max_depth, expand, out)
    if rest:
        folded = sum(tree.node_total(n) for n in rest)
        out.append(FlameLine(depth, [], folded, 0, hidden=len(rest)))


def render_flame(console: Console, tree: FlameTree, lines: list[FlameLine], title: Text) -> None:
    """Print *lines* under *title*; bar length is total, bright part is self."""
    unit = tree.table.sample_type.unit
    whole = tree.total
    console.print(title)
    if not lines:
        console.print("  (no samples)")
        return
    for line in lines:
        console.print(_line_text(line, whole, unit), overflow="ellipsis", no_wrap=True)


def _line_text(line: FlameLine, whole: int, unit: str) -> Text:
    share = percent(line.total, whole)
    text = Text()
    text.append_text(_bar(line.total, line.self, whole))
    text.append(f" {share:5.1f}% {format_count(line.total, unit):>10} ")
    text.append("  " * line.depth)
    if line.hidden:
        text.append(f"… {line.hidden} more under the threshold", style="dim")
        return text
    if len(line.frames) > GROUP_SHOWN:
        text.append(printable(line.frames[0].name, NAME_SHOWN), style="bold")
        text.append(f" ⋯ {len(line.frames) - 2} frames ⋯ ", style="dim")
    elif len(line.frames) > 1:
        for frame in line.frames[:-1]:
            text.append(printable(frame.name, NAME_SHOWN), style="bold")
            text.append(" → ", style="dim")
    text.append(printable(line.frame.name, NAME_SHOWN), style="bold red" if line.self else "bold")
    if line.self:
        text.append(f"  self {format_count(line.self, unit)}", style="red")
    loc = where(line.frame)
    if loc:
        text.append("  ")
        text.append_text(loc)
    return text


def _bar(total: int, self_value: int, whole: int) -> Text:
    """A bar of BAR_WIDTH cells: total in light blocks, self in solid red ones."""
    if not whole:
        return Text(" " * BAR_WIDTH)
    cells = round(BAR_WIDTH * min(1.0, abs(total) / abs(whole)))
    own = min(cells, round(BAR_WIDTH * min(1.0, abs(self_value) / abs(whole))))
    bar = Text()
    bar.append("█" * own, style="red")
    bar.append("▒" * (cells - own), style="yellow")
    bar.append(" " * (BAR_WIDTH - cells))
    return bar
