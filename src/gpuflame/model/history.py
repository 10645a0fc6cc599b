"""The event history: every allocation and free, bounded, so any moment can be shown.

A profile's samples say what was live at the peak and at the end; the
timeline says how much was live when. The history says *what* was live at
any moment, and what was allocated within any window: one event per
allocation (``+bytes``) and per free (``-bytes``), each with its time
(epoch ns) and its *site* (a stack and labels such as ``device``).

Bounded: a recorder keeps at most :data:`MAX_EVENTS` events (the one owner
of the bound; about 24 bytes each in memory, so 24 MB at most). When the log
is full its oldest half is *folded*: replayed into the live set per site at
the fold point (:attr:`Track.base`, one entry per site, not per event). Any
moment from the fold point on stays exact; earlier moments say they are not
available. The torch-cuda backend's history is the allocator's own trace
ring buffer, folded the same way at its start.

A profile holds one :class:`Track` per recording window (a process, and a
recorder in it); merged profiles keep every track, each on the common
epoch-ns clock, so a moment is the sum of what each process held then.

In a file the history rides as ONE pprof comment (model/comments.py):
:data:`PREFIX` then base64 of zlib-compressed compact JSON, times stored as
differences from the previous event. The history has its own frame table,
so filters and merges of the samples never break it. A track's columns are
any sequences of ints; the CPU hook's are memoryviews over the bytes it
handed over, written by its C formatter (:func:`use_ints_text`).
"""

from __future__ import annotations

import operator
from array import array
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate, chain, islice

from gpuflame.model import comments as comment_data
from gpuflame.model.parts import Frame
from gpuflame.model.timeline import Point, downsample
from gpuflame.symbols.kinds import FRAME_KINDS

PREFIX = "gpuflame-history-v1:"
MAX_EVENTS = 1_000_000  # events a recorder keeps (the oldest half is folded when full): ~24 MB
DAMAGED_NOTE = "the event history stored in this profile is damaged and was left out"

_INT64_MAX = (1 << 63) - 1

Labels = tuple[tuple[str, str], ...]
Site = tuple[tuple[int, ...], Labels]  # (history frame ids, leaf first; labels)


