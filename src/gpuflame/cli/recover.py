"""``gpuflame recover``: merge the files a killed ``gpuflame run`` left (the work is ``launch/recover.py``'s)."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpuflame.cli.common import add_force_option
from gpuflame.launch.recover import recover

HELP = "merge what a killed gpuflame run left into one profile"

DESCRIPTION = """\
gpuflame run merges the per-process profiles of a run when the program ends.
If gpuflame run itself was killed (kill -9, the OOM killer, a drained node),
the run's folder keeps one proc-PID.pb.gz per process and no merged profile.
recover does the merge the run would have done, with the same accounting:
every process that left nothing or only its last --interval snapshot is
named, and the run's lost notes are said again.

RUN is the run's folder in the store (gpuflame serve lists it afterwards),
or the -o file of the run (its per-process files are in FILE.processes/).
The program's own processes usually outlive the launcher and write their
profiles at their exit: recover once they have ended (it names those still
running, and leaves their files for a later recover)."""

EPILOG = """\
examples:
  gpuflame recover ~/.local/share/gpuflame/runs/20261129-174102-train.py
  gpuflame recover run.pb.gz                 # a run started as: gpuflame run -o run.pb.gz ...
  gpuflame recover run.pb.gz.processes -o recovered.pb.gz --json

exit code: 0 when a profile was written, 1 when nothing could be merged (said why), 2 on a bad RUN.
then: gpuflame report PROFILE"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_folder", metavar="RUN", help="the run's folder in the store, or the run's -o file")
    parser.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="write the merged profile here (default: where the run would have written it)",
    )
    add_force_option(parser)
    parser.add_argument("--json", action="store_true", help="print the run's JSON summary at the end (on stdout)")


def run(args: argparse.Namespace) -> int:
    output = Path(args.output) if args.output else None
    return recover(Path(args.run_folder), output, force=args.force, as_json=args.json)
