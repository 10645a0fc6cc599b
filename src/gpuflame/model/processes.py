"""Who each process of a profile was: pid, rank, command line, its own peak and when.

A merged profile's ``peak_*`` values are each process's share of the run's
joint peak (:mod:`gpuflame.model.merge`); what each process reached on its
own, and when, is gone from them. So each process says it in its own
profile, as one :class:`ProcessInfo`, and the merge keeps every process's
(one per pid). ``report`` turns them into a table per process, sorted by
rank, and says how uneven the ranks were.

pprof has no field for it: the list rides as ONE comment, :data:`PREFIX` +
compact JSON, which gpuflame's reader takes back out (as the peak's). A
damaged one is dropped with a note; a file must always load.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

from gpuflame.boundary import ranks
from gpuflame.model import comments as comment_data

PREFIX = "gpuflame-processes-v1:"
DAMAGED_NOTE = "the description of this profile's processes is damaged and was left out"
MAX_ARGS = 64  # words of a command line kept; the rest is said as "…"
MAX_ARG_CHARS = 512  # characters of one word kept
_MAX_PROCESSES = 65_536  # a damaged or hostile file names no more than this
_DIGITS = 20  # a pid or rank longer than this is not one


@dataclass(frozen=True)
class ProcessInfo:
    """One process of a profile, as it described itself; ``""``/0 where not known."""

    pid: str
    rank: str = ""
    local_rank: str = ""
    world_size: str = ""
    argv: tuple[str, ...] = ()  # the command line, bounded (:func:`bounded_argv`)
    peak: int = 0  # its own highest total in bytes (over all its devices), at its own moment
    peak_ns: int = 0  # when that was, epoch ns (0: no timeline said)
    devices: tuple[str, ...] = field(default=())

    def sort_key(self) -> tuple[int, int, int, str]:
        """Ranked processes first by rank, then the others by pid (a pid label that is no number last)."""
        number = int(self.pid) if self.pid.isascii() and self.pid.isdigit() else -1
        return (0 if self.rank else 1, int(self.rank or 0), number if number >= 0 else 1 << 63, self.pid)

    def command(self, short: bool = False) -> str:
        """The command line as one string (words with spaces quoted); *short*: the program by its name only
        (``python3 -u train.py``, not the interpreter's whole path)."""
        words = [os.path.basename(self.argv[0]) or self.argv[0], *self.argv[1:]] if short and self.argv else self.argv
        return " ".join(_quoted(w) for w in words)

    def to_json(self) -> dict[str, object]:
        defaults = ProcessInfo("")
        raw = asdict(self)
        return {
            k: (list(v) if isinstance(v, tuple) else v)
            for k, v in raw.items()
            if k == "pid" or v != getattr(defaults, k)
        }


def bounded_argv(argv: Sequence[str]) -> tuple[str, ...]:
    """*argv* cut to :data:`MAX_ARGS` words of :data:`MAX_ARG_CHARS` characters: a profile is no place for a prompt."""
    words = [w if len(w) <= MAX_ARG_CHARS else w[:MAX_ARG_CHARS] + "…" for w in argv[:MAX_ARGS]]
    if len(argv) > MAX_ARGS:
        words.append(f"… ({len(argv) - MAX_ARGS} more)")
    return tuple(words)


def merged(lists: Iterable[Sequence[ProcessInfo]]) -> list[ProcessInfo]:
    """One entry per pid (the first seen), sorted by rank then pid."""
    out: dict[str, ProcessInfo] = {}
    for infos in lists:
        for info in infos:
            out.setdefault(info.pid, info)
    return sorted(out.values(), key=ProcessInfo.sort_key)


def to_comment(infos: Sequence[ProcessInfo]) -> str:
    return PREFIX + json.dumps([i.to_json() for i in infos], separators=(",", ":"), ensure_ascii=False)


def from_comment(comment: str) -> list[ProcessInfo]:
    """Parse one processes comment; ValueError when it is damaged (it is untrusted input)."""
    try:
        raw = json.loads(comment[len(PREFIX) :])
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"damaged process list: {exc}") from None
    if not isinstance(raw, list) or len(raw) > _MAX_PROCESSES:
        raise ValueError("damaged process list: not a list")
    return [_entry(e) for e in raw]


def _entry(entry: object) -> ProcessInfo:
    if not isinstance(entry, Mapping) or not _is_number(entry.get("pid")):
        raise ValueError("damaged process list: an entry has no pid")
    texts = {k: v for k in ranks.LABELS if _is_number(v := entry.get(k))}
    counts = {k: v for k in ("peak", "peak_ns") if type(v := entry.get(k)) is int and 0 <= v < 1 << 63}
    lists = {
        k: bounded_argv(v) if k == "argv" else tuple(v[:MAX_ARGS])
        for k in ("argv", "devices")
        if isinstance(v := entry.get(k), list) and all(isinstance(w, str) for w in v)
    }
    return ProcessInfo(pid=str(entry["pid"]), **texts, **counts, **lists)  # type: ignore[arg-type]


def _is_number(value: object) -> bool:
    return isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= _DIGITS


def split_comments(comments: Sequence[str]) -> tuple[list[ProcessInfo], list[str]]:
    """The processes stored in *comments* (several lists are joined), and the other comments in order."""
    found, rest = comment_data.split_comments(comments, PREFIX, from_comment, DAMAGED_NOTE)
    return merged(found), rest


def _quoted(word: str) -> str:
    return word if word and not any(c.isspace() or c in "'\"\\" for c in word) else json.dumps(word, ensure_ascii=False)
