"""Options every analysis command shares, and the :class:`~gpuflame.pipeline.Request` they make.

Filters apply in one fixed order (:data:`FILTER_ORDER`), whatever their order
on the command line, so a command line means one thing: first choose which
samples count, then reshape the stacks, and cut small bars last, once the
tree they are measured in is final.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpuflame.analysis.selection import Selection
from gpuflame.boundary.backends import AUTO, frameworks
from gpuflame.cli.options import add_force_option  # noqa: F401  (the analysis commands take it from here)
from gpuflame.errors import GpuflameError
from gpuflame.launch.store import PROFILE_NAME
from gpuflame.model import DEFAULT_FRAMEWORKS
from gpuflame.model.moment import When, parse_when
from gpuflame.model.peak import is_exact
from gpuflame.model.profile import Profile
from gpuflame.pipeline import Opened, Request, open_each, open_profile
from gpuflame.pipeline import load_profile as load_profile  # noqa: F401  (the one loader; tests read it here)
from gpuflame.printable import printable
from gpuflame.symbols.source_paths import parse_root
from gpuflame.units import parse_size

FILTER_ORDER = f"""\
filters, applied in this order whatever their order on the command line:
  1. --label KEY=VALUE       keep one process, rank, device, ... (repeat: same key = any of, keys = all of)
  2. --no-cached             drop <cached free blocks> (reserved by the allocator, not in use)
  3. --ignore PATTERN        drop the samples whose stack passes through a matching frame
  4. --focus NAME            keep the samples through NAME; NAME becomes the root
  5. --hide PATTERN, --hide-trampolines
                             remove matching frames; their bytes stay with the callers
  6. --prune-framework       remove framework frames ({", ".join(frameworks(AUTO))}) between your own frames
  7. --min-size SIZE         fold bars narrower than SIZE into one <frames under SIZE> bar
Names match either spelling (Foo.bar or "Foo > bar"), anywhere in the name, ignoring case."""


def add_type_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--type",
        metavar="TYPE",
        help="sample type: peak_space, inuse_space, alloc_space, *_objects, or peak/inuse/alloc "
        "(default: peak where present, else inuse, else alloc)",
    )


def add_json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON (exact values) instead of tables")


def add_moment_options(parser: argparse.ArgumentParser) -> None:
    """``--at TIME`` / ``--between T1 T2``: any moment of the memory-over-time strip (model/moment.py)."""
    group = parser.add_argument_group(
        "any moment (TIME: 1.5 or 250ms on the memory-over-time strip, whose 0 is the first allocation; "
        "+2s from the recording's start; 14:03:07.5 on the wall clock; or peak)"
    )
    when = group.add_mutually_exclusive_group()
    when.add_argument(
        "--at", type=moment_arg, metavar="TIME", help="show what was live at TIME instead of the peak and the end"
    )
    when.add_argument(
        "--between",
        type=moment_arg,
        nargs=2,
        metavar=("T1", "T2"),
        help="show what was allocated from T1 to T2 (freed since or not)",
    )


def moment_arg(text: str) -> When:
    try:
        return parse_when(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_filter_options(parser: argparse.ArgumentParser) -> None:
    add_moment_options(parser)
    group = parser.add_argument_group("filters (see the order below)")
    group.add_argument(
        "--label",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        type=label_pair,
        help="keep samples with this label, e.g. pid=1234, rank=1 or device=cuda:0",
    )
    group.add_argument("--no-cached", action="store_true", help="drop <cached free blocks>")
    group.add_argument(
        "--ignore",
        action="append",
        default=[],
        type=name_pattern,
        metavar="PATTERN",
        help="drop samples through a matching frame (repeatable)",
    )
    group.add_argument(
        "--focus", type=name_pattern, metavar="NAME", help="keep samples through NAME, with NAME as the root"
    )
    group.add_argument(
        "--hide",
        action="append",
        default=[],
        type=name_pattern,
        metavar="PATTERN",
        help="remove matching frames, keeping their bytes (repeatable)",
    )
    group.add_argument("--hide-trampolines", action="store_true", help="remove <interpreter trampoline> frames")
    group.add_argument(
        "--prune-framework",
        nargs="?",
        const=",".join(DEFAULT_FRAMEWORKS),
        metavar="PKGS",
        help="remove framework frames between user frames; name packages as --prune-framework=PKGS, "
        f"a comma list (default {','.join(DEFAULT_FRAMEWORKS)})",
    )
    group.add_argument(
        "--min-size",
        type=size_arg,
        metavar="SIZE",
        help="fold bars under SIZE (4096, 512KiB, 10MiB, 1.5G; units are binary)",
    )


def add_lines_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--lines",
        action="store_true",
        help="one bar per source line instead of one per function (a function's file:line is where it is defined)",
    )


def add_analysis_options(parser: argparse.ArgumentParser) -> None:
    """``--type``, ``--json``, ``--lines``, the filters and how PyTorch snapshots are read."""
    add_type_option(parser)
    add_json_option(parser)
    add_lines_option(parser)
    add_filter_options(parser)
    add_snapshot_options(parser)


def add_snapshot_options(parser: argparse.ArgumentParser) -> None:
    """``--native`` and ``--source-root``: how a PyTorch snapshot's stacks are read."""
    group = parser.add_argument_group("PyTorch snapshots")
    group.add_argument(
        "--native",
        action="store_true",
        help='keep the C++ frames a stacks="all" snapshot records between the allocation and the Python '
        "caller (default: the op, e.g. aten::zeros_like, above the Python frame that called it)",
    )
    group.add_argument(
        "--source-root",
        action="append",
        default=[],
        metavar="OLD=NEW",
        type=source_root,
        help="the recording machine's path prefix OLD is NEW here, to read the source for class names "
        "(repeatable; installed packages are also looked for in this machine's site-packages)",
    )


