"""``gpuflame top``: the functions holding the most memory, as a table."""

from __future__ import annotations

import argparse

from gpuflame.analysis.hotspots import function_stats, top_functions
from gpuflame.analysis.tree import build_table
from gpuflame.cli.common import (
    FILTER_ORDER,
    add_analysis_options,
    load_for_analysis,
    peak_json,
    positive_count,
    print_json,
)
from gpuflame.render.terminal import make_console, print_comments, render_top

HELP = "the top functions by self or total"

DESCRIPTION = """\
The functions holding the most memory, largest first.

  --by self    what each function allocated itself: the leaf bars, where the
               memory is actually taken (the default)
  --by total   the function and everything it calls: the wide bars at the
               bottom, which say who is responsible

A function with a large total and zero self only calls others: skip it and
look at what it calls. A function counted twice in one stack (recursion)
counts once in its total."""

EPILOG = f"""\
examples:
  gpuflame top run.pb.gz
  gpuflame top run.pb.gz --by total -n 30
  gpuflame top run.pb.gz --type alloc_space --prune-framework
  gpuflame top run.pb.gz --json

{FILTER_ORDER}"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "files", nargs="+", metavar="FILE", help="profile: pprof (.pb.gz), folded, or PyTorch snapshot"
    )
    parser.add_argument(
        "--by", choices=("self", "total"), default="self", help="rank by self or total (default self)"
    )
    parser.add_argument(
        "-n", "--limit", type=positive_count, default=20, metavar="N", help="how many functions (default 20)"
    )
    add_analysis_options(parser)


def run(args: argparse.Namespace) -> int:
    loaded = load_for_analysis(args, args.files)
    table = build_table(loaded.profile, loaded.type_index, lines=args.lines)
    stats = function_stats(table)
    entries = top_functions(stats, args.by, max(1, args.limit))
    sample_type = table.sample_type
    if args.json:
        print_json(
            {
                "sample_type": sample_type.type,
                "unit": sample_type.unit,
                "total": stats.grand_total,
                "by": args.by,
                "comments": loaded.profile.comments,
                **peak_json(loaded.profile, sample_type.type),
                "functions": [e.to_dict() for e in entries],
            }
        )
        return 0
    console = make_console()
    print_comments(console, loaded.profile.comments)
    render_top(console, entries, args.by, sample_type.type, sample_type.unit, stats.grand_total,
               loaded.profile.peak_description(sample_type.type))
    return 0
