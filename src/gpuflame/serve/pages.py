"""The server's own pages: the index of runs and the one-line error pages.

Commands, file names and meta.json come from users and files, so every such
string goes through :func:`html.escape` (attributes too), URLs are built
with :func:`urllib.parse.quote`, and the pages carry no script at all: the
Content-Security-Policy allows nothing but the page's one inline stylesheet
(by its hash) and form submission to this server.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shlex
import time
from html import escape
from urllib.parse import quote

from gpuflame.serve.catalog import Entry
from gpuflame.units import format_bytes

STYLE = """\
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;background:#fff}
h1{font-size:1.3em;margin:0 0 .2em}h2{font-size:1.1em;margin:1.4em 0 .4em}
.where{color:#666;margin:0 0 1em;word-break:break-all}
table{border-collapse:collapse;width:100%}
th,td{text-align:left;padding:.3em .6em;border-bottom:1px solid #ddd;vertical-align:top}
th{background:#f4f4f4;font-weight:600}td.num{text-align:right;font-variant-numeric:tabular-nums}
td.cmd{font-family:ui-monospace,monospace;word-break:break-all}
.bad{color:#b00020;font-weight:600}.dim{color:#888}
.bar{margin:.8em 0}button{font:inherit;padding:.3em .9em}
a{color:#0645ad}
"""

PAGE_CSP = (
    "default-src 'none'; style-src 'sha256-{style}'; img-src 'none'; form-action 'self'; "
    "base-uri 'none'; frame-ancestors 'none'"
).replace("{style}", base64.b64encode(hashlib.sha256(STYLE.encode("utf-8")).digest()).decode("ascii"))

TIME_FORMAT = "%Y-%m-%d %H:%M:%S"


def link(route: str, ident: str) -> str:
    """``/view/<id>`` with the id percent-encoded (its ``/`` kept), safe in an attribute."""
    return f"/{route}/{quote(ident, safe='/')}"


def page(title: str, body: str) -> str:
    """A whole page around *body* (already escaped markup); *title* is escaped here."""
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="referrer" content="no-referrer">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title><style>{STYLE}</style></head>\n<body>\n{body}\n</body></html>\n"
    )


def message_page(status: int, reason: str, message: str) -> str:
    """An error page: the status, one line saying why, and the way back."""
    body = (
        f'<h1>{status} {escape(reason)}</h1>\n<p>{escape(message)}</p>\n<p><a href="/">back to the list of runs</a></p>'
    )
    return page(f"gpuflame: {status} {reason}", body)


def index_page(root: str, entries: list[Entry]) -> str:
    """The list of runs and profile files, with view, download and diff picking."""
    runs = [e for e in entries if e.kind == "run"]
    files = [e for e in entries if e.kind == "file"]
    parts = [
        "<h1>gpuflame runs</h1>",
        f'<p class="where">{escape(root)}</p>',
        '<form method="get" action="/diff">',
    ]
    if not entries:
        parts.append("<p>No runs or profile files here yet: <code>gpuflame run script.py</code> makes one.</p>")
    if runs:
        parts += [f"<h2>Runs ({len(runs)})</h2>", _runs_table(runs)]
    if files:
        parts += [f"<h2>Profile files ({len(files)})</h2>", _files_table(files)]
    if len([e for e in entries if e.size is not None]) >= 2:
        parts.append(
            '<p class="bar"><button type="submit">Diff the two picked</button> '
            '<span class="dim">the older one is the base</span></p>'
        )
    parts.append("</form>")
    return page("gpuflame runs", "\n".join(parts))


def _runs_table(runs: list[Entry]) -> str:
    head = (
        "<tr><th>pick</th><th>started</th><th>command</th><th>exit</th><th>peak</th>"
        "<th>processes</th><th>profile</th></tr>"
    )
    return "<table>\n" + head + "\n" + "\n".join(_safe_row(e) for e in runs) + "\n</table>"


def _safe_row(entry: Entry) -> str:
    """A run's row; a meta.json no row can show (a value of a type nothing expects) is a row that says so."""
    try:
        return _run_row(entry)
    except (TypeError, ValueError, OverflowError) as exc:
        note = f"meta.json cannot be shown ({type(exc).__name__})"
        return f'<tr><td></td><td>{escape(entry.label)}</td><td class="bad" colspan="5">{escape(note)}</td></tr>'


def _run_row(entry: Entry) -> str:
    meta = entry.meta or {}
    full, short = _command(meta.get("command"))
    cells = [
        _pick(entry),
        f'<td title="{escape(entry.label)}">{escape(_when(entry.time))}</td>',
        f'<td class="cmd" title="{escape(full)}">{escape(short)}</td>'
        if entry.problem is None
        else f'<td class="bad">{escape(entry.problem)}</td>',
        _exit_cell(meta.get("exit_code")),
        f'<td class="num">{escape(_peak(entry))}</td>',
        _processes_cell(meta.get("processes")),
        _links(entry),
    ]
    return "<tr>" + "".join(cells) + "</tr>"


def _files_table(files: list[Entry]) -> str:
    head = "<tr><th>pick</th><th>modified</th><th>file</th><th>size</th><th>profile</th></tr>"
    rows = [
        "<tr>" + _pick(e) + f'<td>{escape(_when(e.time))}</td><td class="cmd">{escape(e.id)}</td>'
        f'<td class="num">{escape(format_bytes(e.size or 0))}</td>' + _links(e) + "</tr>"
        for e in files
    ]
    return "<table>\n" + head + "\n" + "\n".join(rows) + "\n</table>"


def _pick(entry: Entry) -> str:
    if entry.size is None:
        return "<td></td>"
    return (
        f'<td><input type="checkbox" name="pick" value="{escape(entry.id)}" '
        f'aria-label="pick {escape(entry.label)} for a diff"></td>'
    )


def _links(entry: Entry) -> str:
    if entry.size is None:
        return '<td class="dim">no profile written</td>'
    return (
        f'<td><a href="{escape(link("view", entry.id))}">open</a> · '
        f'<a href="{escape(link("file", entry.id))}" download>download</a> '
        f'<span class="dim">({escape(format_bytes(entry.size))})</span></td>'
    )


def _command(words: object) -> tuple[str, str]:
    """The full command, and a short one with the program's folder dropped (python3 job.py)."""
    if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
        return "", "?"
    full = shlex.join(words)
    if not words:
        return full, full
    return full, shlex.join([os.path.basename(words[0]) or words[0], *words[1:]])


def _exit_cell(code: object) -> str:
    if not isinstance(code, int):
        return '<td class="dim">—</td>'
    return f'<td class="num{" bad" if code else ""}">{code}</td>'


def _processes_cell(pids: object) -> str:
    if not isinstance(pids, list):
        return '<td class="dim">—</td>'
    shown = ", ".join(str(p) for p in pids)
    return f'<td class="num" title="pids {escape(shown)}">{len(pids)}</td>'


def _peak(entry: Entry) -> str:
    peak = entry.peak()
    if peak is None:
        return "—"
    name, value = peak
    return format_bytes(value) if name == "peak_space" else f"{format_bytes(value)} ({name.split('_')[0]})"


def _when(stamp: float) -> str:
    try:
        return time.strftime(TIME_FORMAT, time.localtime(stamp)) if stamp else "—"
    except (OverflowError, ValueError, OSError):  # a time this machine's clock cannot print
        return "—"
