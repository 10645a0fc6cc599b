"""The flame graph as one static SVG picture, for CI logs, reports and pull requests.

A code host shows an SVG in a pull request only as an ``<img>``, which runs
no script and loads nothing from outside, so the picture is plain shapes and
text: a ``<rect>`` and ``<text>`` per frame, and a ``<title>`` child per frame
that every browser shows as a tooltip (full name, self, total, file:line).
Roots are at the bottom, as the AKS guide draws a flame graph; ``icicle=True``
hangs them from the top instead.

Why it is laid out the way it is: a large profile has millions of tree
nodes, but a picture 1200 pixels wide can show only a few thousand bars per
level. So the tree is walked a level at a time over the
:class:`~gpuflame.analysis.tree.FlameTree` arrays, and only under bars at
least ``min_width_px`` wide; a bar too narrow to draw is left out and its
bytes stay inside its caller's width. The output's size follows the
picture's width and depth, not the profile's size.

Frame names, file names, comments and the title come from user code and
files. Every one of them goes through :func:`xml_text`, and none is ever
placed in an attribute, so a name can only ever be text.
"""

from __future__ import annotations

import colorsys
import dataclasses
import re
import zlib
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np

from gpuflame.analysis.tree import FlameTree, build_tree
from gpuflame.model.profile import NATIVE, PYTHON, SYNTHETIC, TRAMPOLINE_KIND, Frame, Profile
from gpuflame.symbols.names import CACHED_FREE, OUTSIDE_FRAMEWORK
from gpuflame.units import format_count, percent

FRAME_HEIGHT = 17
FONT_SIZE = 12
# Average advance of a Verdana/DejaVu Sans character at FONT_SIZE, a little
# generous so that a truncated name never spills out of its bar.
CHAR_WIDTH = 0.62 * FONT_SIZE
TEXT_PAD = 3
SIDE_PAD = 10
LINE_HEIGHT = 17
# Comments beyond this many are summarised in one line, so a merged profile
# with a comment per input does not push the graph off the page.
MAX_COMMENT_LINES = 6
# device label prefixes of GPU memory (torch: cuda, xpu, mps; JAX: gpu)
GPU_DEVICES = frozenset({"cuda", "gpu", "rocm", "hip", "xpu", "mps"})
ELLIPSIS = "…"

STYLE = (
    'text{font-family:Verdana,"DejaVu Sans","Bitstream Vera Sans",sans-serif;'
    f"font-size:{FONT_SIZE}px;fill:#000}}"
    ".t{font-size:17px;font-weight:bold}.m{fill:#444}"
    "rect.f{rx:2px;ry:2px}"
    ".c{fill:#9fb3c8}.o{fill:#b9a3d9}.s{fill:#d9d3c3}.p{fill:#c9c9c9}"
)

# Colours that do not depend on the name: (css class, legend label).
CACHED_CLASS = ("c", CACHED_FREE)
OUTSIDE_CLASS = ("o", OUTSIDE_FRAMEWORK)
SYNTHETIC_CLASS = ("s", "other synthetic")
TRAMPOLINE_CLASS = ("p", "trampoline")


# -- escaping ------------------------------------------------------------------

# Characters XML 1.0 cannot carry at all (control characters, lone
# surrogates): no escape makes them legal, so they become U+FFFD.
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def xml_text(value: str) -> str:
    """*value* as XML character data that parses back to the same string.

    ``\\r`` is written as a character reference because a parser turns a
    literal one into ``\\n``; characters XML cannot carry become U+FFFD.
    """
    value = _NOT_XML.sub("\ufffd", value)
    return (
        value.replace("&", "&amp;")
        .replace("<", "&lt;")
        .replace(">", "&gt;")
        .replace('"', "&quot;")
        .replace("'", "&#39;")
        .replace("\r", "&#13;")
    )


# -- colours -------------------------------------------------------------------


def _name_hash(name: str) -> float:
    """A stable number in [0, 1) per name: the same function keeps its colour across pictures."""
    return zlib.crc32(name.encode("utf-8", "surrogatepass")) / 2**32


