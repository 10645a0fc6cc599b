"""The end-of-run table: the tests with the highest peak, body and fixtures apart."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpuflame.units import format_bytes

NAMES_SHOWN = 3  # tests or fixtures named in a line under the table; the rest are "..." or counted

HEADER = ("peak", "in use at end", "fixtures peak", "top function at the peak", "test")


def summary_lines(results: dict[str, dict[str, Any]], top: int, folder: Path | None) -> tuple[str, list[str]]:
    """The separator's title and the lines under it, from every test's ``report.gpuflame``."""
    ranked = sorted(results.items(), key=lambda item: (bool(item[1]["error"]), -item[1]["body"]["peak"], item[0]))
    shown = ranked[:top]
    title = f"gpuflame: {len(shown)} of {len(results)} profiled tests, highest peak first"
    rows = [HEADER] + [_row(nodeid, r) for nodeid, r in shown]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER) - 1)]
    lines = []
    for row in rows:
        cells = [row[0].rjust(widths[0]), row[1].rjust(widths[1]), row[2].rjust(widths[2]), row[3].ljust(widths[3])]
        lines.append("  ".join(cells + [row[4]]).rstrip())
    shared = sorted({name for _, r in shown for name in r.get("shared", ())})
    if shared:
        lines.append(
            "* includes fixtures set up once for all the tests that use them, counted at the first: "
            + first_names(shared)
        )
    held = _held_elsewhere(ranked[top:])
    if held:
        lines.append(held)
    lost = [nodeid for nodeid, r in results.items() if r["error"] or r.get("fixtures_error")]
    if lost:
        lines.append(
            f"? not recorded for {len(lost)} test{'s' if len(lost) > 1 else ''} (see warnings): " + first_names(lost)
        )
    lines.append("peaks are the test body's; fixtures are recorded apart (set-up only)")
    if folder is not None:
        lines.append(f"profiles: {folder}/  (gpuflame view {folder}/TEST.pb.gz)")
    return title, lines


def first_names(names: Sequence[str]) -> str:
    """The first :data:`NAMES_SHOWN` of *names*, then "..." where there are more."""
    return ", ".join(names[:NAMES_SHOWN]) + (" ..." if len(names) > NAMES_SHOWN else "")


def _held_elsewhere(unshown: list[tuple[str, dict[str, Any]]]) -> str | None:
    """The passing tests below the table that still held memory when they returned: a leak with a small
    peak ranks low, and the table alone would never show it. A failing test's locals are held by its
    traceback when its recording stops: that is no leak."""
    held = sorted(
        ((nodeid, r["body"]["inuse"]) for nodeid, r in unshown if r["body"]["inuse"] > 0 and r["passed"]),
        key=lambda item: (-item[1], item[0]),
    )
    if not held:
        return None
    named = ", ".join(f"{nodeid} ({format_bytes(inuse)})" for nodeid, inuse in held[:NAMES_SHOWN])
    more = f" and {len(held) - NAMES_SHOWN} more" if len(held) > NAMES_SHOWN else ""
    return f"still held when the test returned, by tests not in the table: {named}{more}"


def _row(nodeid: str, result: dict[str, Any]) -> tuple[str, str, str, str, str]:
    """A phase whose recording failed is '?', not the 0 B it holds: nothing was measured."""
    body, fixtures = result["body"], result["fixtures"]
    if result.get("fixtures_error"):
        shown_fixtures = "?"
    elif fixtures:
        shown_fixtures = format_bytes(fixtures["peak"]) + ("*" if result.get("shared") else "")
    else:
        shown_fixtures = "-"
    if result["error"]:
        return ("?", "?", shown_fixtures, "?", nodeid)
    return (format_bytes(body["peak"]), format_bytes(body["inuse"]), shown_fixtures, body["top"] or "-", nodeid)
