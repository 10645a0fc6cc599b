"""``gpuflame export``: write a profile as pprof, folded stacks, speedscope, flame-tree JSON or an SVG picture."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from typing import Any

from gpuflame.cli.common import (
    FILTER_ORDER,
    add_filter_options,
    add_force_option,
    add_snapshot_options,
    add_type_option,
    command_prefix,
    open_args,
    print_json,
    profile_summary,
)
from gpuflame.files import STDIO, check_output
from gpuflame.formats.torch_snapshot import UNITS_NOTE
from gpuflame.model.profile import Profile
from gpuflame.printable import printable
from gpuflame.render.writers import FORMATS, output_format, save
from gpuflame.units import format_bytes, format_count

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
.speedscope.json, .json, .svg), and is pprof when the name says nothing.
"-o -" writes to standard output; "-" as FILE reads the profile from
standard input. `gpuflame convert` is this command under another name.

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
    parser.add_argument("--format", choices=FORMATS, help="output format (default: from OUT's name, else pprof)")
    add_force_option(parser)
    add_type_option(parser)
    parser.add_argument("--json", action="store_true", help="describe what was written as JSON")
    add_filter_options(parser)
    add_snapshot_options(parser)


def run(args: argparse.Namespace) -> int:
    fmt = output_format(args.output, args.format)
    to_stdout = args.output == STDIO
    if not to_stdout:
        writes = None if fmt == "pprof" else f"{fmt} output"  # only a profile replaces a profile
        check_output(args.output, [args.file], force=args.force, writes=writes)
    opened = open_args(args, [args.file])  # an unknown --type fails here, before anything is written
    profile = opened.profile
    type_name = profile.sample_types[opened.type_index].type
    if args.type:
        profile.default_type = type_name  # pprof keeps every type: the one asked for opens first
    save(profile, args.output, fmt, type_name)
    if to_stdout:
        return 0  # standard output holds the profile: nothing else may go there
    written = _written(args, fmt, opened.type_index, profile)
    if args.json:
        print_json(written)
    else:
        _say(args, written)
    return 0


def _written(args: argparse.Namespace, fmt: str, type_index: int, profile: Profile) -> dict[str, Any]:
    """What ``--json`` prints; ``bytes_written`` and ``type`` are the names ``convert`` printed before."""
    size = _size(args.output)
    sample_type = None if fmt == "pprof" else profile.sample_types[type_index].type
    return {
        "input": str(args.file),
        "output": str(args.output),
        "format": fmt,
        "bytes": size,
        "bytes_written": size,
        "sample_type": sample_type,
        "type": sample_type,
        **profile_summary(profile, type_index),
        "next": _next_command(args, fmt),
    }


def _next_command(args: argparse.Namespace, fmt: str) -> str:
    if fmt in ("pprof", "folded"):
        return f"gpuflame report {shlex.quote(str(args.output))}"
    if fmt == "speedscope":
        return f"open https://www.speedscope.app and load {shlex.quote(str(args.output))}"
    if fmt == "svg":
        return f"open {shlex.quote(str(args.output))} in a browser"
    return f"gpuflame report {shlex.quote(str(args.file))}"


def _say(args: argparse.Namespace, written: dict[str, Any]) -> None:
    """One line for the file, the caveats the profile carries on stderr, then what to run next."""
    what = "all sample types" if written["format"] == "pprof" else written["sample_type"]
    samples = written["samples"]
    counted = f"{samples} sample{'' if samples == 1 else 's'}"
    totals = ", ".join(f"{name} {format_count(t['total'], t['unit'])}" for name, t in written["totals"].items())
    devices = written["labels"].get("device")
    where = f" on {', '.join(devices)}" if devices else ""
    print(
        printable(
            f"wrote {args.output} ({written['format']}, {what}, {counted}, "
            f"{format_bytes(written['bytes'])}){where}: {totals}"
        )
    )
    for comment in written["comments"]:
        if comment != UNITS_NOTE:  # the units are in convert --help and in the file; the rest as report says them
            sys.stderr.write(printable(f"{command_prefix(args)}: note: {comment}") + "\n")
    print(printable(f"next: {written['next']}"))


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:  # written, then moved away by someone else: not our failure
        return 0