def _hsl(hue: float, saturation: float, lightness: float) -> str:
    r, g, b = colorsys.hls_to_rgb(hue / 360.0, lightness, saturation)
    return f"#{round(r * 255):02x}{round(g * 255):02x}{round(b * 255):02x}"


def frame_colour(frame: Frame) -> tuple[str, str]:
    """``(css class, fill)`` of a bar; exactly one of the two is set.

    Python frames get warm hues (red to yellow) picked by the name's hash;
    native frames cool blues; the synthetic and trampoline frames fixed
    greys and violets that no hashed hue can produce.
    """
    if frame.name == CACHED_FREE:
        return CACHED_CLASS[0], ""
    if frame.name == OUTSIDE_FRAMEWORK:
        return OUTSIDE_CLASS[0], ""
    if frame.kind == SYNTHETIC:
        return SYNTHETIC_CLASS[0], ""
    if frame.kind == TRAMPOLINE_KIND:
        return TRAMPOLINE_CLASS[0], ""
    h = _name_hash(frame.name)
    if frame.kind == NATIVE:
        return "", _hsl(190 + 35 * h, 0.55, 0.72)
    return "", _hsl(5 + 45 * h, 0.80 + 0.15 * ((h * 7) % 1), 0.58 + 0.08 * ((h * 13) % 1))


# -- layout --------------------------------------------------------------------


class Placed(NamedTuple):
    """The bars drawn at one depth: node indices into that level, left edges and widths in px."""

    depth: int
    index: np.ndarray  # type: ignore[assignment]  # a field named as tuple.index, which it hides on purpose
    x: np.ndarray
    width: np.ndarray


def layout(tree: FlameTree, scale: float, left: float, min_width_px: float) -> list[Placed]:
    """Bars level by level, roots first; descends only under bars that were drawn.

    A node's children start at its left edge, in name order, and its self
    is the gap on its right, as flamegraph.pl and Grafana draw it.
    """
    if not tree.depth or scale <= 0:
        return []
    totals = tree.level(0).total
    x = left + (np.cumsum(totals) - totals) * scale
    placed = _keep(0, np.arange(len(totals)), x, totals * scale, min_width_px)
    out: list[Placed] = []
    while len(placed.index):
        out.append(placed)
        if placed.depth + 1 >= tree.depth:
            break
        placed = _children(tree, placed, scale, min_width_px)
    return out


def _children(tree: FlameTree, parents: Placed, scale: float, min_width_px: float) -> Placed:
    """The children of the drawn bars *parents*, each placed after its elder siblings."""
    lo, hi = (a[parents.index] for a in tree.children_range(parents.depth))
    counts = hi - lo
    first = np.repeat(lo, counts)
    kids = first + np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    totals = tree.level(parents.depth + 1).total
    before = np.concatenate(([0], np.cumsum(totals)))  # totals of a level left of each node
    x = np.repeat(parents.x, counts) + (before[kids] - before[first]) * scale
    return _keep(parents.depth + 1, kids, x, totals[kids] * scale, min_width_px)


def _keep(depth: int, index: np.ndarray, x: np.ndarray, width: np.ndarray, min_width_px: float) -> Placed:
    wide = width >= min_width_px
    return Placed(depth, index[wide], x[wide], width[wide])


def magnitude_tree(tree: FlameTree) -> FlameTree:
    """The same tree measured in absolute values, for the bar widths.

    A diff profile has negative values, and a signed total cannot be a
    width: children could be wider than their caller. Absolute values nest
    (a node's is at least its children's sum) and the rows keep their order,
    so every node has the same index in both trees.
    """
    if not tree.table.rows or int(tree.table.values.min()) >= 0:
        return tree
    return FlameTree(dataclasses.replace(tree.table, values=np.abs(tree.table.values)))


# -- drawing -------------------------------------------------------------------