class EventLog:
    """The history being recorded by one recorder: at most *limit* events, the rest folded.

    Times are made non-decreasing (a later event never gets an earlier time
    than the one logged before it), so moments can be found by bisection.
    With *key_of* (site -> series key, e.g. its device) it also keeps the
    live bytes over time per key (:meth:`lines`), the folded part
    downsampled as timelines are: a strip for recorders that keep none.
    """

    def __init__(self, start_ns: int, limit: int | None = None, key_of: Callable[[int], str] | None = None) -> None:
        self.limit = max(2, MAX_EVENTS if limit is None else limit)
        self.key_of = key_of
        self.past: dict[str, list[Point]] = {}  # per key: (time, live bytes) up to the fold, downsampled
        self.past_total: dict[str, int] = {}
        self.start = start_ns
        self.fold = start_ns
        self.folded = 0
        self.base: dict[int, list[int]] = {}
        self.times = array("q")
        self.sites = array("q")
        self.sizes = array("q")

    def add(self, t: int, site: int, size: int) -> int:
        """One allocation (*size* > 0) or free (*size* < 0) of *site* at *t*; its number (from the first event)."""
        times = self.times
        if times and t < times[-1]:
            t = times[-1]
        number = self.folded + len(times)
        times.append(t)
        self.sites.append(site)
        self.sizes.append(size)
        if len(times) >= self.limit:
            self.fold_oldest(len(times) // 2)
        return number

    def rekey(self, number: int, old: int, new: int, size: int) -> None:
        """The allocation logged as event *number* (of *size* bytes, at site *old*) belongs to site *new*.

        A recorder whose sites say what a block is (its category, decided
        after the block was made) moves the block's allocation, in the log or,
        once folded, in the base; its free is then logged at *new*.
        """
        at = number - self.folded
        if at >= len(self.times):
            return  # not an event of this log
        if at >= 0:
            self.sites[at] = new
            return
        base = self.base
        row = base.setdefault(old, [0, 0])
        row[0] -= size
        row[1] -= 1
        row = base.setdefault(new, [0, 0])
        row[0] += size
        row[1] += 1

    def fold_oldest(self, n: int) -> None:
        """Replay the *n* oldest events into :attr:`base`; the fold point becomes the last one's time."""
        if n <= 0:
            return
        base = self.base
        for site, size in zip(self.sites[:n], self.sizes[:n], strict=True):
            live = base.get(site)
            if live is None:
                live = base[site] = [0, 0]
            live[0] += size
            live[1] += 1 if size > 0 else -1
        self.fold = self.times[n - 1]
        self.folded += n
        if self.key_of is not None:
            self._fold_lines(n, self.key_of)
        del self.times[:n], self.sites[:n], self.sizes[:n]

    def _fold_lines(self, n: int, key_of: Callable[[int], str]) -> None:
        totals, past = self.past_total, self.past
        for t, site, size in zip(self.times[:n], self.sites[:n], self.sizes[:n], strict=True):
            key = key_of(site)
            total = totals[key] = totals.get(key, 0) + size
            past.setdefault(key, []).append((t, total))
        for key, points in past.items():
            past[key] = downsample(points)

    def lines(self) -> dict[str, list[Point]]:
        """Per key, live bytes after each event from its first (the folded part downsampled).

        No point at the log's start: a strip's 0 is its first point, said to be the first allocation (as
        the allocator hook's strip has it); a (start, 0) point put the dispatch recorder's 0 at the
        recording's start, 6 s before the first allocation of a script that imports transformers first.
        """
        if self.key_of is None:
            return {}
        out = {key: list(points) for key, points in self.past.items()}
        totals = dict(self.past_total)
        keys = {self.key_of(site) for site in set(self.sites)}
        if len(keys) == 1:  # one device (the common case): running sums at C speed, not a loop per event
            (key,) = keys
            points = out.setdefault(key, [])
            running = islice(accumulate(self.sizes, initial=totals.get(key, 0)), 1, None)
            points += zip(self.times, running, strict=False)
            return out
        for t, site, size in zip(self.times, self.sites, self.sizes, strict=True):
            key = self.key_of(site)
            total = totals[key] = totals.get(key, 0) + size
            out.setdefault(key, []).append((t, total))
        return out

    def track(self, end: int, labels: Labels = (), sites: Mapping[int, int] | None = None) -> Track:
        """A copy as a :class:`Track`; *sites* renumbers the log's sites to the history's."""
        remap = (lambda s: sites[s]) if sites is not None else (lambda s: s)
        base = _renumbered_base((remap(s), (b, c)) for s, (b, c) in self.base.items() if b or c)
        return Track(
            labels,
            self.start,
            end,
            self.fold,
            self.folded,
            base,
            array("q", self.times),
            array("q", self.sites) if sites is None else array("q", (remap(s) for s in self.sites)),
            array("q", self.sizes),
        )


@dataclass
class Track:
    """One recording window's events, exact from :attr:`fold` on."""

    labels: Labels  # added to every site's labels (a merge adds the pid)
    start: int  # the window, epoch ns (0: unknown, may have held memory before; end 0: open to the end)
    end: int
    fold: int  # moments before this are not available (== start when nothing was folded)
    folded: int  # how many events were folded
    base: dict[int, tuple[int, int]]  # site -> (bytes, count) live at the fold point
    times: Sequence[int]  # non-decreasing epoch ns
    sites: Sequence[int]
    sizes: Sequence[int]  # > 0 allocation, < 0 free

    def covers(self, t: int) -> bool:
        """Whether the window was open at *t* (outside it the process held nothing we know of)."""
        return self.start <= t and (not self.end or t <= self.end)

    def exact_from(self) -> int:
        """The earliest moment this track answers exactly."""
        return self.fold

    def live_at(self, t: int) -> dict[int, list[int]]:
        """Site -> [bytes, count] live at *t* (events at *t* included); *t* >= :attr:`fold`."""
        live = {s: [b, c] for s, (b, c) in self.base.items()}
        n = bisect_right(self.times, t)
        for site, size in zip(self.sites[:n], self.sizes[:n], strict=True):
            row = live.get(site)
            if row is None:
                row = live[site] = [0, 0]
            row[0] += size
            row[1] += 1 if size > 0 else -1
        return live

    def allocated(self, t1: int, t2: int) -> dict[int, list[int]]:
        """Site -> [bytes, count] allocated at times in [*t1*, *t2*]."""
        out: dict[int, list[int]] = {}
        lo, hi = bisect_right(self.times, t1 - 1), bisect_right(self.times, t2)
        for site, size in zip(self.sites[lo:hi], self.sizes[lo:hi], strict=True):
            if size > 0:
                row = out.get(site)
                if row is None:
                    row = out[site] = [0, 0]
                row[0] += size
                row[1] += 1
        return out

    def totals(self) -> Iterable[tuple[int, int]]:
        """(time, live bytes of this track) after each event, from the fold point on."""
        total = sum(b for b, _ in self.base.values())
        for t, size in zip(self.times, self.sizes, strict=True):
            total += size
            yield t, total


@dataclass
class History:
    """Events of one or more recording windows over one frame table and site table."""

    frames: list[Frame] = field(default_factory=list)
    sites: list[Site] = field(default_factory=list)
    tracks: list[Track] = field(default_factory=list)

    def site_frames(self, site: int) -> list[Frame]:
        return [self.frames[i] for i in self.sites[site][0]]

    def events(self) -> int:
        return sum(len(t.times) for t in self.tracks)

    def relabelled(self, extra: Labels) -> History:
        """A copy whose tracks also carry *extra* labels (as merge adds them to samples)."""
        tracks = [_with_labels(t, extra) for t in self.tracks]
        return History(self.frames, self.sites, tracks)

    def to_comment(self) -> str:
        """The single pprof comment line that stores this history.

        Written at ``stop()``, so streamed: the event columns go to the
        compressor as text a chunk at a time (no list of a million ints, no
        whole JSON text), at zlib's fastest level (the columns are small,
        repetitive integers: level 6 took four times longer for a file a
        fifth smaller).
        """
        return comment_data.pack_json_text(PREFIX, self._json_pieces(), level=1)

    def _json_pieces(self) -> Iterator[str | bytes]:
        dumps = comment_data.compact_json
        yield '{"frames":' + dumps([[f.name, f.file, f.line, f.kind, f.start_line] for f in self.frames])
        yield ',"sites":' + dumps([[list(stack), [list(p) for p in labels]] for stack, labels in self.sites])
        yield ',"tracks":['
        for n, t in enumerate(self.tracks):
            yield from _track_pieces(t, first=n == 0)
        yield "]}"

    @classmethod
    def from_comment(cls, comment: str, budget: comment_data.InflateBudget | None = None) -> History:
        """Parse one history comment; ValueError when it is damaged (it is untrusted input, bounded by *budget*)."""
        payload = comment_data.unpack_json(comment, PREFIX, "history", budget)
        return _decode(payload)


def of_track(
    track: Track,
    frames_of: Callable[[int], list[Frame]],
    labels_of: Callable[[int], Labels],
    used: Sequence[int] | None = None,
) -> History:
    """A history of one recorder's *track*, whose sites are the recorder's own (renumbered to those used).

    With *used* (the recorder's sites the track names, in order), the track is numbered already:
    its sites are ranks among *used*, as this renumbering would make them.
    """
    if used is None:
        used = sorted(set(track.sites) | set(track.base))
        index = {s: i for i, s in enumerate(used)}
        track = Track(
            track.labels,
            track.start,
            track.end,
            track.fold,
            track.folded,
            {index[s]: v for s, v in track.base.items()},
            track.times,
            array("q", map(index.__getitem__, track.sites)),
            track.sizes,
        )
    frame_ids: dict[Frame, int] = {}
    sites = [(tuple(frame_ids.setdefault(f, len(frame_ids)) for f in frames_of(s)), labels_of(s)) for s in used]
    return History(list(frame_ids), sites, [track])


def merged(histories: Sequence[History | None], extras: Sequence[Labels] | None = None) -> History | None:
    """One history holding every track of *histories* (each relabelled with its *extras*)."""
    if not any(histories):
        return None
    out = History()
    frame_ids: dict[Frame, int] = {}
    site_ids: dict[Site, int] = {}
    for n, h in enumerate(histories):
        if h is None:
            continue
        fmap = [frame_ids.setdefault(f, len(frame_ids)) for f in h.frames]
        smap = []
        for stack, labels in h.sites:
            key = (tuple(fmap[i] for i in stack), labels)
            smap.append(site_ids.setdefault(key, len(site_ids)))
        for t in h.tracks:
            t = _with_labels(t, extras[n] if extras else ())
            out.tracks.append(
                Track(
                    t.labels,
                    t.start,
                    t.end,
                    t.fold,
                    t.folded,
                    _renumbered_base((smap[s], v) for s, v in t.base.items()),
                    t.times,
                    array("q", map(smap.__getitem__, t.sites)),
                    t.sizes,
                )
            )
    out.frames = list(frame_ids)
    out.sites = list(site_ids)
    return out


def split_comments(
    comments: Sequence[str], budget: comment_data.InflateBudget | None = None
) -> tuple[History | None, list[str]]:
    """The history stored in *comments* (several are merged) and the other comments, in order."""
    budget = budget or comment_data.InflateBudget()
    found, rest = comment_data.split_comments(comments, PREFIX, lambda c: History.from_comment(c, budget), DAMAGED_NOTE)
    return (found[0] if len(found) == 1 else merged(found)), rest


def _renumbered_base(rows: Iterable[tuple[int, tuple[int, int]]]) -> dict[int, tuple[int, int]]:
    """A folded base under new site numbers, rows that meet on one number summed.

    Two sites of a history can be one (a stack and labels): a block classed at its allocation and one
    classed later at the same line, under two recorder keys of one category. A dict comprehension kept
    the last row: a merge (every gpuflame run) lost the other's bytes from every moment after the fold
    (a Linear(64, 64)'s 16,640 B of weight and bias, of two layers built on one line).
    """
    out: dict[int, tuple[int, int]] = {}
    for site, (b, c) in rows:
        had = out.get(site, (0, 0))
        out[site] = (had[0] + b, had[1] + c)
    return out


def _with_labels(t: Track, extra: Labels) -> Track:
    have = {k for k, _ in t.labels}
    labels = tuple(sorted(t.labels + tuple((k, v) for k, v in extra if k not in have)))
    return Track(labels, t.start, t.end, t.fold, t.folded, t.base, t.times, t.sites, t.sizes)


_CHUNK = 1 << 13  # values per piece of a streamed column (its text and strs: ~0.5 MB)
_FAST_CHUNK = 1 << 16  # values per piece made by a C formatter (its text: ~1 MB)
_FAST_FORMATS = {("q", 8), ("l", 8), ("I", 4)}  # what the C formatter takes: int64, uint32
_ints_text: Callable[..., bytes] | None = None


def use_ints_text(formatter: Callable[..., bytes]) -> None:
    """Write columns with *formatter* (``formatter(int64 or uint32 buffer, previous=None) -> b"1,2"``,
    each value minus the one before it when *previous* is given): the CPU hook's C loop
    (capture/torch_allocator.py) where one is loaded; the same text as the Python way, ~10x faster."""
    global _ints_text
    _ints_text = formatter


def _track_pieces(t: Track, first: bool) -> Iterator[str | bytes]:
    """One track as JSON text: its head, then its columns (times as differences) a chunk at a time."""
    head = {
        "labels": [list(p) for p in t.labels],
        "start": t.start,
        "end": t.end,
        "fold": t.fold,
        "folded": t.folded,
        "base": [[s, b, c] for s, (b, c) in sorted(t.base.items())],
    }
    yield ("" if first else ",") + comment_data.compact_json(head)[:-1]
    for key, column, previous in (("t", t.times, t.fold), ("s", t.sites, None), ("b", t.sizes, None)):
        yield f',"{key}":['
        yield from _column_text(column, previous)
        yield "]"
    yield "}"


def _column_text(column: Sequence[int], previous: int | None) -> Iterator[str | bytes]:
    """*column*'s values (minus the one before each, the first minus *previous*, when given) as JSON
    text without brackets, a chunk at a time: through the C formatter when one is loaded and the
    column is a buffer of int64 or uint32, else as the repr of lists of ints (JSON already)."""
    fast = _ints_text
    view = memoryview(column) if fast is not None and isinstance(column, (array, memoryview)) else None
    if fast is not None and view is not None and (view.format, view.itemsize) in _FAST_FORMATS:
        for at in range(0, len(view), _FAST_CHUNK):
            piece = view[at : at + _FAST_CHUNK]
            yield (b"," if at else b"") + fast(piece, previous)
            previous = piece[-1] if previous is not None else None
        return
    values: Iterator[int] = iter(column)
    if previous is not None:
        values = map(operator.sub, column, chain((previous,), column))
    sep = ""
    while chunk := list(islice(values, _CHUNK)):
        yield sep + repr(chunk)[1:-1].replace(" ", "")  # JSON (1.6x faster than joining strs), compact as C's
        sep = ","


def _decode(payload: object) -> History:
    """Validate strictly: every value is checked, nothing is trusted."""
    if not isinstance(payload, dict):
        raise ValueError("damaged history: not an object")
    frames = [_frame(f) for f in _list(payload.get("frames"))]
    sites: list[Site] = []
    for entry in _list(payload.get("sites")):
        if not (isinstance(entry, list) and len(entry) == 2):
            raise ValueError("damaged history: a site is not [stack, labels]")
        stack = tuple(_int(i, len(frames) - 1) for i in _list(entry[0]))
        sites.append((stack, _labels(entry[1])))
    tracks = [_track(t, len(sites)) for t in _list(payload.get("tracks"))]
    return History(frames, sites, tracks)


def _track(entry: object, n_sites: int) -> Track:
    if not isinstance(entry, dict):
        raise ValueError("damaged history: a track is not an object")
    start, end, fold, folded = (_int(entry.get(k)) for k in ("start", "end", "fold", "folded"))
    base: dict[int, tuple[int, int]] = {}
    for row in _list(entry.get("base")):
        if not (isinstance(row, list) and len(row) == 3):
            raise ValueError("damaged history: a base entry is not [site, bytes, count]")
        base[_int(row[0], n_sites - 1)] = (_int(row[1], low=-_INT64_MAX), _int(row[2], low=-_INT64_MAX))
    deltas, sites, sizes = (_column(entry.get(k)) for k in ("t", "s", "b"))
    if not len(deltas) == len(sites) == len(sizes):
        raise ValueError("damaged history: t, s and b differ in length")
    if deltas and min(deltas) < 0 or sites and not 0 <= min(sites) <= max(sites) < n_sites:
        raise ValueError("damaged history: a time goes back or a site is out of range")
    try:
        times = array("q", accumulate(deltas, initial=fold))[1:]
    except OverflowError:
        raise ValueError("damaged history: a time is out of range") from None
    return Track(_labels(entry.get("labels")), start, end, fold, folded, base, times, sites, sizes)


def _column(value: object) -> array:
    """A list of int64 as an array, checked in C (floats, strings and overflows are refused)."""
    try:
        return array("q", _list(value))
    except (TypeError, OverflowError):
        raise ValueError("damaged history: a column holds something other than 64-bit integers") from None


def _list(value: object) -> list:
    if not isinstance(value, list):
        raise ValueError("damaged history: a list is missing")
    return value


def _int(value: object, high: int = _INT64_MAX, low: int = 0) -> int:
    if type(value) is not int or not low <= value <= high:
        raise ValueError("damaged history: a number is out of range")
    return value


def _labels(value: object) -> Labels:
    pairs = []
    for pair in _list(value):
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) for x in pair)):
            raise ValueError("damaged history: a label is not a [key, value] pair of strings")
        pairs.append((pair[0], pair[1]))
    return tuple(sorted(pairs))


def _frame(value: object) -> Frame:
    if not (
        isinstance(value, list)
        and len(value) == 5
        and isinstance(value[0], str)
        and isinstance(value[1], str)
        and value[3] in FRAME_KINDS
    ):
        raise ValueError("damaged history: a frame is not [name, file, line, kind, start_line]")
    return Frame(value[0], value[1], _int(value[2]), value[3], _int(value[4]))
