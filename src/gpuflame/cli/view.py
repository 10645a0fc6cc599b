"""``gpuflame view``: the interactive flame graph as one offline HTML file."""

from __future__ import annotations

import argparse
import os
import webbrowser
from pathlib import Path
from typing import Any

from gpuflame.cli.common import (
    FILTER_ORDER,
    add_filter_options,
    add_force_option,
    add_snapshot_options,
    add_type_option,
    open_args,
    print_json,
    profile_summary,
)
from gpuflame.errors import GpuflameError
from gpuflame.files import STDIO, atomic_write, check_output
from gpuflame.printable import printable
from gpuflame.render import svg
from gpuflame.render.html import render_html
from gpuflame.units import format_bytes

HELP = "the interactive flame graph as one offline HTML file"

DESCRIPTION = """\
Write one self-contained HTML file with the flame graph of the profile: it
opens from disk in any browser and makes no network request (the profile
is inside it, compressed). In the page: hover for self and total, search
(Foo.bar or "Foo > bar"), click a bar to focus it (the breadcrumb goes back),
switch sample type (peak, in use, allocated, objects) and label, hide
<interpreter trampoline> frames, flip to an icicle, and open the top table
of functions sorted by self or total. Click the memory-over-time strip for
the flame graph of what was live at that instant, drag across it for what
was allocated within that window ("back to peak / end" returns); --at and
--between write the page of that one moment instead.

With two files, BASE NEW, the page is a diff: NEW's flame graph with each
bar coloured by its change against BASE (red grew, green shrank; a
colour-blind safe palette uses orange and blue); stacks only BASE has are
listed under the graph as "vanished".

Every sample type is in the file; --type only picks the one shown first.
Without -o the file is written next to the profile (run.pb.gz -> run.html)."""

EPILOG = f"""\
examples:
  gpuflame view run.pb.gz                 writes run.html next to it
  gpuflame view run.pb.gz -o /tmp/x.html --open
  gpuflame view run.pb.gz --type inuse --no-cached
  gpuflame view base.pb.gz new.pb.gz -o diff.html   what grew, what shrank

{FILTER_ORDER}"""

# Profile suffixes dropped to name the HTML file, longest first.
PROFILE_SUFFIXES = (
    ".speedscope.json",
    ".pb.gz",
    ".pickle.gz",
    ".folded",
    ".pickle",
    ".pprof",
    ".json",
    ".txt",
    ".pb",
    ".gz",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "files",
        metavar="FILE",
        nargs="+",
        help="profile: pprof (.pb.gz), folded, or PyTorch snapshot; two files (BASE NEW) show NEW's diff against BASE",
    )
    parser.add_argument(
        "-o", "--output", metavar="OUT", help="HTML file to write (default: the (NEW) FILE's name with .html)"
    )
    parser.add_argument("--open", action="store_true", help="open the page in the default browser")
    parser.add_argument("--svg", metavar="SVG", help="also write a static SVG flame graph (for CI logs and reviews)")
    add_force_option(parser)
    parser.add_argument(
        "--json",
        action="store_true",
        help="print what was written as JSON (paths, sizes, the profile's totals and notes)",
    )
    add_type_option(parser)
    add_filter_options(parser)
    add_snapshot_options(parser)


def default_output(path: str) -> str:
    """``run.pb.gz`` -> ``run.html``, in the same folder."""
    p = Path(path)
    name = p.name
    for suffix in PROFILE_SUFFIXES:
        if name.lower().endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
            break
    return str(p.with_name(name + ".html"))


def run(args: argparse.Namespace) -> int:
    if len(args.files) > 2:
        raise GpuflameError(f"expected one profile, or two (BASE NEW) for a diff; got {len(args.files)}")
    path = args.files[-1]
    if path == STDIO and not args.output:
        raise GpuflameError("the profile comes from standard input: name the page to write with -o OUT.html")
    output = args.output or default_output(path)
    check_output(output, args.files, force=args.force, writes="an HTML page")
    if args.svg:
        check_output(args.svg, args.files, force=args.force, writes="an SVG picture")
    opened = open_args(args, [path])
    base = open_args(args, [args.files[0]]).profile if len(args.files) == 2 else None
    type_index = opened.type_index if args.type else None
    title = os.path.basename(path)
    if base is not None:
        title = f"{os.path.basename(args.files[0])} \u2192 {title}"
    page = render_html(opened.profile, title, type_index, base=base)
    atomic_write(output, page)
    uri = Path(output).resolve().as_uri()
    written: dict[str, Any] = {
        "output": output,
        "uri": uri,
        "bytes": len(page.encode("utf-8")),
        "diff_base": args.files[0] if base is not None else None,
        "svg": None,
    }
    if args.svg:
        picture = svg.encode(opened.profile, opened.type_index, title=os.path.basename(path))
        atomic_write(args.svg, picture)
        shown = opened.profile.sample_types[opened.type_index].type
        written["svg"] = {"output": args.svg, "bytes": len(picture.encode("utf-8")), "sample_type": shown}
    if args.json:
        print_json({**written, **profile_summary(opened.profile, opened.type_index)})
    else:
        _say(written, opened=args.open)
    if args.open:
        webbrowser.open(uri)
    return 0


def _say(written: dict[str, Any], opened: bool) -> None:
    kind = "all sample types" if written["diff_base"] is None else "diff against " + written["diff_base"]
    print(printable(f"wrote {written['output']} ({format_bytes(written['bytes'])}, offline, {kind})"))
    if written["svg"]:
        picture = written["svg"]
        print(printable(f"wrote {picture['output']} ({format_bytes(picture['bytes'])}, svg, {picture['sample_type']})"))
    if not opened:
        print(printable(f"open it in a browser: {written['uri']}"))
