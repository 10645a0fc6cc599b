"""``gpuflame convert``: any profile gpuflame reads, written as pprof, folded, speedscope or JSON.

The usual input is a PyTorch memory snapshot (``torch.cuda.memory._dump_snapshot``),
which becomes a gzip pprof with peak, in-use and allocated views that
``go tool pprof``, Pyroscope and Grafana read unchanged.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from typing import Any

from gpuflame.cli.common import add_force_option, add_snapshot_options, snapshot_options
from gpuflame.files import STDIO, check_output
from gpuflame.formats.detect import FORMATS, format_from_name, load, save
from gpuflame.formats.torch_snapshot import UNITS_NOTE
from gpuflame.model.profile import Profile
from gpuflame.units import format_count

HELP = "convert a PyTorch memory snapshot or a profile to pprof, folded, speedscope or JSON"

DESCRIPTION = """\
Read a GPU-memory profile in any format gpuflame reads (a PyTorch CUDA memory
snapshot pickle, gzip pprof, folded stacks) and write it as pprof (all sample
types in one file), folded stacks, speedscope JSON or a JSON flame tree (one
sample type each).

A snapshot gives three views per device: peak_* (what was live at the moment
of the highest total, from replaying the allocator trace), inuse_* (what was
live when the snapshot was taken) and alloc_* (everything the trace
allocated). Snapshots are read without running any code from the pickle.

Units: every view counts the bytes each allocation asked for (the trace
records those), so peak >= in use always. What the allocator holds beyond
that is shown as synthetic frames: <allocator rounding> (block size minus
the bytes asked for, where the block is known) and <cached free blocks>
(reserved, not allocated); in use + rounding + cached = reserved.

Stacks (stacks="all", PyTorch's default): the Python frames, root <module>,
with the op that allocated as one frame above the Python caller
(aten::zeros_like); the recorder's, the caching allocator's and CPython's
own frames are cut. Allocations on autograd's threads (no Python frame) are
under <backward pass> > the graph node (MulBackward0) > the op. --native
keeps the C++ chain. Python frames are named with their class
(AdamW > step) by reading the source: where it is not on this machine,
--source-root maps the recording machine's paths, and the output says how
many frames stay unqualified.
"""

EPILOG = """\
examples:
  gpuflame convert snapshot.pickle -o memory.pb.gz
  gpuflame convert snapshot.pickle -o memory.folded --type inuse_space
  gpuflame convert memory.pb.gz -o memory.speedscope.json
  gpuflame convert snapshot.pickle -o memory.pb.gz --json
  gpuflame convert snapshot.pickle -o memory.pb.gz --native --source-root /home/me/proj=.

The format follows the output name (.pb.gz, .folded, .speedscope.json,
.json) unless --format says otherwise; pprof when the name says nothing.
"-o -" writes to standard output (and prints no summary). OUTPUT may
replace a file gpuflame wrote; the input, a folder or any other existing
file is refused (--force replaces another file).
"""

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("input", metavar="INPUT", help="snapshot pickle, pprof (.pb.gz) or folded file")
    parser.add_argument(
        "-o", "--output", required=True, metavar="OUTPUT", help="file to write (atomically); - for standard output"
    )
    add_force_option(parser)
    parser.add_argument(
        "--format",
        choices=FORMATS,
        help="output format (default: from the output name, else pprof)",
    )
    parser.add_argument(
        "--type",
        metavar="TYPE",
        help="sample type for folded/speedscope/json, and the default view in pprof "
        "(peak_space, inuse_space, alloc_space, ...; default: peak where present, else inuse, else alloc)",
    )
    parser.add_argument("--json", action="store_true", help="print a machine-readable summary")
    add_snapshot_options(parser)


def output_format(path: str, requested: str | None) -> str:
    """The format asked for, else the one the output name implies, else pprof."""
    return requested or format_from_name(path) or "pprof"


def run(args: argparse.Namespace) -> int:
    if args.output != STDIO:
        check_output(args.output, [args.input], force=args.force)
    profile = load(args.input, **snapshot_options(args))
    fmt = output_format(args.output, args.format)
    type_index = profile.pick_type(args.type)  # an unknown --type fails before anything is written
    if args.type:
        profile.default_type = profile.sample_types[type_index].type
    save(profile, args.output, fmt, args.type)
    if args.output == STDIO:
        return 0  # standard output holds the profile: nothing else may go there
    summary = _summary(profile, args, fmt, _size(args.output), type_index)
    if args.json:
        json.dump(summary, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        _print_text(summary, profile)
    return 0


def _summary(
    profile: Profile, args: argparse.Namespace, fmt: str, size: int, type_index: int
) -> dict[str, Any]:
    totals = profile.totals()
    return {
        "input": str(args.input),
        "output": str(args.output),
        "format": fmt,
        "bytes_written": size,
        "type": profile.sample_types[type_index].type if fmt != "pprof" else None,
        "default_type": profile.sample_types[type_index].type,
        "totals": {st.type: {"unit": st.unit, "total": totals[st.type]} for st in profile.sample_types},
        "samples": len(profile.samples),
        "frames": len(profile.frames),
        "labels": {key: profile.label_values(key) for key in profile.label_keys()},
        "comments": list(profile.comments),
        "next": _next_command(args, fmt),
    }


def _next_command(args: argparse.Namespace, fmt: str) -> str:
    if fmt in ("pprof", "folded"):
        return f"gpuflame report {shlex.quote(str(args.output))}"
    if fmt == "speedscope":
        return f"open https://www.speedscope.app and load {shlex.quote(str(args.output))}"
    return f"gpuflame report {shlex.quote(str(args.input))}"


def _print_text(summary: dict[str, Any], profile: Profile) -> None:
    what = summary["format"] if summary["format"] == "pprof" else f"{summary['format']}, {summary['type']}"
    totals = ", ".join(
        f"{name} {format_count(t['total'], t['unit'])}" for name, t in summary["totals"].items()
    )
    devices = summary["labels"].get("device")
    where = f" on {', '.join(devices)}" if devices else ""
    out = sys.stdout
    size = format_count(summary["bytes_written"], "bytes")
    out.write(f"wrote {summary['output']} ({what}, {size}){where}: {totals}\n")
    for comment in profile.comments:
        if comment != UNITS_NOTE:  # the units are in --help and in the file; the rest are caveats
            sys.stderr.write(f"gpuflame convert: warning: {comment}\n")
    out.write(f"next: {summary['next']}\n")


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:  # written, then moved away by someone else: not our failure
        return 0
