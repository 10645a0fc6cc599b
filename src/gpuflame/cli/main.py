"""The ``gpuflame`` command: one module per subcommand, as memray does.

Each ``cli/<name>.py`` is a :class:`Command`: ``HELP``, ``DESCRIPTION``,
``EPILOG``, ``add_arguments(parser)`` and ``run(args) -> int``. Adding a
command is that module and its name in :data:`COMMANDS`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
from collections.abc import Sequence
from typing import NoReturn, Protocol, cast

from gpuflame.errors import GpuflameError
from gpuflame.gcpause import thaw
from gpuflame.malloc_reuse import release_freed_memory
from gpuflame.printable import printable
from gpuflame.version import __version__

# Order is the order of ``gpuflame --help``.
COMMANDS: tuple[str, ...] = (
    "run",
    "report",
    "flame",
    "view",
    "serve",
    "top",
    "explain",
    "diff",
    "export",
    "convert",
    "simulate",
    "push",
    "webhook",
)
COMMANDS += ("recover",)  # merge what a killed `gpuflame run` left (launch/recover.py)
COMMANDS += ("agent",)  # the node agent (eBPF): src/gpuflame/agent

DESCRIPTION = """\
Which Python functions hold the GPU memory?

gpuflame records memory allocations with the Python stack that made them
(PyTorch on CUDA or any device, JAX), reads GPU-memory profiles (gzip pprof
*.pb.gz, folded stacks, PyTorch CUDA memory snapshots), and answers with a
report, a flame graph, call chains and files for other viewers.

Start with:
  gpuflame run script.py           profile a program (and its child processes)
  gpuflame report PROFILE          what holds the memory, on one screen
  gpuflame flame PROFILE           the flame graph in the terminal
  gpuflame view PROFILE            the interactive flame graph, one offline HTML file
  gpuflame explain PROFILE NAME    why a function allocates (its call chains)
  gpuflame serve                   browse your runs in a local web page
"""


class Command(Protocol):
    """What every command module declares; :func:`build_parser` reads nothing else of it."""

    HELP: str  # one line in ``gpuflame --help``
    DESCRIPTION: str  # the top of ``gpuflame NAME --help``
    EPILOG: str  # examples, at the bottom of ``gpuflame NAME --help``

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


COMMAND_ATTRIBUTES = ("HELP", "DESCRIPTION", "EPILOG", "add_arguments", "run")


class ArgumentParser(argparse.ArgumentParser):
    """argparse that reports a wrong flag in one line instead of a usage dump."""

    def error(self, message: str) -> NoReturn:
        wrong = re.match(r"argument COMMAND: invalid choice: '([^']*)'", message)
        if wrong:  # a mistyped command: name the nearest, as a mistyped flag is named
            import difflib  # here: only a mistake needs it (every command's start-up would pay for it)

            close = difflib.get_close_matches(wrong.group(1), COMMANDS, n=1, cutoff=0.6)
            message = f"no command {wrong.group(1)!r}" + (f" (did you mean {close[0]}?)" if close else "")
        sys.stderr.write(printable(f"{self.prog}: error: {message} (see {self.prog} --help)") + "\n")
        raise SystemExit(2)


def did_you_mean(unknown: Sequence[str], parser: argparse.ArgumentParser) -> str:
    """`` (did you mean --backend?)`` for mistyped flags among *unknown*, or ``""``.

    Python 3.11's argparse only says "unrecognized arguments"; a typo in a
    long flag is the usual cause, so the nearest flag of the command is named.
    """
    flags = [s for action in parser._actions for s in action.option_strings if s.startswith("--")]
    import difflib  # here: only a mistake needs it

    hints = []
    for word in unknown:
        if word.startswith("--"):
            close = difflib.get_close_matches(word.split("=", 1)[0], flags, n=1, cutoff=0.7)
            hints += [f"{word.split('=', 1)[0]} -> {close[0]}"] if close else []
    if not hints:
        return ""
    if len(hints) == 1:
        return f" (did you mean {hints[0].split(' -> ')[1]}?)"
    return f" (did you mean: {', '.join(hints)}?)"


def parse(parser: ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse *argv*; an unknown flag is refused by its command's parser, with the flag it was likely meant to be."""
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] == ["run"] and "run" in _commands(parser):
        words = ["run", *module_words_apart(_commands(parser)["run"], words[1:])]
    args, unknown = parser.parse_known_args(words)
    if unknown:
        command = _commands(parser).get(getattr(args, "command", None) or "", parser)
        command.error(f"unrecognized arguments: {' '.join(unknown)}{did_you_mean(unknown, command)}")
    return args


