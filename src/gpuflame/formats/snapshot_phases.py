"""Phases in a PyTorch memory snapshot: a live torch-cuda recording's phase marks, replayed against its trace.

gpuflame's torch-cuda recorder adds :data:`PHASES_KEY` to each snapshot it
takes: ``[[time_us, phase name], ...]``, each the moment a phase began
(``gpuflame.phase``), on the trace's own clock (``time_us``, epoch
microseconds). The trace is in time order, so replaying it gives each
phase its exact highest total: the live allocations (requested bytes, as
the timeline counts them; the allocator's cached free blocks are not
allocations) after each event inside the phase, or when it began.

Blind spots: a block whose allocation fell out of the ring buffer (or was
made before the history started) has no time, so its phase label is
:data:`~gpuflame.model.phases.NONE`; a phase whose whole stretch fell out
of the ring buffer is not in the table of that snapshot (the recorder keeps
the highest row of every snapshot it took, capture/recorders/torch_cuda/history.py).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpuflame.model.phases import NONE, PhaseStat, check_name

PHASES_KEY = "gpuflame_phases"


class Marks:
    """Phase marks in time order: which phase ran at a moment."""

    def __init__(self, marks: Sequence[tuple[int, str]]) -> None:
        self.times = [t for t, _ in marks]
        self.names = [n for _, n in marks]

    def at(self, time_us: Any) -> str:
        if type(time_us) is not int:
            return NONE
        i = bisect_right(self.times, time_us) - 1
        return self.names[i] if i >= 0 else NONE


def read_marks(snapshot: Mapping[str, Any]) -> Marks | None:
    """The snapshot's phase marks; None when it has none (a saved snapshot, a run without phases)."""
    raw = snapshot.get(PHASES_KEY)
    if not isinstance(raw, list) or not raw:
        return None
    marks = []
    for entry in raw:
        if not (isinstance(entry, (list, tuple)) and len(entry) == 2 and type(entry[0]) is int):
            continue
        try:
            marks.append((entry[0], check_name(entry[1])))
        except ValueError:
            continue
    return Marks(sorted(marks, key=lambda m: m[0])) if marks else None


class _Book:
    __slots__ = ("start", "end", "peak", "peak_i", "peak_t", "end_level", "order")

    def __init__(self, start: int, level: int, index: int, order: int) -> None:
        self.start, self.end, self.order = start, 0, order
        self.peak, self.peak_i, self.peak_t, self.end_level = level, index, start, level


def phase_table(
    trace: Sequence[Mapping[str, Any]],
    marks: Marks,
    device: str,
    before_bytes: int,
    release_on_request: bool,
    name_of: Callable[[Any], str],
    before_name: str,
) -> list[PhaseStat]:
    """Each phase's own highest live total on one device's time-ordered *trace*, and what held most then.

    *before_bytes* is what was live before the trace began (as the replay
    finds it); *name_of(entry)* names an alloc entry's function (its leaf).
    """
    if any(type(e.get("time_us")) is not int for e in trace):
        return []  # a trace without times cannot be cut into phases
    books: dict[str, _Book] = {}
    spans: dict[int, list[Any]] = {}  # alloc index -> [size, entry, free index or None]
    live: dict[Any, int] = {}  # addr -> alloc index
    delta, k, current = 0, 0, None
    times, names = marks.times, marks.names

    def enter(name: str, at: int, index: int) -> None:
        nonlocal current
        if current is not None:
            current.end, current.end_level = at, delta
        book = books.get(name)
        if book is None:
            book = books[name] = _Book(at, delta, index, len(books))
        elif delta > book.peak:
            book.peak, book.peak_i, book.peak_t = delta, index, at
        current = book

    first = trace[0]["time_us"]
    k = bisect_right(times, first)
    enter(names[k - 1] if k else NONE, times[k - 1] if k else first, -1)
    for i, e in enumerate(trace):
        t = e["time_us"]
        while k < len(times) and times[k] <= t:
            enter(names[k], times[k], i - 1)
            k += 1
        action = e["action"]
        if action == "alloc":
            old = live.get(e["addr"])
            if old is not None:
                delta -= spans[old][0]
                spans[old][2] = i
            live[e["addr"]] = i
            spans[i] = [e["size"], e, None]
            delta += e["size"]
        elif action == "free_completed" or (action == "free_requested" and release_on_request):
            old = live.pop(e["addr"], None)
            if old is None:
                delta -= e["size"]
            else:
                delta -= spans[old][0]
                spans[old][2] = i
        else:
            continue
        assert current is not None
        if delta > current.peak:
            current.peak, current.peak_i, current.peak_t = delta, i, t
    last = trace[-1]["time_us"]
    while k < len(times) and times[k] <= last:
        enter(names[k], times[k], len(trace) - 1)
        k += 1
    assert current is not None
    current.end, current.end_level = last, delta
    return [_row(name, b, spans, device, before_bytes, name_of, before_name) for name, b in books.items()]


def _row(
    name: str,
    b: _Book,
    spans: dict[int, list[Any]],
    device: str,
    before: int,
    name_of: Callable[[Any], str],
    before_name: str,
) -> PhaseStat:
    by_function: dict[str, int] = {}
    held = 0
    for start, (size, entry, end) in spans.items():
        if start <= b.peak_i and (end is None or end > b.peak_i) and size:
            fn = name_of(entry)
            by_function[fn] = by_function.get(fn, 0) + size
            held += size
    total = before + b.peak
    if total > held:
        by_function[before_name] = total - held
    top = max(by_function.items(), key=lambda kv: (kv[1], kv[0]), default=("", 0))
    return PhaseStat(
        name,
        device,
        "",
        start=b.start * 1000,
        end=b.end * 1000,
        peak=total,
        peak_time=b.peak_t * 1000,
        inuse_end=before + b.end_level,
        top=top[0],
        top_bytes=top[1],
        order=b.order,
    )
