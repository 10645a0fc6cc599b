"""``gpuflame view``: the interactive flame graph as one offline HTML file."""

from __future__ import annotations

import argparse
import os
import webbrowser
from pathlib import Path

from gpuflame.cli.common import FILTER_ORDER, add_filter_options, add_type_option, load_for_analysis
from gpuflame.files import atomic_write
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
of functions sorted by self or total.

Every sample type is in the file; --type only picks the one shown first.
Without -o the file is written next to the profile (run.pb.gz -> run.html)."""

EPILOG = f"""\
examples:
  gpuflame view run.pb.gz                 writes run.html next to it
  gpuflame view run.pb.gz -o /tmp/x.html --open
  gpuflame view run.pb.gz --type inuse --no-cached

{FILTER_ORDER}"""

# Profile suffixes dropped to name the HTML file, longest first.
PROFILE_SUFFIXES = (
    ".speedscope.json", ".pb.gz", ".pickle.gz", ".folded", ".pickle", ".pprof", ".json", ".txt", ".pb", ".gz",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE", help="profile: pprof (.pb.gz), folded, or PyTorch snapshot")
    parser.add_argument("-o", "--output", metavar="OUT", help="HTML file to write (default: FILE's name with .html)")
    parser.add_argument("--open", action="store_true", help="open the page in the default browser")
    parser.add_argument("--svg", metavar="SVG", help="also write a static SVG flame graph (for CI logs and reviews)")
    add_type_option(parser)
    add_filter_options(parser)


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
    loaded = load_for_analysis(args, [args.file])
    output = args.output or default_output(args.file)
    type_index = loaded.type_index if args.type else None
    page = render_html(loaded.profile, os.path.basename(args.file), type_index)
    atomic_write(output, page)
    uri = Path(output).resolve().as_uri()
    print(f"wrote {output} ({format_bytes(len(page.encode('utf-8')))}, offline, all sample types)")
    if args.svg:
        picture = svg.encode(loaded.profile, loaded.type_index, title=os.path.basename(args.file))
        atomic_write(args.svg, picture)
        shown = loaded.profile.sample_types[loaded.type_index].type
        print(f"wrote {args.svg} ({format_bytes(len(picture.encode('utf-8')))}, svg, {shown})")
    if args.open:
        webbrowser.open(uri)
    else:
        print(f"open it in a browser: {uri}")
    return 0