def module_words_apart(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """``run -m MOD --help``: the words after MOD are the module's, as with ``python -m``, not gpuflame's.

    argparse's REMAINDER starts only at a word that is no flag, so ``--help``
    right after MOD printed gpuflame's help; a ``--`` goes in after MOD here
    and :func:`gpuflame.cli.run.command_line` takes it out again.
    """
    takes_value = {flag for action in parser._actions if action.nargs != 0 for flag in action.option_strings}
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "-m" and i + 1 < len(argv):
            return [*argv[: i + 2], "--", *argv[i + 2 :]]
        if word == "--" or not word.startswith("-"):
            return argv  # the script or command begins: the words after it are its own
        i += 2 if word in takes_value else 1
    return argv


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def command_module(name: str) -> Command:
    """The module of command *name*, checked against :class:`Command` (a missing part is a bug here, not later)."""
    module = importlib.import_module(f"gpuflame.cli.{name.replace('-', '_')}")
    missing = [attr for attr in COMMAND_ATTRIBUTES if not hasattr(module, attr)]
    if missing:
        raise TypeError(f"gpuflame.cli.{name} is not a command: it lacks {', '.join(missing)}")
    return cast(Command, module)


def build_parser(names: Sequence[str] = COMMANDS) -> ArgumentParser:
    """The parser of the commands *names* (all of them for ``--help`` and a mistyped command)."""
    parser = ArgumentParser(
        prog="gpuflame",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"gpuflame {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=ArgumentParser)
    for name in names:
        module = command_module(name)
        cmd = sub.add_parser(
            name,
            help=module.HELP,
            description=module.DESCRIPTION,
            epilog=module.EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(cmd)
        cmd.set_defaults(handler=module.run)
    return parser


def commands_needed(argv: Sequence[str]) -> Sequence[str]:
    """Only the command named first in *argv*, when it names one (none for ``--version``): each
    command module imports what it uses (the viewer, the server, numpy, every reader), and
    ``gpuflame run`` would pay for all of them (a second of CPU time) before the program starts."""
    if list(argv) == ["--version"]:
        return ()
    return argv[:1] if argv[:1] and argv[0] in COMMANDS else COMMANDS


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(commands_needed(argv))
    args = parse(parser, argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    try:
        return int(args.handler(args) or 0)
    except GpuflameError as exc:
        sys.stderr.write(printable(f"gpuflame {args.command}: error: {exc}") + "\n")  # it may quote a file
        return 2
    except MemoryError:  # what the limits let through can still be more than this machine (or its ulimit) holds
        sys.stderr.write(
            f"gpuflame {args.command}: error: out of memory: the input needs more than this machine or its "
            "memory limit gives (lower a GPUFLAME_MAX_* limit to be told which part is too large, or filter "
            "with --focus, --min-size)\n"
        )
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("gpuflame: interrupted\n")
        return 130
    except BrokenPipeError:
        # `gpuflame report x | head` closed the pipe: not an error worth a word.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except Exception as exc:  # a bug in gpuflame: still one line, unless asked
        if os.environ.get("GPUFLAME_DEBUG"):
            raise
        sys.stderr.write(
            printable(
                f"gpuflame {args.command}: internal error: {type(exc).__name__}: {exc} "
                "(set GPUFLAME_DEBUG=1 for a traceback, and please report it)"
            )
            + "\n"
        )
        return 3
    finally:
        thaw()  # the command's profile, frozen while it ran (gcpause.kept_to_the_end)
        release_freed_memory()  # malloc's defaults again (pipeline.load_profile set them aside)
