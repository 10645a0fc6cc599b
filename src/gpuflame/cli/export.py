"""``gpuflame export``: write a profile as pprof, folded stacks, speedscope, flame-tree JSON or an SVG picture."""

from __future__ import annotations

import argparse
import os

from gpuflame.cli.common import (
    FILTER_ORDER,
    add_filter_options,
    add_force_option,
    add_snapshot_options,
    add_type_option,
    load_for_analysis,
    print_json,
)
from gpuflame.errors import GpuflameError
from gpuflame.files import STDIO, check_output
from gpuflame.formats import FORMATS, save
from gpuflame.formats.detect import format_from_name
from gpuflame.units import format_bytes

HELP = "write pprof, folded, speedscope, flame-tree JSON or an SVG flame graph"

DESCRIPTION = """\
Write the profile, after the filters, in another format:

  pprof        gzip protobuf, every sample type (go tool pprof, Pyroscope, Grafana)
  folded       "a;b;c 123" lines for flamegraph.pl --countname bytes (one sample type)
  speedscope   speedscope.app JSON, unit bytes (one sample type)
  json         the flame tree: name, file, line, kind, self, total, children
  svg          a static flame graph picture (roots at the bottom, tooltips with
               self and total), for CI logs, reports and pull requests

Text formats carry one sample type (--type; default peak, else inuse, else
alloc). The file is written to a temporary name and renamed into place, so
a failed export never leaves a partial file and never damages an existing
one. Without --format, the format follows OUT's name (.pb.gz, .folded,
.speedscope.json, .json, .svg). "-o -" writes to standard output (give
--format); "-" as FILE reads the profile from standard input.

OUT may replace a file gpuflame wrote; an input, a folder or any other
existing file is refused (--force replaces another file)."""

EPILOG = f"""\
examples:
  gpuflame export run.pb.gz --format folded -o run.folded
  flamegraph.pl --countname bytes run.folded > run.svg
  gpuflame export snapshot.pickle -o run.pb.gz
  gpuflame export run.pb.gz --type inuse --no-cached -o run.speedscope.json
  gpuflame export run.pb.gz --format json -o tree.json
  gpuflame export run.pb.gz --type inuse -o flame.svg
  gpuflame export run.pb.gz --format folded -o - | flamegraph.pl --countname bytes > run.svg

{FILTER_ORDER}"""

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE", help="profile: pprof (.pb.gz), folded, or PyTorch snapshot")
    parser.add_argument("-o", "--output", required=True, metavar="OUT", help="file to write; - for standard output")
    parser.add_argument("--format", choices=FORMATS, help="output format (default: from OUT's name)")
    add_force_option(parser)
    add_type_option(parser)
    parser.add_argument("--json", action="store_true", help="describe what was written as JSON")
    add_filter_options(parser)
    add_snapshot_options(parser)


def format_for(path: str) -> str:
    if path == STDIO:
        raise GpuflameError(f"writing to standard output: say which format with --format {'|'.join(FORMATS)}")
    fmt = format_from_name(path)
    if fmt is None:
        raise GpuflameError(f"cannot tell the format from {path!r}; add --format {'|'.join(FORMATS)}")
    return fmt


def run(args: argparse.Namespace) -> int:
    fmt = args.format or format_for(args.output)
    to_stdout = args.output == STDIO
    if not to_stdout:
        check_output(args.output, [args.file], force=args.force)
    loaded = load_for_analysis(args, [args.file])
    type_name = loaded.profile.sample_types[loaded.type_index].type
    save(loaded.profile, args.output, fmt, type_name)
    if to_stdout:
        return 0  # standard output holds the profile: nothing else may go there
    size = os.path.getsize(args.output)
    written = {
        "output": args.output,
        "format": fmt,
        "bytes": size,
        "samples": len(loaded.profile.samples),
        "sample_type": None if fmt == "pprof" else type_name,
    }
    if args.json:
        print_json(written)
    else:
        what = "all sample types" if fmt == "pprof" else type_name
        samples = len(loaded.profile.samples)
        counted = f"{samples} sample{'' if samples == 1 else 's'}"
        print(f"wrote {args.output} ({fmt}, {what}, {counted}, {format_bytes(size)})")
    return 0
