"""``%%gpuflame``: run a cell under the profiler and show its flame graph inline.

The cell runs in the kernel itself (its variables, its imported torch), through
the public API (``gpuflame.start``/``stop``), so a cell's profile is what
``gpuflame run`` would record. The cell behaves as it does without the magic:
its output, its exception (raised again after the flame graph is shown, so the
notebook still stops there) and its last expression's value (``Out[n]``). A
failure inside gpuflame is one line on stderr; the cell still runs.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import sys
import tempfile
from pathlib import Path
from types import FrameType
from typing import Any

import IPython
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import display

from gpuflame import hosted
from gpuflame.boundary.backends import AUTO, BACKENDS, frameworks, spoken
from gpuflame.hosted import already_profiling, package_dirs
from gpuflame.model import Profile
from gpuflame.notebook.last_cell import last, remember

# The kernel's own frames: a cell's stacks are cut at the last of them, so the cell is the root.
HOST_DIRS = package_dirs(IPython)
TYPES = ("peak", "inuse", "alloc", "peak_space", "inuse_space", "alloc_space")


def say(message: str) -> None:
    """One line on stderr, for what gpuflame could not do; never an exception."""
    print(f"gpuflame: {message}", file=sys.stderr, flush=True)


@magics_class
class GpuflameMagics(Magics):
    """The cell magic and the report of its last profile."""

    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        self._folder: tempfile.TemporaryDirectory[str] | None = None  # removed with the kernel

    @property
    def _kernel(self) -> InteractiveShell:
        """The shell the magics were registered with: IPython gives every Magics it loads one."""
        assert self.shell is not None
        return self.shell

    @magic_arguments()
    @argument("--type", choices=TYPES, help="sample type shown first and named in the summary (default: peak)")
    @argument("--backend", choices=BACKENDS, default="auto", help="what records (default: auto, as gpuflame run)")
    @argument("-o", "--output", metavar="FILE", help="also save the profile: .html for the viewer page, else pprof")
    @argument("--report", action="store_true", help="also print the report (as gpuflame report)")
    @cell_magic
    def gpuflame(self, line: str, cell: str) -> Any:
        """Run the cell under gpuflame; show the flame graph inline and a one-line summary.

        The profile is then ``_gpuflame`` (and ``gpuflame.last()``); ``%gpuflame_report``
        prints its report.
        """
        __tracebackhide__ = True  # noqa: F841 - IPython leaves this frame out of the cell's traceback
        args = parse_argstring(self.gpuflame, line)
        _check_output(args.output)
        code, value_code = self._compile(cell)
        session = self._start(args.backend)
        try:
            namespace = self._kernel.user_ns
            exec(code, namespace)  # noqa: S102 - the user's own cell, as IPython runs it
            value = eval(value_code, namespace) if value_code is not None else None  # noqa: S307
        finally:
            if session is not None:
                self._show(session, args)
        return None if cell.rstrip().endswith(";") else value

    @magic_arguments()
    @argument("--type", choices=TYPES, help="sample type (default: peak)")
    @argument("-n", "--limit", type=int, default=10, help="entries per section (default 10)")
    @line_magic
    def gpuflame_report(self, line: str) -> None:
        """The report (as ``gpuflame report``) of the last ``%%gpuflame`` cell."""
        args = parse_argstring(self.gpuflame_report, line)
        profile = last()
        if profile is None:
            say("no profile yet: run a cell with %%gpuflame first")
            return
        _print_report(profile, args.type, max(1, args.limit))

    # -- running ----------------------------------------------------------------

    def _compile(self, cell: str) -> tuple[Any, Any]:
        """The cell as IPython compiles it, its last expression split off to be returned (as %%time does)."""
        shell = self._kernel
        source = shell.transform_cell(cell)
        tree = shell.transform_ast(shell.compile.ast_parse(source))
        filename = shell.compile.cache(source, self._cell_number(), raw_code=cell)
        value = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            # IPython's hint says source text; its compiler, like compile(), takes the AST too
            value = shell.compile(ast.Expression(tree.body.pop().value), filename, "eval")  # type: ignore[arg-type]
        return shell.compile(tree, filename, "exec"), value

    def _cell_number(self) -> int:
        """The running cell's ``In[n]``, read from the cell's own frame: while a cell runs, IPython's
        ``execution_count`` already names the next one."""
        frame: FrameType | None = sys._getframe(1)
        while frame is not None:
            label = self._kernel.compile.format_code_name(frame.f_code.co_filename)
            if label and label[1].startswith("In[") and label[1][3:-1].isdigit():
                return int(label[1][3:-1])
            frame = frame.f_back
        return self._kernel.execution_count

    def _start(self, backend: str) -> Any:
        if already_profiling():
            say("this process is already being profiled (gpuflame.start); the cell runs without %%gpuflame")
            return None
        try:
            self._folder = self._folder or tempfile.TemporaryDirectory(prefix="gpuflame-notebook-")
            return hosted.start(Path(self._folder.name) / "cell.pb.gz", backend, "a %%gpuflame cell")
        except Exception as exc:
            say(f"could not start profiling ({exc}); the cell runs without it")
            return None

    def _show(self, session: Any, args: Any) -> None:
        """Stop, then show the flame graph and the summary; a failure here is one line."""
        try:
            profile = hosted.stop(session, HOST_DIRS)
            if profile is not None:
                profile = name_cells(profile, self._kernel.compile)
            backends = session.backends
            if profile is None or not any(profile.totals().values()):
                say(_nothing_recorded(args.backend, backends))
                return
            self._kernel.user_ns["_gpuflame"] = profile
            remember(profile)
            _display(profile, args, backends)
        except Exception as exc:
            say(f"could not show the profile ({type(exc).__name__}: {exc})")


def name_cells(profile: Profile, compiler: Any) -> Profile:
    """Frames of notebook cells named as IPython's tracebacks name them (``In[3]``), not by the kernel's
    temporary file (``/tmp/ipykernel_812/2837462.py``), which says nothing to the reader."""
    frames = []
    for frame in profile.frames:
        label = compiler.format_code_name(frame.file) if frame.file else None
        frames.append(frame._replace(file=label[1]) if label else frame)
    return dataclasses.replace(profile, frames=frames) if frames != profile.frames else profile


def _nothing_recorded(backend: str, backends: list[str]) -> str:
    if not backends:
        return (
            f"nothing was recorded: no backend started (--backend {backend} starts when the cell, "
            f"or the kernel before it, imports {spoken(frameworks(AUTO))})"
        )
    return f"nothing was recorded: the {', '.join(backends)} backend saw no allocation in this cell"


def _check_output(output: str | None) -> None:
    """Refuse a ``-o`` that cannot take the profile before the cell runs, as ``gpuflame run -o`` does."""
    if output:
        from gpuflame.errors import GpuflameError
        from gpuflame.files import check_output

        try:
            check_output(output, make_folders=True, force_hint="remove it, or give another name")
        except GpuflameError as exc:
            raise UsageError(f"%%gpuflame -o: {exc}; the cell did not run") from None


def _display(profile: Profile, args: Any, backends: list[str]) -> None:
    from gpuflame.analysis.selection import Selection
    from gpuflame.analysis.summary import summarize
    from gpuflame.notebook.inline import inline_html, summary_line
    from gpuflame.pipeline import select

    opened = select(profile, Selection(sample_type=args.type), "%%gpuflame cell")  # as the CLI shows --type
    profile, index = opened.profile, opened.type_index
    line = summary_line(summarize(profile, profile.sample_types[index].type), backends)
    if args.output:
        try:
            _save(profile, args.output, index, line)
            line += f" (saved to {args.output})"
        except Exception as exc:  # the graph is still shown: the file is what was lost
            say(f"could not save the profile to {args.output} ({exc})")
    title = os.path.basename(args.output) if args.output else "%%gpuflame cell"
    display({"text/plain": line, "text/html": inline_html(profile, title, index, line)}, raw=True)
    if args.report:
        _print_report(profile, args.type, 10)


def _save(profile: Profile, output: str, index: int, line: str) -> None:
    from gpuflame.files import atomic_write
    from gpuflame.formats import save
    from gpuflame.render.html import render_html

    if output.lower().endswith((".html", ".htm")):
        atomic_write(output, render_html(profile, os.path.basename(output), index))
    else:
        save(profile, output)


def _print_report(profile: Profile, type_name: str | None, limit: int) -> None:
    """The report as plain text on stdout: the kernel shows it as the cell's output stream."""
    from gpuflame.analysis.hotspots import build_report
    from gpuflame.analysis.selection import Selection
    from gpuflame.pipeline import select
    from gpuflame.render.console import make_console
    from gpuflame.render.terminal import render_report

    opened = select(profile, Selection(sample_type=type_name), "last %%gpuflame cell")  # as report --type TYPE
    console = make_console(plain=True)
    render_report(console, build_report(opened.profile, opened.view.tree(), limit), opened.source)
