"""The console every command prints through: rich, as written, at a pipe's width, quiet on a closed pipe."""

from __future__ import annotations

import os
import sys
from typing import Any

from rich.console import Console

# Width used when output is not a terminal and COLUMNS is unset: long
# qualified names and paths fit without folding in logs and files.
PIPE_WIDTH = 132


class _Console(Console):
    """rich's Console, but a reader gone away (``report x | head``) ends the command with 0 (cli/main.py), not 1."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError


def make_console(plain: bool = False) -> Console:
    """A console on stdout; wider than rich's 80 columns when writing to a pipe.

    No markup and no emoji codes: a string printed is printed as written
    (``[/]`` in a frame name once stopped a report with a MarkupError).
    *plain*: uncoloured text at the pipe's width, never rich's notebook
    display (the ``%%gpuflame`` cell's output stream).
    """
    as_written: dict[str, Any] = {"highlight": False, "markup": False, "emoji": False}
    if plain:
        return _Console(file=sys.stdout, force_jupyter=False, color_system=None, width=PIPE_WIDTH, **as_written)
    console = _Console(**as_written)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = _Console(width=PIPE_WIDTH, **as_written)
    return console
