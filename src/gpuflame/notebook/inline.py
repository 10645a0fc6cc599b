"""The flame graph as a notebook output: the offline viewer inside an ``<iframe srcdoc>``.

A notebook front end cannot show a local file in an IFrame (JupyterLab,
VS Code and Colab serve outputs from elsewhere, or not at all), so the whole
viewer page (render/html.py: its script, styles and the compressed profile,
no network request) travels in the output itself as the iframe's
``srcdoc``. ``sandbox="allow-scripts"`` gives the page an opaque origin: it
draws, but cannot reach the notebook, its cookies or its kernel.

Consoles get the text/plain part of the same output: one line with the peak,
what is in use at the end, and the top function.
"""

from __future__ import annotations

import html

from gpuflame.analysis.summary import Summary
from gpuflame.analysis.tree import build_tree
from gpuflame.boundary.backends import JAX
from gpuflame.model.profile import Profile
from gpuflame.render.html import render_html
from gpuflame.units import format_count

ROW_PX = 18  # the viewer's bar height (viewer.js ROW)
CHROME_PX = 160  # toolbar (two or three rows in a notebook's width), status line, breadcrumb, bottom margin
COMMENT_PX = 20  # each line of a comment in the status
COMMENT_CHARS = 90  # characters a status line holds in a narrow notebook (a longer comment wraps)
TIMELINE_PX = 110  # the memory-over-time strip, when the profile has a timeline
MIN_HEIGHT_PX = 260
MAX_HEIGHT_PX = 900  # taller graphs scroll inside the frame


def frame_height(profile: Profile, type_index: int) -> int:
    """Pixels that show the whole graph of a shallow profile without scrolling."""
    depth = build_tree(profile, type_index).depth
    lines = sum(-(-len(c) // COMMENT_CHARS) for c in profile.comments)
    above = CHROME_PX + COMMENT_PX * lines + (TIMELINE_PX if profile.timeline else 0)
    return max(MIN_HEIGHT_PX, min(MAX_HEIGHT_PX, above + ROW_PX * (depth + 1)))


def inline_html(profile: Profile, title: str, type_index: int, caption: str) -> str:
    """The output's text/html: a sandboxed iframe holding the viewer page, with *caption* under it."""
    page = render_html(profile, title, type_index)
    height = frame_height(profile, type_index)
    return (
        f'<iframe class="gpuflame-inline" title="{html.escape(title)}" sandbox="allow-scripts" '
        f'style="width:100%;height:{height}px;border:1px solid #d8d8dc;border-radius:4px" '
        f'srcdoc="{html.escape(page, quote=True)}"></iframe>'
        f'<div class="gpuflame-caption" style="font:12px monospace;color:#555">{html.escape(caption)}</div>'
    )


def summary_line(summary: Summary, backends: list[str]) -> str:
    """``gpuflame: peak 8.00 MiB, in use at the end 4.00 MiB, top: LlamaMLP > forward (6.00 MiB self at peak)``."""
    parts = []
    # JAX reports live buffers only: beside another backend, the allocated total is the others' alone
    others = [b for b in backends if b != JAX]
    allocated = f"allocated ({', '.join(others)} only)" if others and len(others) < len(backends) else "allocated"
    for name, label in (("peak_space", "peak"), ("inuse_space", "in use at the end"), ("alloc_space", allocated)):
        value = summary.total(name)
        if value is not None:
            parts.append(f"{label} {format_count(value, 'bytes')}")
    if summary.top is not None:
        shown = summary.type.removesuffix("_space").replace("inuse", "in use")
        parts.append(f"top: {summary.top.frame.name} ({format_count(summary.top.self, summary.unit)} self at {shown})")
    where = f" [{', '.join(backends)}]" if backends else ""
    return "gpuflame" + where + ": " + ", ".join(parts)
