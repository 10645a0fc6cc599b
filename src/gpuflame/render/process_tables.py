"""``report``'s table per process and its line on how uneven the ranks were (``model/process_table.py``)."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from gpuflame.model.process_table import ProcessRow, Uneven, spread_word
from gpuflame.printable import printable
from gpuflame.render.terminal import NAME_SHOWN, _table, pct, plain
from gpuflame.units import format_bytes


def process_sections(rows: list[ProcessRow], joint: bool, spread: Uneven | None) -> list[Table | Text]:
    """A table per process, in rank order, then how uneven they were; *joint*: their values are the joint peak."""
    return [*(process_table(r, joint) for r in rows), *([plain(uneven_line(spread), "bold")] if spread else [])]


# a moment's column (--at, --between): what each process held then, or allocated in the window
_MOMENT_COLUMN = {"inuse_space": "live at this moment", "alloc_space": "allocated in this window"}


def process_table(row: ProcessRow, joint: bool) -> Table:
    """One process: who (rank, pid, command line), its own peak and when, what it held at the (joint) peak."""
    i = row.info
    parts = [f"pid {i.pid}"] * bool(i.rank) + [f"local rank {i.local_rank}"] * bool(i.rank and i.local_rank)
    parts += [f"world size {i.world_size}"] * bool(i.world_size)
    who = (f"rank {i.rank}" if i.rank else f"pid {i.pid}") + (f" ({', '.join(parts)})" if parts else "")
    title = printable(f"{who}: {i.command(short=True)}" if i.argv else who, NAME_SHOWN)
    column = _MOMENT_COLUMN.get(row.moment) or ("at the joint peak" if joint else "at the peak")
    table = _table(title, "category", column, "%")
    for name, value in row.by_category:
        table.add_row(printable(name), format_bytes(value), pct(100 * value / max(1, row.at_joint_peak)))
    table.add_row(Text("total", style="bold"), format_bytes(row.at_joint_peak), "")
    if i.peak:
        when = f", {row.peak_s:.3f} s into the strip" if row.peak_s is not None else ""
        table.caption = f"its own peak: {format_bytes(i.peak)}{when}"
        # one line, as the title: a worker's narrow table wrapped it as '1.108 \n s into the strip'
        table.min_width = max(table.min_width or 0, len(table.caption))
    return table


def uneven_line(u: Uneven) -> str:
    """How uneven the ranks were, in one line: the largest own peak over the smallest."""
    return (
        f"{u.of.capitalize()} {spread_word(u.ratio)}: {u.largest.name} peaked at {format_bytes(u.largest.info.peak)}, "
        f"{u.smallest.name} at {format_bytes(u.smallest.info.peak)}: the largest peak is {u.ratio:.2f}x the smallest"
    )
