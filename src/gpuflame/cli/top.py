"""``gpuflame top``: the functions holding the most memory, as a table."""

from __future__ import annotations

import argparse

from gpuflame.analysis.categories import category_totals
from gpuflame.analysis.hotspots import function_stats, top_functions
from gpuflame.analysis.phases import phase_totals
from gpuflame.analysis.tree import build_table
from gpuflame.cli.common import (
    FILTER_ORDER,
    add_analysis_options,
    open_args,
    peak_json,
    positive_count,
    print_json,
)
from gpuflame.errors import GpuflameError
from gpuflame.model import Profile, SampleType
from gpuflame.pipeline import Opened
from gpuflame.render.console import make_console
from gpuflame.render.terminal import amount, categories_table, print_comments, render_top, type_title

HELP = "the top functions by self or total, or memory by category or phase"

DESCRIPTION = """\
The functions holding the most memory, largest first.

  --by self    what each function allocated itself: the leaf bars, where the
               memory is actually taken (the default)
  --by total   the function and everything it calls: the wide bars at the
               bottom, which say who is responsible
  --by category  what kind of memory: parameter, frozen_parameter, gradient,
               optimizer_state, kv_cache, comm_buffer, activation, other,
               cached_free, outside_framework
               (the `category` label the torch backends record; docs/categories.md),
               each with the function that allocated most of it
  --by phase   the phase the memory was allocated in (gpuflame.phase, or the
               phases gpuflame marks in transformers, vLLM, Lightning and Accelerate;
               docs/phases-and-moments.md), in
               the order the phases began; `report` adds each phase's own peak

A function with a large total and zero self only calls others: skip it and
look at what it calls. A function counted twice in one stack (recursion)
counts once in its total."""

EPILOG = f"""\
examples:
  gpuflame top run.pb.gz
  gpuflame top run.pb.gz --by total -n 30
  gpuflame top run.pb.gz --by category --type inuse
  gpuflame top run.pb.gz --by phase --json
  gpuflame top run.pb.gz --type alloc_space --prune-framework
  gpuflame top run.pb.gz --json

{FILTER_ORDER}"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE", help="profile: pprof (.pb.gz), folded, or PyTorch snapshot")
    parser.add_argument(
        "--by",
        choices=("self", "total", "category", "phase"),
        default="self",
        help="rank functions by self or total, or sum by category or phase (default self)",
    )
    parser.add_argument(
        "-n", "--limit", type=positive_count, default=20, metavar="N", help="how many functions (default 20)"
    )
    add_analysis_options(parser)


def run(args: argparse.Namespace) -> int:
    opened = open_args(args, args.files)
    if args.by in ("category", "phase"):
        return _by_label(args, opened)
    table = build_table(opened.profile, opened.type_index, lines=args.lines)
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
                "comments": opened.profile.comments,
                **peak_json(opened.profile, sample_type.type),
                "functions": [e.to_dict() for e in entries],
            }
        )
        return 0
    console = make_console()
    print_comments(console, opened.profile.comments, shown=opened.profile.peak_description(sample_type.type))
    render_top(
        console,
        entries,
        args.by,
        sample_type.type,
        sample_type.unit,
        stats.grand_total,
        opened.profile.peak_description(sample_type.type),
    )
    return 0


# --by category / phase: what the table sums by, and what to say when the profile has no such label
_BY_LABEL = {
    "category": (
        category_totals,
        "categories",
        "this profile has no categories: only the torch backends record them (see docs/categories.md)",
    ),
    "phase": (
        phase_totals,
        "phases",
        'this profile has no phases: mark them with gpuflame.phase("name") (see docs/phases-and-moments.md)',
    ),
}


def _by_label(args: argparse.Namespace, opened: Opened) -> int:
    profile = opened.profile
    sample_type = profile.sample_types[opened.type_index]
    totals_of, key, missing = _BY_LABEL[args.by]
    rows = totals_of(profile, opened.type_index)
    if not rows:
        raise GpuflameError(_why_no_rows(args, profile, sample_type, key, missing))
    if args.json:
        total = sum(c.total for c in rows)
        print_json(
            {
                "sample_type": sample_type.type,
                "unit": sample_type.unit,
                "total": total,
                "by": args.by,
                "comments": profile.comments,
                key: [_row_json(c.to_dict(), args.by) for c in rows],
            }
        )
        return 0
    console = make_console()
    described = profile.peak_description(sample_type.type)
    print_comments(console, profile.comments, shown=described)
    total = sum(c.total for c in rows)
    console.print(type_title(sample_type.type, sample_type.unit, total, described))
    console.print()
    console.print(categories_table(rows, sample_type.unit, args.by))
    return 0


def _why_no_rows(args: argparse.Namespace, profile: Profile, sample_type: SampleType, key: str, missing: str) -> str:
    """Why ``--by category|phase`` has nothing to show: a moment, nothing of this type held, or no such label."""
    label = "category" if args.by == "category" else "phase"
    type_name = sample_type.type
    if any(s.label(label) is not None for s in profile.samples):
        peak = "peak_objects" if type_name.endswith("_objects") else "peak_space"
        hint = f"; --type {peak} shows the peak" if type_name != peak else ""
        return (
            f"no {key} to show: {type_name} is {amount(0, sample_type.unit)} in this profile "
            f"(nothing of it was held{hint})"
        )
    if getattr(args, "at", None) is not None or getattr(args, "between", None):
        return _why_no_rows_at_a_moment(args, profile, type_name, key)
    if args.by == "phase" and profile.phases:  # marked, but sampled (JAX): no buffer says its phase
        return (
            "this profile's samples carry no phase (the jax backend samples live buffers, and JAX does not "
            "say in which phase a buffer was made); gpuflame report shows each phase's sampled peak"
        )
    return missing


def _why_no_rows_at_a_moment(args: argparse.Namespace, profile: Profile, type_name: str, key: str) -> str:
    """A moment (--at/--between) with no label to sum by: nothing in it, no phases kept, or an older file.

    The history keeps each block's category (so a moment with memory and no category is a file written
    before it did, or a snapshot read without categories), and never phases.
    """
    moment = profile.peak_description(type_name) or "this moment"
    if not profile.totals().get(type_name):
        return f"no {key} to show: {moment}: 0 B (--at peak is the strip's highest moment)"
    if args.by == "phase":
        return (
            "--at and --between profiles are not split by phase (the event history keeps stacks and "
            "categories, not phases); drop --at/--between to see the phases of the whole recording"
        )
    return (
        "this profile's event history carries no categories (it was written before gpuflame kept each "
        "block's category with its events, or read from a PyTorch snapshot, which has none); drop "
        "--at/--between to see the categories of the whole recording"
    )


def _row_json(row: dict[str, object], by: str) -> dict[str, object]:
    return row if by == "category" else {by: row.pop("category"), **row}
