"""Any moment, any window: the profile of what was live at a time, or allocated within a window.

Times are as on the memory-over-time strip: seconds from its start (the
first point of the profile's timeline; without one, the start of its
first recording window), or ``peak``: the moment of the strip's highest
total. Both verbs read the event history (model/history.py) and return a
new profile: ``at`` with ``inuse_space``/``inuse_objects`` (what was live
then), ``between`` with ``alloc_space``/``alloc_objects`` (what was
allocated within the window, whether freed since or not).

Merged profiles (several processes): every process's track stays on the
common epoch clock, so a moment is the sum of what each process held at
that instant; a process whose window does not cover it adds nothing.
"""

from __future__ import annotations

import math
from datetime import datetime

from gpuflame.errors import GpuflameError
from gpuflame.model.history import MAX_EVENTS, History, Track
from gpuflame.model.profile import Profile
from gpuflame.model.sample_types import ALLOC_OBJECTS, ALLOC_SPACE, INUSE_OBJECTS, INUSE_SPACE
from gpuflame.symbols.names import ALLOCATOR_ROUNDING, CACHED_FREE

PEAK = "peak"
START = "start"  # ("start", s): seconds from the recording's start (``+2.5s``)
CLOCK = "clock"  # ("clock", s): seconds after midnight, local time, on the recording's day (``14:03:07.5``)
When = float | str | tuple[str, float]  # seconds on the strip, PEAK, or (START | CLOCK, seconds)

NO_HISTORY = (
    "this profile has no event history, so it shows only its peak and its end (files written "
    "before gpuflame kept one, PyTorch snapshots without a timed trace, JAX profiles, other tools' profiles)"
)

# --at on a snapshot gave less than the report's peak or end at the same instant, unexplained (new-user trial).
ALLOCATIONS_ONLY = (
    "a moment counts the live allocations only: the allocator's reserve beyond them (<cached free blocks>, "
    "<allocator rounding>) is known at the peak and the end, which count it"
)
# the longest time --at and --between take, in seconds (about 31,700 years; its nanoseconds fit a float)
LONGEST_S = 1e12
TIME_FORMS = (
    "1.5 or 250ms (on the strip, 0 = its first allocation), +2s (from the recording's start), "
    "14:03:07.5 (wall clock), or peak"
)


def parse_when(text: str) -> When:
    """A time in any of :data:`TIME_FORMS`; ValueError otherwise."""
    word = text.strip().lower()
    if word == PEAK:
        return PEAK
    if ":" in word:
        return CLOCK, _clock_seconds(word, text)
    since_start = word.startswith("+")
    seconds = _seconds(word[1:] if since_start else word, text)
    return (START, seconds) if since_start else seconds


def _seconds(word: str, text: str) -> float:
    scale = 1.0
    if word.endswith("ms"):
        word, scale = word[:-2], 1e-3
    elif word.endswith("s"):
        word = word[:-1]
    try:
        seconds = float(word) * scale
    except ValueError:
        raise ValueError(f"expected a time: {TIME_FORMS}; got {text!r}") from None
    if not seconds >= 0 or seconds == float("inf"):
        raise ValueError(f"expected a time of 0 or more: {TIME_FORMS}; got {text!r}")
    if seconds > LONGEST_S:  # 1e308 s is finite, but not in nanoseconds
        raise ValueError(f"{text!r} is longer than any recording (at most {LONGEST_S:g} s)")
    return seconds


def _clock_seconds(word: str, text: str) -> float:
    parts = word.split(":")
    try:
        hours, minutes = int(parts[0]), int(parts[1])
        seconds = float(parts[2]) if len(parts) == 3 else 0.0
    except (ValueError, IndexError):
        raise ValueError(f"expected a wall-clock time as HH:MM:SS(.fff); got {text!r}") from None
    if len(parts) > 3 or not (0 <= hours < 24 and 0 <= minutes < 60 and 0 <= seconds < 61):
        raise ValueError(f"expected a wall-clock time as HH:MM:SS(.fff); got {text!r}")
    return hours * 3600 + minutes * 60 + seconds


