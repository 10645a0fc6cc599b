"""``gpuflame flame``: the flame graph in the terminal."""

from __future__ import annotations

import argparse

from gpuflame.analysis.tree import frame_dict
from gpuflame.cli.common import (
    FILTER_ORDER,
    add_analysis_options,
    add_force_option,
    open_args,
    peak_json,
    print_json,
)
from gpuflame.files import atomic_write, check_output
from gpuflame.render import svg
from gpuflame.render.console import make_console
from gpuflame.render.flame_text import flame_lines, render_flame
from gpuflame.render.terminal import plain, print_comments, type_title

HELP = "the flame graph in the terminal"

DESCRIPTION = """\
The flame graph as an indented tree: roots (the bottom of a flame graph,
the outermost callers) first, each function's callees indented under it.
The bar is the frame's total, its solid red part the frame's self.

Runs of frames that have a single callee and allocate nothing themselves are
collapsed into one line ("A ⋯ N frames ⋯ B"), as Grafana groups them;
--expand shows every frame. Bars under --min-percent of the total are
summed into one "… N more" line.

--svg OUT also writes the same profile, after the same filters, as a static
SVG flame graph picture (roots at the bottom, a tooltip per bar)."""

EPILOG = f"""\
examples:
  gpuflame flame run.pb.gz
  gpuflame flame run.pb.gz --focus GPUModelRunner.initialize_kv_cache --expand
  gpuflame flame run.pb.gz --type inuse --no-cached --min-percent 0.1 --depth 12
  gpuflame flame run.pb.gz --group-by pid
  gpuflame flame run.pb.gz --no-cached --svg flame.svg

{FILTER_ORDER}"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE", help="profile: pprof (.pb.gz), folded, or PyTorch snapshot")
    parser.add_argument(
        "--min-percent",
        type=float,
        default=1.0,
        metavar="P",
        help="fold bars narrower than P%% of the total (default 1)",
    )
    parser.add_argument("--depth", type=int, metavar="N", help="show at most N levels")
    parser.add_argument("--expand", action="store_true", help="expand all groups: one line per frame")
    parser.add_argument("--group-by", metavar="LABEL", help="one subtree per value of a label (pid, device, ...)")
    parser.add_argument("--svg", metavar="OUT", help="also write the flame graph as an SVG picture to OUT")
    add_force_option(parser)
    add_analysis_options(parser)


def run(args: argparse.Namespace) -> int:
    if args.svg:
        check_output(args.svg, args.files, force=args.force, writes="an SVG picture")
    opened = open_args(args, args.files)
    tree = opened.view.tree()
    lines = flame_lines(tree, max(0.0, args.min_percent), args.depth, args.expand)
    sample_type = tree.table.sample_type
    if args.svg:
        picture = svg.render(tree, opened.profile.comments, devices=opened.profile.label_values("device"))
        atomic_write(args.svg, picture)  # before any output
    if args.json:
        print_json(
            {
                "sample_type": sample_type.type,
                "unit": sample_type.unit,
                "total": tree.total,
                "comments": opened.profile.comments,
                **peak_json(opened.profile, sample_type.type),
                "lines": [
                    {
                        "depth": line.depth,
                        "frames": [frame_dict(f) for f in line.frames],
                        "total": line.total,
                        "self": line.self,
                        "folded_bars": line.hidden,
                    }
                    for line in lines
                ],
            }
        )
        return 0
    console = make_console()
    peak = opened.profile.peak_description(sample_type.type)
    print_comments(console, opened.profile.comments, shown=peak)
    render_flame(console, tree, lines, type_title(sample_type.type, sample_type.unit, tree.total, peak))
    if args.svg:
        console.print(plain(f"wrote {args.svg} (svg)", style="dim"), soft_wrap=True)
    return 0
