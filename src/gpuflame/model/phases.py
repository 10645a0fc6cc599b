"""Phases of a program (``gpuflame.phase("load_model")``): the ``phase`` label and the per-phase table.

A phase is a stretch of a run the program (or gpuflame, for frameworks it
knows) named: ``load_model``, ``train``, ``generate``. Two things come of it:

- every sample of a recording that saw a phase carries a label ``phase``:
  the phase that was running when its memory was *allocated* (time before
  the first mark is :data:`NONE`), so the label's values add up to the
  totals like any label and ``--label phase=train`` keeps one;
- a table, :class:`PhaseStat` per (phase, device, process): the phase's own
  highest total (the live bytes at its highest moment *within* the phase,
  whoever allocated them), when that was, the top function then, and what
  was in use when the phase (last) ended. A phase entered several times
  (``train`` between ``eval``\\ s) has one row: its highest moment over all
  its stretches, its first start, its last end.

The table rides as ONE pprof comment, :data:`PREFIX` + compact JSON, read
back like the timeline's and the peak's (model/comments.py).

Merging (model/merge.py): rows stay per process and device, never summed.
Two processes' highest moments in one phase need not be one moment, so
their sum would be a number that never happened; ``report`` shows each
process's row (with its pid when there are several).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields

from gpuflame.model import comments as comment_data

LABEL = "phase"
NONE = "<none>"  # time before the first phase mark
MORE = "<more phases>"  # every name past the first MAX_PHASES of a process: the books stay small
MAX_PHASES = 256  # distinct names per process (a name per step would grow each recorder's books per free)
MAX_NAME = 64  # characters: a phase name is a short word, not a sentence
PREFIX = "gpuflame-phases-v1:"
DAMAGED_NOTE = "the per-phase table stored in this profile is damaged and was left out"
_MAX_ROWS = 65536


def check_name(name: object) -> str:
    """*name* when it is a usable phase name; ValueError (one plain sentence) when not."""
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME or name != name.strip():
        raise ValueError(
            f"a phase name is a non-empty string of at most {MAX_NAME} characters without surrounding "
            f'spaces, e.g. gpuflame.phase("load_model"); got {name!r}'[:300]
        )
    if any(not ch.isprintable() for ch in name):
        raise ValueError(f"a phase name must be printable text; got {name!r}"[:300])
    return name


@dataclass(frozen=True)
class PhaseStat:
    """One phase of one process on one device; times in epoch ns, bytes as the samples count them."""

    phase: str
    device: str = ""
    pid: str = ""
    start: int = 0  # first entered (the recording's start for NONE)
    end: int = 0  # last left (or the end of the recording)
    peak: int = 0  # the highest live total within the phase
    peak_time: int = 0
    inuse_end: int = 0  # live when the phase (last) ended
    top: str = ""  # the function holding the most at the phase's peak (its leaf frame's name)
    top_bytes: int = 0
    order: int = 0  # phases in the order they were first entered
    samples: int = 0  # 0: exact (every allocation seen); n: the largest of n samples (JAX), a lower bound

    def to_json(self) -> dict[str, object]:
        defaults = PhaseStat("")
        return {k: v for k, v in asdict(self).items() if k == "phase" or v != getattr(defaults, k)}


def to_comment(rows: Sequence[PhaseStat]) -> str:
    return PREFIX + json.dumps([r.to_json() for r in rows], separators=(",", ":"), ensure_ascii=False)


def from_comment(comment: str) -> list[PhaseStat]:
    """Parse one phase comment; ValueError when it is damaged (it is untrusted input)."""
    try:
        raw = json.loads(comment[len(PREFIX) :])
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"damaged phase table: {exc}") from None
    if not isinstance(raw, list) or len(raw) > _MAX_ROWS:
        raise ValueError("damaged phase table: not a list of rows")
    kinds = {f.name: type(getattr(PhaseStat(""), f.name)) for f in fields(PhaseStat)}
    rows = []
    for entry in raw:
        if not isinstance(entry, dict) or not isinstance(entry.get("phase"), str):
            raise ValueError("damaged phase table: a row has no phase")
        values = {
            k: v for k, v in entry.items() if k in kinds and type(v) is kinds[k] and (type(v) is not int or v >= 0)
        }
        rows.append(PhaseStat(**values))
    return rows


def split_comments(comments: Sequence[str]) -> tuple[list[PhaseStat], list[str]]:
    """The phase table stored in *comments* (several are joined), and the other comments in order."""
    tables, rest = comment_data.split_comments(comments, PREFIX, from_comment, DAMAGED_NOTE)
    return merge_rows(*tables), rest


def merge_rows(*tables: Sequence[PhaseStat]) -> list[PhaseStat]:
    """Rows of several profiles: kept per (phase, device, pid), in phase order; a repeated row once."""
    out: dict[tuple[str, str, str], PhaseStat] = {}
    for rows in tables:
        for r in rows:
            out.setdefault((r.phase, r.device, r.pid), r)
    return ordered(out.values())


def ordered(rows: Sequence[PhaseStat] | object) -> list[PhaseStat]:
    """Rows by when their phase began (then its order of first entry, then process)."""
    return sorted(rows, key=lambda r: (r.start, r.order, r.pid, r.device))  # type: ignore[arg-type]