def at(profile: Profile, when: When) -> Profile:
    """What was live at *when*: a profile of ``inuse_*`` per stack."""
    history = _history(profile)
    t = moment_ns(profile, when)
    _check_range(profile, history, t, f"--at {_show(profile, when, t)}")
    out = _empty(profile, [INUSE_SPACE, INUSE_OBJECTS])
    for track in history.tracks:
        at_t = _within_rounding(track, t)
        if not track.covers(at_t):
            continue
        if at_t < track.fold:
            raise GpuflameError(_folded(profile, track, f"--at {_show(profile, when, t)}"))
        _add(out, history, track, track.live_at(at_t))
    out.moment = f"what was live at {_clock(profile, t)} ({_wall(t)}; {where_zero_is(profile)}; from the event history)"
    out.comments.append(out.moment)
    if any(frame.name in (CACHED_FREE, ALLOCATOR_ROUNDING) for frame in profile.frames):
        out.comments.append(ALLOCATIONS_ONLY)
    return out


def between(profile: Profile, first: When, last: When) -> Profile:
    """What was allocated at times within [*first*, *last*]: a profile of ``alloc_*`` per stack."""
    history = _history(profile)
    t1, t2 = moment_ns(profile, first), moment_ns(profile, last)
    what = f"--between {_show(profile, first, t1)} {_show(profile, last, t2)}"
    if t1 > t2:
        raise GpuflameError(f"{what}: the window ends before it starts (give the earlier time first)")
    _check_range(profile, history, t1, what)
    _check_range(profile, history, t2, what)
    out = _empty(profile, [ALLOC_SPACE, ALLOC_OBJECTS])
    for track in history.tracks:
        if track.end and track.end < t1 or t2 < track.start:
            continue
        if track.folded and t1 <= track.fold:
            raise GpuflameError(_folded(profile, track, what))
        _add(out, history, track, track.allocated(t1, t2))
    out.moment = (
        f"what was allocated from {_clock(profile, t1)} to {_clock(profile, t2)} "
        f"({_wall(t1)} to {_wall(t2)}; {where_zero_is(profile)}; from the event history)"
    )
    out.comments.append(out.moment)
    return out


# Seconds on the strip are written to the microsecond (report's phase table, --json): a moment read
# back can land up to half of one past the instant it names, such as a recording's very end.
ROUNDING_NS = 1_000


def _within_rounding(track: Track, t: int) -> int:
    """*t*, or the track's end when *t* is past it by no more than the rounding of seconds written out."""
    return track.end if track.end and 0 < t - track.end <= ROUNDING_NS else t


def origin(profile: Profile) -> int:
    """Epoch ns of the strip's 0: the timeline's first point, else the first window's start."""
    start = profile.timeline.start() if profile.timeline is not None else None
    if start is not None:
        return start
    history = profile.history
    if history is not None and history.tracks:
        return min(t.start for t in history.tracks)
    return profile.time_nanos


def moment_ns(profile: Profile, when: When) -> int:
    """Epoch ns of *when*: seconds on the strip, from the recording's start, a wall-clock time, or PEAK."""
    if when == PEAK:
        return peak_ns(profile)
    if isinstance(when, tuple):
        clock, seconds = when
        if clock == START:
            return recording_start(profile) + round(seconds * 1e9)
        return _on_the_recordings_day(origin(profile), seconds)
    return origin(profile) + round(float(when) * 1e9)


def recording_start(profile: Profile) -> int:
    """Epoch ns the recording started (its first window), else the strip's 0."""
    return profile.time_nanos or origin(profile)


def _on_the_recordings_day(near: int, seconds_of_day: float) -> int:
    """Epoch ns of a local wall-clock time on the day of *near* (the day after, if the run crossed midnight)."""
    day = datetime.fromtimestamp(near / 1e9).replace(hour=0, minute=0, second=0, microsecond=0)
    t = round((day.timestamp() + seconds_of_day) * 1e9)
    return t + 86_400 * 10**9 if t < near - 12 * 3600 * 10**9 else t


