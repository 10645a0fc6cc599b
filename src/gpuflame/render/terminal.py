"""Report, top, explain and diff as rich tables: human units, file:line dim.

Everything stays readable without colour (pipes, ``NO_COLOR``, CI logs):
colour only repeats what the words and the column headers already say.

Every name a profile brings (frames, files, comments, labels, sample types)
is untrusted: it reaches rich only as :func:`plain` text (escaped by
:func:`gpuflame.printable.printable`, never read as markup), and a table
cell given as a string is made :func:`plain` by :class:`SafeTable`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rich import box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from gpuflame.analysis.categories import CategoryTotal
from gpuflame.analysis.chains import Chain, Explanation, Step
from gpuflame.analysis.compare import NEW, VANISHED, Change, Comparison, renamed_note
from gpuflame.analysis.hotspots import Entry, Report, Root
from gpuflame.analysis.phases import PhaseRow
from gpuflame.model.phases import NONE as PHASE_NONE
from gpuflame.model.profile import Frame
from gpuflame.model.sample_types import DESCRIPTIONS
from gpuflame.printable import printable
from gpuflame.units import format_bytes, format_count

# file:line longer than this keeps its end (the file name and line) after an ellipsis.
WHERE_WIDTH = 48
# A file:line cell never gets narrower than this (it shows "…" and the path's end).
PATH_MIN_WIDTH = 16
# A name (a frame's, a label's) longer than this is shown cut, with "…": a table folds a long word over
# as many lines as it needs, in time that grows with the square of its length (a 4 MB name: 110 s)
NAME_SHOWN = 1000
# ... and a note (a profile's comment) longer than this: rich wraps a 4 MB note in 7 s, an 8 MB one in 20 s
NOTE_SHOWN = 10_000
# Trunks longer than this show their first frame, a count, and the last frames.
TRUNK_SHOWN = 4

READING_HINT = (
    "Read it like a flame graph: start from the leaves; skip wide bars with zero self (they only "
    "call others); wide bars with high self are the targets; read a stack bottom-up to learn why "
    "(gpuflame explain FILE FUNCTION)."
)

SEPARATORS = "/\\"
PACKAGES = "-packages"
PACKAGE_DIRS = ("site", "dist")


def plain(text: str, style: str = "") -> Text:
    """Untrusted *text* (a name from a profile, a file name) as rich Text: controls escaped, no markup, cut short."""
    return Text(printable(text, NAME_SHOWN), style=style)


class SafeTable(Table):
    """A table whose string cells are :func:`plain`: a cell cannot carry markup or a control character."""

    def add_row(self, *renderables: Any, **kwargs: Any) -> None:
        super().add_row(*(plain(c) if isinstance(c, str) else c for c in renderables), **kwargs)


def short_path(path: str) -> str:
    """A path as a reader locates it: installed packages from their package name on.

    What follows the last ``/site-packages/`` or ``/dist-packages/`` (either
    separator). A scan from the end with ``rfind``: linear in the path (the
    regex it replaces backtracked, 67 s on a 40 KB path).
    """
    end = len(path)
    while (at := path.rfind(PACKAGES, 0, end)) >= 0:
        after = at + len(PACKAGES)
        start = at - len(PACKAGE_DIRS[0])
        if (
            start > 0
            and path[start:at] in PACKAGE_DIRS
            and path[start - 1] in SEPARATORS
            and after < len(path)
            and path[after] in SEPARATORS
        ):
            return path[after + 1 :]
        end = at + len(PACKAGES) - 1  # the next occurrence starts before this one
    return path


def where(frame: Frame, line: int | None = None) -> Text:
    """``file:line`` (the frame's, or *line*), dim: it is there to find the code, not to be read first."""
    if not frame.file:
        return Text("")
    shown = frame.line if line is None else line
    text = printable(short_path(frame.file)) + (f":{shown}" if shown else "")
    if len(text) > WHERE_WIDTH:
        text = "..." + text[-(WHERE_WIDTH - 3) :]
    return Text(text, style="dim")


class PathCell:
    """``file:line`` in a table cell: when the column is narrow, the path loses its start, never its end.

    Rich folds a long word mid-way over several lines (``vllm/v1/wor`` /
    ``ker/gpu_mo``...); a reader needs the file name and line, so the cell
    asks for little width and fills what it gets with ``…`` and the tail.
    """

    def __init__(self, text: str, tail: str = "") -> None:
        self.text = text
        self.tail = tail

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        full = cell_len(self.text + self.tail)
        return Measurement(min(full, PATH_MIN_WIDTH), full)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        room = options.max_width
        text = self.text + self.tail
        if cell_len(text) > room:
            text = "…" + text[len(text) - max(room - 1, 0) :] if room > 1 else text[-room:]
        yield Text(text, style="dim", no_wrap=True, overflow="crop")

    def __bool__(self) -> bool:
        return bool(self.text)


def where_cell(frame: Frame, line: int | None = None, tail: str = "") -> PathCell:
    """:func:`where` for a table cell (see :class:`PathCell`)."""
    return PathCell(where(frame, line).plain, tail if frame.file else "")


def amount(value: int, unit: str, signed: bool = False) -> str:
    if unit == "bytes":
        return format_bytes(value, signed=signed)
    text = format_count(value, unit)
    return f"+{text}" if signed and value > 0 else text


def pct(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "new"
    return f"{value:+.1f}%" if signed else f"{value:.1f}%"


def type_title(type_name: str, unit: str, total: int, description: str = "") -> Text:
    """``peak_space  5.72 MiB  what it is``: *description* (the profile's own word on its peak) first."""
    text = Text.assemble((printable(type_name), "bold"), f"  {amount(total, unit)}")
    description = description or DESCRIPTIONS.get(type_name, "")
    if description:
        text.append(f"  {printable(description)}", style="dim")
    return text


def print_comments(console: Console, comments: Iterable[str], shown: str = "") -> None:
    """The profile's own caveats, where they cannot be missed; *shown*: the one the title says already.

    A moment's words (--at, --between: 'what was live at 1.289 s (...)', three lines on a terminal) are
    both a comment and the title's description: printed twice, one under the other.
    """
    for comment in comments:
        if shown and comment == shown:
            continue
        console.print(Text.assemble(("note: ", "bold yellow"), printable(comment, NOTE_SHOWN)))


NUMERIC_COLUMNS = {
    "#",
    "self",
    "total",
    "%",
    "self %",
    "total %",
    "self/total",
    "delta",
    "base",
    "new",
    "change",
    "start",
    "peak",
    "in use at end",
}


def _table(title: str, *columns: str) -> Table:
    """A borderless table: numbers right-aligned and never wrapped, names left."""
    table = SafeTable(
        title=title,
        title_justify="left",
        title_style="bold",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        show_edge=False,
        padding=(0, 1, 0, 0),
        min_width=len(title),  # a title is one line: a narrow table (a notebook report) wrapped it at 40 columns
    )
    for name in columns:
        if name in NUMERIC_COLUMNS:
            table.add_column(name, justify="right", no_wrap=True)
        else:
            # on a narrow terminal a name wraps at its spaces ("Foo >" / "bar"), never
            # mid-word; a file:line cell keeps its end (PathCell)
            table.add_column(name, overflow="fold")
    return table


# -- report ------------------------------------------------------------------


def render_report(
    console: Console,
    report: Report,
    source: str,
    peak: str = "",
    processes: Iterable[Table | Text] = (),
    moment: bool = False,
) -> None:
    """The report; *peak* says what a peak total is (``Profile.peak_description``); *processes*: a table
    per process and how uneven they were (``render/process_tables.py``), after the phases; *moment*: the
    profile is one moment or window (--at, --between), and the phases' table is still the whole recording's."""
    console.print(Text.assemble(("gpuflame report ", "bold"), printable(source)))
    console.print(type_title(report.type, report.unit, report.total, peak))
    print_comments(console, report.comments, shown=peak)
    if not report.total:
        console.print(plain(f"No {report.type} in this profile (after filters): nothing to report."))
        return
    sections = (
        _totals_table(report),
        *([categories_table(report.categories, report.unit)] if report.categories else []),
        *([phases_table(report.phases, whole=moment)] if report.phases else []),
        *processes,
        _entries_table("What allocates the most: widest leaf bars (by self)", report.leaves, report.unit, "self"),
        _roots_table(report.roots, report.unit),
        _targets_table(report.targets, report.unit),
        _wrappers_table(report.wrappers, report.unit),
    )
    for table in sections:
        console.print()
        console.print(table)
    console.print()
    console.print(Text(READING_HINT, style="dim"))


def _totals_table(report: Report) -> Table:
    table = _table("Totals by sample type", "type", "total", "")
    for t in report.totals:
        mark = "<- shown below" if t.type == report.type else ""
        table.add_row(t.type, amount(t.total, t.unit), Text(mark, style="dim"))
    return table


def categories_table(rows: list[CategoryTotal], unit: str, by: str = "category") -> Table:
    """What kind of memory (or which phase made it): bytes per category, and the function that allocated most."""
    title = "By category: what kind of memory" if by == "category" else "By phase: the phase that allocated it"
    table = _table(title, by, "total", "%", "mostly from")
    for c in rows:
        table.add_row(c.category, amount(c.total, unit), pct(c.percent), c.top_function)
    return table


def phases_table(rows: list[PhaseRow], whole: bool = False) -> Table:
    """Peak per phase, in order: each phase's own highest live total, in use at its end, who held most then.

    *whole*: shown under a moment (--at 0.1 listed a phase that began at 0.303 s): its title says so."""
    several = len({(r.stat.pid, r.stat.device) for r in rows}) > 1
    ranked = several and any(r.rank for r in rows)  # torchrun and the like: which rank each row is
    who = ("rank",) * ranked + (("pid", "device") if several else ())
    table = _table(
        "By phase: each phase's own peak (bytes)" + (", over the whole recording" if whole else ""),
        "phase",
        *who,
        "start",
        "peak",
        "in use at end",
        "top function at the phase's peak",
    )
    for r in rows:
        s = r.stat
        top = f"{s.top} ({format_bytes(s.top_bytes)})" if s.top else ""
        cells = (r.rank,) * ranked + ((s.pid, s.device) if several else ())
        peak = f"≥ {format_bytes(s.peak)}" if s.samples else format_bytes(s.peak)  # JAX: sampled, a lower bound
        # <none> gathers every unmarked stretch: one start would say little (and 0.000s in the last row misleads)
        start = "unmarked" if s.phase == PHASE_NONE else f"{r.start_s:.3f}s"
        table.add_row(s.phase, *cells, start, peak, format_bytes(s.inuse_end), top)
    if any(r.stat.samples for r in rows):
        table.caption = "≥: the largest of a few samples of live buffers (JAX): the phase's true peak may be higher"
    return table


def _entries_table(title: str, entries: list[Entry], unit: str, by: str) -> Table:
    table = _table(title, "#", by, "%", "function", "file:line")
    for i, e in enumerate(entries, 1):
        table.add_row(str(i), amount(getattr(e, by), unit), pct(e.percent), e.frame.name, where_cell(e.frame))
    if not entries:
        table.add_row("", "", "", Text("(none)", style="dim"), "")
    return table


def _roots_table(roots: list[Root], unit: str) -> Table:
    table = _table(
        "What is responsible: widest bars at the bottom, followed up to where they split",
        "total",
        "%",
        "function",
        "file:line",
    )
    for n, root in enumerate(roots):
        if n:
            table.add_row("", "", "", "")
        for e, label in _trunk_rows(root):
            table.add_row(
                amount(e.total, unit) if e else "",
                pct(e.percent) if e else "",
                label,
                where_cell(e.frame) if e else "",
            )
        for b in root.branches:
            table.add_row(amount(b.total, unit), pct(b.percent), f"    +- {b.frame.name}", where_cell(b.frame))
        if root.branches and root.rest:
            table.add_row(amount(root.rest, unit), "", Text("    +- (self and smaller branches)", style="dim"), "")
    return table


def _trunk_rows(root: Root) -> list[tuple[Entry | None, str | Text]]:
    """The trunk root first; a long trunk shows its ends and says how many frames it skips."""
    trunk = root.trunk
    rows: list[tuple[Entry | None, str | Text]] = []
    shown = trunk if len(trunk) <= TRUNK_SHOWN else [trunk[0], None, *trunk[-2:]]
    for i, e in enumerate(shown):
        if e is None:
            skipped = len(trunk) - 3
            rows.append((None, Text(f"  ... {skipped} frames of the same width ...", style="dim")))
            continue
        prefix = "" if i == 0 else "  ^ "
        rows.append((e, prefix + printable(e.frame.name, NAME_SHOWN)))
    if root.branches:
        last_entry, label = rows[-1]
        rows[-1] = (last_entry, Text.assemble(printable(str(label)), ("   <- splits here", "bold")))
    return rows


def _targets_table(entries: list[Entry], unit: str) -> Table:
    table = _table(
        "Optimisation targets: wide bars with high self",
        "#",
        "self",
        "%",
        "self/total",
        "function",
        "file:line",
    )
    for i, e in enumerate(entries, 1):
        ratio = f"{100 * e.self / e.total:.0f}%" if e.total else ""
        table.add_row(str(i), amount(e.self, unit), pct(e.percent), ratio, e.frame.name, where_cell(e.frame))
    if not entries:
        table.add_row("", "", "", "", Text("(no wide bar allocates most of its own width)", style="dim"), "")
    return table


def _wrappers_table(entries: list[Entry], unit: str) -> Table:
    table = _table(
        "Skippable: wide bars with ~zero self (they only call others)",
        "#",
        "total",
        "%",
        "self",
        "function",
        "file:line",
    )
    for i, e in enumerate(entries, 1):
        table.add_row(
            str(i), amount(e.total, unit), pct(e.percent), amount(e.self, unit), e.frame.name, where_cell(e.frame)
        )
    if not entries:
        table.add_row("", "", "", "", Text("(none)", style="dim"), "")
    return table


# -- top ---------------------------------------------------------------------


def render_top(
    console: Console, entries: list[Entry], by: str, type_name: str, unit: str, total: int, peak: str = ""
) -> None:
    console.print(type_title(type_name, unit, total, peak))
    console.print()
    table = _table(f"Top functions by {by}", "#", "self", "self %", "total", "total %", "function", "file:line")
    for i, e in enumerate(entries, 1):
        table.add_row(
            str(i),
            amount(e.self, unit),
            pct(100 * e.self / total if total else 0.0),
            amount(e.total, unit),
            pct(100 * e.total / total if total else 0.0),
            e.frame.name,
            where_cell(e.frame),
        )
    console.print(table)


# -- explain -----------------------------------------------------------------


def render_explanation(console: Console, ex: Explanation, type_name: str, unit: str) -> None:
    names = ", ".join(sorted({f.name for f in ex.functions}))
    header = Text.assemble(
        ("explain ", "bold"), printable(repr(ex.query), NAME_SHOWN), " matches ", (printable(names, NAME_SHOWN), "bold")
    )
    if len(ex.functions) == 1 and ex.functions[0].file:
        header.append("  ").append_text(where(ex.functions[0]))
    console.print(header)
    chains = len(ex.chains) + ex.more_chains
    console.print(
        f"total {amount(ex.total, unit)} ({pct(ex.percent)} of {type_name}), "
        f"self {amount(ex.self, unit)}, through {chains} distinct call chain{'s' if chains != 1 else ''}"
        + (
            f" (and {amount(ex.nested_self, unit)} self in matching functions they call, within their totals)"
            if ex.nested_self
            else ""
        )
    )
    for n, chain in enumerate(ex.chains, 1):
        console.print()
        console.print(_chain_table(n, chains, chain, unit))
    if ex.more_chains:
        console.print()
        console.print(
            Text(f"... and {ex.more_chains} narrower chains holding {amount(ex.more_total, unit)}", style="dim")
        )
    console.print(Text("Each chain reads bottom-up: the entry point first, the matched function last.", style="dim"))


def _chain_table(n: int, count: int, chain: Chain, unit: str) -> Table:
    title = f"Chain {n} of {count}: {amount(chain.total, unit)} ({pct(chain.percent)})"
    table = _table(title, "total", "self", "frame", "file:line")
    last = len(chain.steps) - 1
    for i, step in enumerate(chain.steps):
        name = ("" if i == 0 else "-> ") + step.frame.name
        label: str | Text = plain(name, style="bold") if i == last else name
        table.add_row(amount(step.total, unit), amount(step.self, unit), label, _step_where(step))
    for callee in chain.callees:
        table.add_row(
            amount(callee.total, unit),
            amount(callee.self, unit),
            f"     calls {callee.frame.name}",
            _step_where(callee),
        )
    if chain.callees and chain.other_callees:
        table.add_row(amount(chain.other_callees, unit), "", Text("     calls (others)", style="dim"), "")
    return table


def _step_where(step: Step) -> PathCell:
    """The line a step ran on this chain (the call it made, or its allocation); ``+N`` more lines."""
    more = len(step.lines) - 1
    return where_cell(step.frame, step.line, f" +{more} line{'s' if more > 1 else ''}" if more > 0 else "")


# -- diff --------------------------------------------------------------------


def render_comparison(console: Console, cmp: Comparison, base: str, new: str) -> None:
    # from nothing: 'new'; nothing to nothing (two moments before either's first allocation): +0.0%, not 'new'
    change = 100.0 * cmp.delta / cmp.base_total if cmp.base_total else (0.0 if not cmp.delta else None)
    console.print(Text.assemble(("gpuflame diff ", "bold"), printable(f"{base} -> {new}")))
    console.print(
        Text.assemble(
            (printable(cmp.type), "bold"),
            f"  base {amount(cmp.base_total, cmp.unit)} -> new {amount(cmp.new_total, cmp.unit)}"
            f"  ({amount(cmp.delta, cmp.unit, signed=True)}, {pct(change, signed=True)}), by {cmp.by}",
        )
    )
    for old, renamed_to in cmp.aligned:
        console.print(plain(renamed_note(old, renamed_to) + " (--no-align: compare them as two files)", "dim"))
    console.print(_changes_table("Grew", cmp.grew, cmp.unit))
    console.print(_changes_table("Shrank", cmp.shrank, cmp.unit))
    if cmp.changed > len(cmp.grew) + len(cmp.shrank):
        console.print(Text(f"{cmp.changed} functions changed in all; showing the largest changes.", style="dim"))


def _changes_table(title: str, changes: list[Change], unit: str) -> Table:
    table = _table(title, "delta", "base", "new", "change", "function", "file:line")
    for c in changes:
        name = plain(c.frame.name)
        if c.status in (NEW, VANISHED):
            name.append(f"  [{c.status}]", style="bold")
        style = "red" if c.delta > 0 else "green"
        table.add_row(
            Text(amount(c.delta, unit, signed=True), style=style),
            amount(c.base, unit),
            amount(c.new, unit),
            pct(c.percent, signed=True),
            name,
            where_cell(c.frame),
        )
    if not changes:
        table.add_row("", "", "", "", Text("(none)", style="dim"), "")
    return table
