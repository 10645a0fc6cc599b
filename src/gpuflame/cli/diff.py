"""``gpuflame diff``: what grew and what shrank between two profiles, by function."""

from __future__ import annotations

import argparse

from gpuflame.analysis.compare import compare
from gpuflame.cli.common import (
    FILTER_ORDER,
    add_analysis_options,
    open_each_args,
    positive_count,
    print_json,
)
from gpuflame.render.console import make_console
from gpuflame.render.terminal import render_comparison

HELP = "what grew and what shrank between two profiles"

DESCRIPTION = """\
Compare two profiles of the same program (before and after a change, two
batch sizes, two ranks) function by function: new minus base.

For each function: its value in BASE and in NEW, the difference, and the
change in percent. [new] marks a function absent from BASE, [vanished] one
absent from NEW. By default functions are compared by total (the function
and all it calls: who is responsible for the growth); --by self compares
what each function allocated itself (where the growth is taken).

A script renamed between the two runs (train.py, then train_v2.py) is
compared as one file: its <module> and its functions are matched by name,
and the output says so (--no-align compares them as two files, each
[new] or [vanished]). A file counts as renamed when its <module> is in one
profile and no frame of the other names it, one such file on each side (or
several paired by equal file names in different folders).

Only sample types present in both files are compared; the same filters
apply to both files."""

EPILOG = f"""\
examples:
  gpuflame diff before.pb.gz after.pb.gz
  gpuflame diff before.pb.gz after.pb.gz --by self -n 20
  gpuflame diff rank0.pb.gz rank1.pb.gz --type inuse --no-cached --json

{FILTER_ORDER}"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("base", metavar="BASE", help="the profile to compare against")
    parser.add_argument("new", metavar="NEW", help="the profile to compare")
    parser.add_argument(
        "--by", choices=("total", "self"), default="total", help="compare by total or self (default total)"
    )
    parser.add_argument(
        "-n", "--limit", type=positive_count, default=10, metavar="N", help="functions per direction (default 10)"
    )
    parser.add_argument(
        "--no-align",
        dest="align",
        action="store_false",
        help="compare a renamed script as two files (default: its <module> and functions matched by name)",
    )
    add_analysis_options(parser)


def run(args: argparse.Namespace) -> int:
    # --at/--between: each file at its own time (seconds from its own strip's start)
    base, new = (opened.profile for opened in open_each_args(args, [args.base, args.new]))
    comparison = compare(base, new, args.type, by=args.by, limit=max(1, args.limit), lines=args.lines, align=args.align)
    if args.json:
        print_json(comparison.to_dict())
    else:
        render_comparison(make_console(), comparison, args.base, args.new)
    return 0