def where_zero_is(profile: Profile) -> str:
    """The strip's clock in words: where its 0 is on the wall clock and after the recording's start."""
    zero = origin(profile)
    after = (zero - profile.time_nanos) / 1e9 if profile.time_nanos else 0.0
    since = f", {after:.3f} s after the recording started" if after > 0.0005 else ""
    return f"0 s is the first allocation at {_wall(zero)}{since}"


def _wall(t: int) -> str:
    return datetime.fromtimestamp(t / 1e9).strftime("%H:%M:%S.%f")[:-3]


def peak_ns(profile: Profile) -> int:
    """When the strip is highest (its first highest point), else when the history's summed total is."""
    if profile.timeline is not None:
        line = profile.timeline.total()
        if line:
            return max(line, key=lambda p: p[1])[0]
    history = _history(profile)
    events = sorted((t, size) for track in history.tracks for t, size in _deltas(track))
    total = sum(b for track in history.tracks for b, _ in track.base.values())
    best = (origin(profile), total)
    for t, size in events:
        total += size
        if total > best[1]:
            best = (t, total)
    return best[0]


def end_ns(profile: Profile, history: History) -> int:
    """The last moment known: the latest window end, event or timeline point."""
    ends = [max(t.end, t.times[-1] if len(t.times) else 0) for t in history.tracks]
    if profile.timeline is not None:
        ends += [points[-1][0] for points in profile.timeline.series.values() if points]
    return max(ends, default=0)


def _deltas(track: Track) -> list[tuple[int, int]]:
    return list(zip(track.times, track.sizes, strict=True))


def _history(profile: Profile) -> History:
    if profile.history is None or not profile.history.tracks:
        raise GpuflameError(NO_HISTORY)
    return profile.history


def _check_range(profile: Profile, history: History, t: int, what: str) -> None:
    start, end = origin(profile), end_ns(profile, history)
    if t < min(start, recording_start(profile)):
        raise GpuflameError(
            f"{what}: before the recording started ({_wall(recording_start(profile))}; {where_zero_is(profile)})"
        )
    if t > end + ROUNDING_NS:
        raise GpuflameError(
            f"{what}: past the end of the recording (it spans 0 to {(end - start) / 1e9:.3f} s on the strip)"
        )


def _folded(profile: Profile, track: Track, what: str) -> str:
    who = " of " + ", ".join(f"{k} {v}" for k, v in track.labels) if track.labels else ""
    since = _clock(profile, track.fold)
    if track.start == 0:  # torch-cuda: the allocator's own ring buffer is the bound
        why = f"the history{who} begins at {since}, where the allocator's trace (its latest events) begins"
    else:
        why = (
            f"the history{who} before {since} was folded to keep its memory bounded (gpuflame keeps the "
            f"latest {MAX_EVENTS // 2:,} to {MAX_EVENTS:,} events of a recording)"
        )
    earliest = math.ceil((track.fold - origin(profile) + 1) / 1e6) / 1e3
    return f"{what}: not available: {why}; the earliest exact moment is {earliest:.3f} s"


def _empty(profile: Profile, types: list) -> Profile:
    out = profile.empty_like()
    out.sample_types = list(types)
    out.default_type = types[0].type
    out.peaks = []
    return out


def _add(out: Profile, history: History, track: Track, rows: dict[int, list[int]]) -> None:
    """*track*'s rows as samples; a process that held nothing then is one empty sample with its labels, so that
    it still has its row in a table per process (0 B) and a label filter still finds it."""
    added = False
    for site, (nbytes, count) in sorted(rows.items()):
        if nbytes or count:
            labels = dict(history.sites[site][1]) | dict(track.labels)
            out.add(history.site_frames(site), (nbytes, count), labels)
            added = True
    if not added and any(key == "pid" for key, _ in track.labels):
        out.add([], (0, 0), dict(track.labels))


def _clock(profile: Profile, t: int) -> str:
    return f"{(t - origin(profile)) / 1e9:.3f} s"


def _show(profile: Profile, when: When, t: int) -> str:
    if when == PEAK:
        return f"peak ({_clock(profile, t)})"
    if isinstance(when, tuple):
        return f"{'+' + format(when[1], 'g') + 's' if when[0] == START else _wall(t)} ({_clock(profile, t)})"
    return f"{float(when):g}"