def source_root(text: str) -> tuple[str, str]:
    try:
        return parse_root(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_count(text: str) -> int:
    """A count of rows or chains: a whole number, at least 1 (``-n 0`` would show nothing)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number of at least 1, got {value}")
    return value


def name_pattern(text: str) -> str:
    """A function name or pattern: an empty one would match every frame."""
    if not text.strip():
        raise argparse.ArgumentTypeError("the name is empty (an empty pattern would match every function)")
    return text


def label_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def size_arg(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def selection_from_args(args: argparse.Namespace) -> Selection:
    """The view the command line asks for: the one :class:`Selection` every front end builds."""
    prune = getattr(args, "prune_framework", None)
    return Selection(
        sample_type=getattr(args, "type", None),
        labels=tuple(getattr(args, "label", [])),
        no_cached=getattr(args, "no_cached", False),
        ignore=tuple(getattr(args, "ignore", [])),
        focus=getattr(args, "focus", None),
        hide=tuple(getattr(args, "hide", [])),
        hide_trampolines=getattr(args, "hide_trampolines", False),
        prune_framework=tuple(p for p in (prune or "").split(",") if p.strip()),
        min_size=getattr(args, "min_size", None) or 0,
        at=getattr(args, "at", None),
        between=(args.between[0], args.between[1]) if getattr(args, "between", None) else None,
        group_by=getattr(args, "group_by", None),
        lines=getattr(args, "lines", False),
    )


def command_prefix(args: argparse.Namespace) -> str:
    """``gpuflame report``: how a warning names the command that says it."""
    command = getattr(args, "command", None)
    return f"gpuflame {command}" if command else "gpuflame"


def request_from_args(args: argparse.Namespace, paths: Sequence[str]) -> Request:
    """What the command line asks to read: *paths*, the :class:`Selection`, how snapshots are read."""
    for path in paths:
        _not_a_run_folder(path)
    return Request(
        paths=tuple(paths),
        selection=selection_from_args(args),
        native=bool(getattr(args, "native", False)),
        source_roots=tuple(getattr(args, "source_root", None) or []),
    )


def _not_a_run_folder(path: str) -> None:
    """A run folder of the store (what ``gpuflame serve`` lists) given for its profile: name the file in it."""
    folder = Path(path)
    if path != "-" and folder.is_dir() and (folder / PROFILE_NAME).is_file():
        raise GpuflameError(f"{path}: is a run folder, not a profile file; its profile is {folder / PROFILE_NAME}")


def open_args(args: argparse.Namespace, paths: Sequence[str]) -> Opened:
    """Read *paths* as one profile, at the moment and with the filters of *args*; the notes on stderr."""
    return say_notes(args, open_profile(request_from_args(args, paths)))


def open_each_args(args: argparse.Namespace, paths: Sequence[str]) -> list[Opened]:
    """Each of *paths* on its own, each at its own moment, with the filters of *args*; the notes on stderr."""
    return [say_notes(args, opened) for opened in open_each(request_from_args(args, paths))]


def say_notes(args: argparse.Namespace, opened: Opened) -> Opened:
    """A filter that matched nothing, said as the command's warning (stderr: the output stays clean)."""
    for note in opened.notes:
        sys.stderr.write(printable(f"{command_prefix(args)}: warning: {note}") + "\n")
    return opened


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


def profile_summary(profile: Profile, type_index: int) -> dict[str, Any]:
    """What a machine reading ``--json`` wants to know of a written profile: its size, totals and notes."""
    totals = profile.totals()
    return {
        "default_type": profile.sample_types[type_index].type,
        "totals": {st.type: {"unit": st.unit, "total": totals[st.type]} for st in profile.sample_types},
        "samples": len(profile.samples),
        "frames": len(profile.frames),
        "labels": {key: profile.label_values(key) for key in profile.label_keys()},
        "comments": list(profile.comments),
    }


def peak_json(profile: Profile, type_name: str) -> dict[str, object]:
    """``"peak"`` for ``--json`` of a peak type: what the total is, whether it happened, per device."""
    if profile.moment:
        return {"moment": profile.moment}
    description = profile.peak_description(type_name)
    if not description:
        return {}
    units = profile.peak_units()
    per_device = profile.device_totals(profile.type_index(type_name))
    shown = [u for u in units if u.device in per_device] or units
    several = len({u.device for u in shown}) > 1  # each device's own moment: the sum is not one moment
    out: dict[str, object] = {
        "description": description,
        "exact": is_exact(shown) and not several,
        "devices": [{**u.to_json(), "peak": per_device.get(u.device, 0)} for u in shown],
    }
    joint = profile.joint_device_peak() if several else None
    if joint:
        out["devices_together"] = {"allocated": joint[1], "at_ns": joint[0]}
    return {"peak": out}