def fit_text(text: str, width_px: float) -> str:
    """*text* cut to fit *width_px*, ending in "…" when cut; empty when not even two characters fit."""
    room = int((width_px - 2 * TEXT_PAD) / CHAR_WIDTH)
    if room < 2:
        return ""
    return text if len(text) <= room else text[: room - 1] + ELLIPSIS


def frame_tooltip(frame: Frame, self_value: int, total: int, whole: int, unit: str) -> str:
    """The tooltip's lines: the full name, self and total with their share, file:line."""
    lines = [
        frame.name,
        f"self: {format_count(self_value, unit)} ({percent(self_value, whole):.2f}%)",
        f"total: {format_count(total, unit)} ({percent(total, whole):.2f}%)",
    ]
    if frame.location():
        lines.append(frame.location())
    elif frame.kind != PYTHON:
        lines.append(f"({frame.kind} frame)")
    return "\n".join(lines)


def _frame_elements(tree: FlameTree, placed: Placed, top: float, whole: int, unit: str) -> Iterator[str]:
    """One ``<g>`` per bar of one level: tooltip, rectangle, and the name if it fits."""
    level = tree.level(placed.depth)
    codes = level.codes[placed.index].tolist()
    totals = level.total[placed.index].tolist()
    selfs = tree.level_self(placed.depth)[placed.index].tolist()
    text_y = f"{top + FRAME_HEIGHT - 5:.1f}"
    rect_y, rect_h = f"{top:.1f}", str(FRAME_HEIGHT - 1)
    for code, total, self_value, x, w in zip(
        codes, totals, selfs, placed.x.tolist(), placed.width.tolist(), strict=True
    ):
        frame = tree.frames[code - 1]
        css, fill = frame_colour(frame)
        paint = f'class="f {css}"' if css else f'class="f" fill="{fill}"'
        tip = xml_text(frame_tooltip(frame, self_value, total, whole, unit))
        label = fit_text(frame.name, w)
        text = f'<text x="{x + TEXT_PAD:.2f}" y="{text_y}">{xml_text(label)}</text>' if label else ""
        yield (
            f"<g><title>{tip}</title>"
            f'<rect {paint} x="{x:.2f}" y="{rect_y}" width="{w:.2f}" height="{rect_h}"/>{text}</g>'
        )


def _header(lines: list[tuple[str, str, str]], width: int) -> tuple[list[str], float]:
    """Header text lines ``(css class, shown text, tooltip)`` and the height they take."""
    out: list[str] = []
    y = 6.0
    for css, text, tip in lines:
        y += 22 if css == "t" else LINE_HEIGHT
        room = width - 2 * SIDE_PAD
        shown = fit_text(text, room * (FONT_SIZE / 17 if css == "t" else 1))
        title = f"<title>{xml_text(tip)}</title>" if tip else ""
        out.append(f'<text class="{css}" x="{SIDE_PAD}" y="{y:.1f}">{title}{xml_text(shown)}</text>')
    return out, y + 8


def memory_name(devices: list[str]) -> str:
    """What memory the profile measures, from its device labels: never "GPU" for a CPU run."""
    kinds = {d.split(":", 1)[0].lower() for d in devices}
    if not kinds:
        return "Memory"
    if kinds == {"cpu"}:
        return "CPU memory"
    if kinds <= GPU_DEVICES:
        return "GPU memory"
    return f"Memory ({', '.join(sorted(devices))})"


def _header_lines(
    comments: list[str], tree: FlameTree, title: str | None, drawn: int, icicle: bool, devices: list[str]
) -> list[tuple[str, str, str]]:
    sample_type = tree.table.sample_type
    heading = title if title is not None else f"{memory_name(devices)} flame graph: {sample_type.type}"
    where = "roots at the top" if icicle else "roots at the bottom"
    info = (
        f"{sample_type} · total {format_count(tree.total, sample_type.unit)} · "
        f"width = {sample_type.unit} through a frame, {where} · hover a bar for self and total"
    )
    lines = [("t", heading, ""), ("m", info, "")]
    if tree.table.rows and int(tree.table.values.min()) < 0:
        lines.append(("m", "this profile has negative values (a diff): widths are absolute sizes", ""))
    for comment in comments[:MAX_COMMENT_LINES]:
        lines.append(("m", f"# {comment}", comment))
    if len(comments) > MAX_COMMENT_LINES:
        rest = comments[MAX_COMMENT_LINES:]
        lines.append(("m", f"# … {len(rest)} more comments", "\n".join(rest)))
    if not drawn:
        lines.append(("m", "(no samples)", ""))
    return lines


