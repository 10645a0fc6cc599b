"""``gpuflame explain``: why a function allocates, as the call chains leading to it."""

from __future__ import annotations

import argparse

from gpuflame.analysis.chains import explain
from gpuflame.cli.common import (
    FILTER_ORDER,
    add_analysis_options,
    name_pattern,
    open_args,
    positive_count,
    print_json,
)
from gpuflame.render.console import make_console
from gpuflame.render.terminal import print_comments, render_explanation

HELP = "the call chains that lead to a function"

DESCRIPTION = """\
Why does a function allocate? Every distinct call chain that leads to it,
widest first, read bottom-up as a flame graph's stack is read: the entry
point first (native entry, <interpreter trampoline>, <module>), then each
caller, down to the function you named, for example

  <module>                                  script top level
  -> EngineCoreProc > run_engine_core       engine startup
  -> EngineCore > _initialize_kv_caches     KV cache setup
  -> GPUModelRunner > _allocate_kv_cache_tensors   the allocation

Each step shows its total (it and everything it calls, over every chain
through it; the chain's own share is in the chain's title) and its self
(allocated by it), and its file:line is the line that made the next call
(or the allocation), "+N lines" when the chain runs through several lines
of it; --json lists them all with their bytes and gives def_line, where the
function is defined. Steps with zero self only pass the call on; the step
where self appears is where the memory is taken. Under the last step, the
widest functions it calls are listed.

FUNCTION matches either spelling: GPUModelRunner._allocate_kv_cache_tensors
or "GPUModelRunner > _allocate_kv_cache_tensors", or just the method name.
A whole-name match wins over a match inside longer names."""

EPILOG = f"""\
examples:
  gpuflame explain run.pb.gz GPUModelRunner._allocate_kv_cache_tensors
  gpuflame explain run.pb.gz "LlamaMLP > __init__" --chains 10
  gpuflame explain run.pb.gz forward --hide-trampolines --json

{FILTER_ORDER}"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE", help="profile: pprof (.pb.gz), folded, or PyTorch snapshot")
    parser.add_argument("function", type=name_pattern, metavar="FUNCTION", help="function name, Foo.bar or 'Foo > bar'")
    parser.add_argument(
        "--chains", type=positive_count, default=5, metavar="N", help="chains shown in full (default 5)"
    )
    add_analysis_options(parser)


def run(args: argparse.Namespace) -> int:
    opened = open_args(args, [args.file])
    tree = opened.view.tree()
    explanation = explain(tree, args.function, limit=max(1, args.chains))
    sample_type = tree.table.sample_type
    if args.json:
        print_json(
            {
                "sample_type": sample_type.type,
                "unit": sample_type.unit,
                "profile_total": tree.total,
                "comments": opened.profile.comments,
                **explanation.to_dict(),
            }
        )
        return 0
    console = make_console()
    print_comments(console, opened.profile.comments)
    render_explanation(console, explanation, sample_type.type, sample_type.unit)
    return 0
