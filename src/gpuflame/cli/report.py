"""``gpuflame report``: one screen that answers the AKS guide's quick-reference table."""

from __future__ import annotations

import argparse

from gpuflame.analysis.hotspots import build_report
from gpuflame.analysis.summary import fragmented, reserved_peaks
from gpuflame.cli.common import (
    FILTER_ORDER,
    add_analysis_options,
    open_args,
    peak_json,
    positive_count,
    print_json,
)
from gpuflame.model.moment import origin
from gpuflame.model.peak import PeakUnit, is_joint
from gpuflame.model.process_table import ProcessRow, process_rows, uneven
from gpuflame.model.profile import Profile
from gpuflame.printable import printable
from gpuflame.render.console import make_console
from gpuflame.render.process_tables import process_sections
from gpuflame.render.terminal import render_report
from gpuflame.units import format_bytes

HELP = "what holds the memory, on one screen"

DESCRIPTION = """\
What holds the GPU memory? One screen answering the four questions of a
flame graph's quick-reference table, for one sample type (peak by default):

  what allocates the most       the widest leaf bars: functions by self
  what is responsible           the widest bars at the bottom, followed up
                                to where their width splits into branches
  optimisation targets          wide bars whose width is mostly their own
                                allocation (high self / total)
  what you can skip             wide bars with ~zero self: they only call
                                others (orchestration, <module>, wrappers)

Total = the function and everything it calls; self = what it allocated
itself. Start from the leaves; skip wide zero-self bars; wide high-self bars
are the targets; read a stack bottom-up (gpuflame explain) to learn why.
Warnings recorded in the profile (for example a trace that overflowed, so
the peak covers only the recorded window) are printed first. The header says
what the peak is: one moment that happened (a process's highest total, or the
highest total of a run's processes together), or a bound (peaks of processes
that overlapped in time with no common clock, summed), or sampled (JAX).

A profile of several processes (gpuflame run of torchrun, Accelerate,
DeepSpeed, Lightning, srun) gets a table per process, sorted by rank: its
pid, rank and command line, its own peak and when, and what it held at the
joint peak by category; then how uneven the ranks were (the largest own
peak over the smallest). --label rank=1 shows one rank.

Sizes are bytes. From a PyTorch snapshot, every view counts the bytes each
allocation asked for; <allocator rounding> and <cached free blocks> are the
rest of what the allocator reserved (gpuflame convert --help)."""

EPILOG = f"""\
examples:
  gpuflame report run.pb.gz
  gpuflame report run.pb.gz --type inuse --no-cached
  gpuflame report run.pb.gz --label device=cuda:0 --hide-trampolines -n 5
  gpuflame report rank0.pb.gz rank1.pb.gz          # several files are merged
  gpuflame report run.pb.gz --json | jq '.widest_leaves[0]'

{FILTER_ORDER}"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE", help="profile: pprof (.pb.gz), folded, or PyTorch snapshot")
    parser.add_argument(
        "-n", "--limit", type=positive_count, default=10, metavar="N", help="entries per section (default 10)"
    )
    parser.add_argument("--group-by", metavar="LABEL", help="one subtree per value of a label (pid, device, ...)")
    add_analysis_options(parser)


def run(args: argparse.Namespace) -> int:
    opened = open_args(args, args.files)
    tree = opened.view.tree()
    report = build_report(opened.profile, tree, limit=max(1, args.limit))
    peak = opened.profile.peak_description(report.type)
    units = reserved_peaks(opened.profile)
    found = fragmented(opened.profile)
    processes = shown_processes(opened.profile)
    spread = uneven(processes)
    hint = None
    if found is not None:
        reserved, allocated = found
        hint = (
            f"reserved {format_bytes(reserved)}, allocated {format_bytes(allocated)} at the reserved peak: "
            f"try `gpuflame simulate {' '.join(args.files)} --suggest`"
        )
    if args.json:
        print_json(
            {
                **report.to_dict(),
                **peak_json(opened.profile, report.type),
                "fragmentation_hint": hint,
                "reserved_peak": [
                    {
                        "device": u.device,
                        "reserved": u.reserved,
                        "allocated": u.reserved_allocated,
                        "at_ns": u.reserved_at,
                    }
                    for u in units
                ]
                or None,
                "processes": [r.to_dict() for r in processes],
                "uneven": spread.to_dict() if spread else None,
            }
        )
    else:
        console = make_console()
        joint = is_joint(opened.profile.peak_units())
        sections = process_sections(processes, joint, spread)
        render_report(console, report, opened.source, peak, sections, moment=bool(opened.profile.moment))
        for line in [*(reserved_line(opened.profile, u) for u in units), *([hint] if hint else [])]:
            console.print(printable(line), markup=False, highlight=False, soft_wrap=True)
    return 0


def shown_processes(profile: Profile) -> list[ProcessRow]:
    """A row per process where there are several, or one that has a rank (``--label rank=1``); else none."""
    rows = process_rows(profile)
    return rows if len(rows) > 1 or any(r.info.rank for r in rows) else []


def reserved_line(profile: Profile, unit: PeakUnit) -> str:
    """The allocator's true reserved peak on one device, beside what it held when the allocations peaked."""
    zero = origin(profile)
    at = ""
    if unit.reserved_at and zero:
        at = (
            f" {(unit.reserved_at - zero) / 1e9:.3f} s into the strip"
            if unit.reserved_at > zero
            else " from the start of the trace"
        )
    line = (
        f"{unit.device}: the allocator's reserved peak {format_bytes(unit.reserved)}{at}, "
        f"{format_bytes(unit.reserved_allocated)} of it allocated"
    )
    if "peak_space" in profile.type_names():
        at_peak = profile.device_totals(profile.type_index("peak_space")).get(unit.device, 0)
        if at_peak != unit.reserved:
            line += f"; {format_bytes(at_peak)} reserved when the allocations peaked (peak_space)"
    return line