def _legend(y: float) -> list[str]:
    """Swatches for the colours that are not hashed from the name."""
    items = [
        ("", _hsl(25, 0.85, 0.6), "python"),
        ("", _hsl(205, 0.55, 0.72), "native"),
        (TRAMPOLINE_CLASS[0], "", TRAMPOLINE_CLASS[1]),
        (CACHED_CLASS[0], "", CACHED_CLASS[1]),
        (OUTSIDE_CLASS[0], "", OUTSIDE_CLASS[1]),
        (SYNTHETIC_CLASS[0], "", SYNTHETIC_CLASS[1]),
    ]
    out, x = [], float(SIDE_PAD)
    for css, fill, label in items:
        paint = f'class="{css}"' if css else f'fill="{fill}"'
        out.append(f'<rect {paint} x="{x:.1f}" y="{y - 10:.1f}" width="10" height="10"/>')
        out.append(f'<text class="m" x="{x + 14:.1f}" y="{y:.1f}">{xml_text(label)}</text>')
        x += 14 + len(label) * CHAR_WIDTH + 14
    return out


def encode(
    profile: Profile,
    type_index: int,
    *,
    width: int = 1200,
    min_width_px: float = 0.5,
    title: str | None = None,
    lines: bool = False,
    icicle: bool = False,
    group_by: str | None = None,
) -> str:
    """The flame graph of one sample type as a self-contained SVG document.

    *lines* and *group_by* shape the tree as for ``build_tree``; bars
    narrower than *min_width_px* are not drawn (their bytes stay in the
    caller's bar).
    """
    tree = build_tree(profile, type_index, group_by=group_by, lines=lines)
    return render(
        tree,
        profile.comments,
        width=width,
        min_width_px=min_width_px,
        title=title,
        icicle=icicle,
        devices=profile.label_values("device"),
    )


def render(
    tree: FlameTree,
    comments: list[str],
    *,
    width: int = 1200,
    min_width_px: float = 0.5,
    title: str | None = None,
    icicle: bool = False,
    devices: list[str] | None = None,
) -> str:
    """The SVG of a tree already built (``gpuflame flame`` has one at hand).

    *devices* (the profile's ``device`` label values) say which memory the
    heading names: CPU, GPU, or plain memory when unknown or mixed.
    """
    if width < 4 * SIDE_PAD:
        raise ValueError(f"width {width} is too small for a flame graph")
    sized = magnitude_tree(tree)
    whole = sized.total
    scale = (width - 2 * SIDE_PAD) / whole if whole else 0.0
    placed = layout(sized, scale, SIDE_PAD, min_width_px)
    head, graph_top = _header(_header_lines(comments, tree, title, len(placed), icicle, devices or []), width)
    legend_y = graph_top + len(placed) * FRAME_HEIGHT + 18
    height = int(legend_y + 10)
    out = [
        '<?xml version="1.0" encoding="UTF-8" standalone="no"?>',
        "<!-- gpuflame flame graph -->",
        f'<svg xmlns="http://www.w3.org/2000/svg" version="1.1" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}">',
        f"<style>{STYLE}</style>",
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#fdfdfd"/>',
        *head,
    ]
    unit = tree.table.sample_type.unit
    for level in placed:
        row = level.depth if icicle else len(placed) - 1 - level.depth
        out.extend(_frame_elements(tree, level, graph_top + row * FRAME_HEIGHT, whole, unit))
    out.extend(_legend(legend_y))
    out.append("</svg>")
    return "\n".join(out) + "\n"
