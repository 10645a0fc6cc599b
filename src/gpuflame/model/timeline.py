"""Memory over time: a profile's optional timeline, and how it rides in pprof.

A flame graph says *what* holds the memory at one moment (the peak, or the
end); a timeline says *when* that moment was. A timeline is one series of
``(time_ns, bytes)`` points per label set (``device=cuda:0``), the live
allocated bytes after each allocator event.

pprof has no field for a time series, so a timeline is stored as ONE
``comment`` line: :data:`PREFIX` followed by base64 of zlib-compressed
compact JSON. Other pprof tools show it as an opaque comment; gpuflame's
reader takes it back out of the comments (:func:`split_comments`), so users
never see base64 in ``report``. A damaged timeline comment is dropped and
replaced by a plain note: a file must always load.

Series are downsampled to at most :data:`MAX_POINTS` points by keeping, of
each bucket of consecutive points, its highest, its lowest and its last
point (and the series' first and last point): the peak is never lost, the
end state stays exact, a spike of microseconds still rises *and falls*, and
between buckets the line holds the value it really held. Files written
before (the same ``v1`` payload) kept only each bucket's highest point.

A series covers the time from its first point to its last (the end of its
recording: the process's exit, or the window's end); outside it, its
process holds nothing that the timeline knows of. :meth:`Timeline.total`
sums series on that rule, and the viewer's strip draws the same sum.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter

from gpuflame.model import comments as comment_data

PREFIX = "gpuflame-timeline-v1:"
MAX_POINTS = 3000  # 999 buckets of up to three points: about one per pixel of a wide strip
DAMAGED_NOTE = "the memory timeline stored in this profile is damaged and was left out"

# A comment is untrusted input: its inflated size is bounded by gpuflame.limits, its series here.
_MAX_SERIES = 4096
_INT64_MAX = (1 << 63) - 1

Labels = tuple[tuple[str, str], ...]
Point = tuple[int, int]


@dataclass
class Timeline:
    """Live bytes over time, one series per label set; times in epoch nanoseconds.

    Treat a timeline as immutable once built: profiles derived from one
    another (filters, ``compact``) share it, since filtering frames does not
    change how much memory the process held.
    """

    series: dict[Labels, list[Point]] = field(default_factory=dict)

    def add_series(self, labels: Labels, points: Iterable[Point], max_points: int = MAX_POINTS) -> None:
        """Set the series of *labels*, downsampled (see :func:`downsample`)."""
        self.series[tuple(labels)] = downsample(list(points), max_points)

    def add_columns(
        self, labels: Labels, times: Sequence[int], values: Sequence[int], max_points: int = MAX_POINTS
    ) -> None:
        """Set the series of *labels* from its two columns: only the points kept become pairs (a trace has millions)."""
        self.series[tuple(labels)] = [(times[i], values[i]) for i in kept(values, max_points)]

    def peak(self, labels: Labels) -> Point | None:
        """The first highest point of one series, or None when it is empty."""
        points = self.series.get(labels)
        if not points:
            return None
        return max(points, key=lambda p: p[1])  # max keeps the first of equal values

    def start(self) -> int | None:
        """Epoch ns of the first point of any series (the strip's 0); None when every series is empty."""
        firsts = [points[0][0] for points in self.series.values() if points]
        return min(firsts) if firsts else None

    def total(self, match: Labels = ()) -> list[Point]:
        """The series whose labels include every pair of *match*, summed into one step line.

        Each series counts from its first point to its last, and 0 outside
        (a process that started late adds nothing before it started; one
        that ended adds nothing after). A series that ends before the others
        drops out with a second point at its end time; at the very end of
        the line nothing is dropped. Points of one series at equal times keep
        their order; where several series have points at one time, that time
        is one point, the total after all of them (a sampler such as JAX's
        writes every device's total at the sample's time: one device updated
        and the next not yet is no moment that happened); a point equal to
        the one before is left out.
        """
        chosen = [points for labels, points in self.series.items() if points and set(match) <= set(labels)]
        if not chosen:
            return []
        end = max(points[-1][0] for points in chosen)
        events = [(t, 0, k, b) for k, points in enumerate(chosen) for t, b in points]
        events += [(points[-1][0], 1, k, 0) for k, points in enumerate(chosen) if points[-1][0] < end]
        events.sort(key=lambda e: (e[0], e[1]))  # stable: an end comes after the updates of its moment
        shared = _shared_times(events)
        current = [0] * len(chosen)
        total = 0
        out: list[tuple[int, int]] = []
        for i, (t, _, k, b) in enumerate(events):
            total += b - current[k]
            current[k] = b
            if t in shared and i + 1 < len(events) and events[i + 1][0] == t:
                continue  # within a moment several series share: only its last total happened
            if not out or out[-1] != (t, total):
                out.append((t, total))
        return out

    def relabelled(self, extra: Labels) -> Timeline:
        """A copy whose series keys also carry *extra* labels (as merge adds them to samples)."""
        if not extra:
            return Timeline(dict(self.series))
        out = Timeline()
        for labels, points in self.series.items():
            have = {k for k, _ in labels}
            key = tuple(sorted(labels + tuple((k, v) for k, v in extra if k not in have)))
            out.series[key] = points
        return out

    def to_comment(self) -> str:
        """The single pprof comment line that stores this timeline."""
        payload = {"series": [_encode_series(labels, points) for labels, points in self.series.items()]}
        return comment_data.pack_json(PREFIX, payload)

    @classmethod
    def from_comment(cls, comment: str, budget: comment_data.InflateBudget | None = None) -> Timeline:
        """Parse one timeline comment; raises ValueError when it is damaged."""
        payload = comment_data.unpack_json(comment, PREFIX, "timeline", budget)
        return cls(_decode_payload(payload))

    @classmethod
    def from_comments(cls, comments: Sequence[str]) -> tuple[Timeline | None, list[str]]:
        """See :func:`split_comments`."""
        return split_comments(comments)


def split_comments(
    comments: Sequence[str], budget: comment_data.InflateBudget | None = None
) -> tuple[Timeline | None, list[str]]:
    """The timeline stored in *comments* and the other comments, in order.

    Several timeline comments (a file written by hand) are combined, later
    series replacing earlier ones of the same labels. A damaged one is
    replaced by :data:`DAMAGED_NOTE`, never an exception, so the profile still loads.
    """
    budget = budget or comment_data.InflateBudget()
    found, rest = comment_data.split_comments(
        comments, PREFIX, lambda c: Timeline.from_comment(c, budget), DAMAGED_NOTE
    )
    if not found:
        return None, rest
    return Timeline({k: v for timeline in found for k, v in timeline.series.items()}), rest


def _shared_times(events: Sequence[tuple[int, int, int, int]]) -> set[int]:
    """The times at which events of more than one series fall (*events*: ``(t, end?, series, bytes)``)."""
    first: dict[int, int] = {}
    shared: set[int] = set()
    for t, _, k, _ in events:
        if first.setdefault(t, k) != k:
            shared.add(t)
    return shared


def downsample(points: list[Point], max_points: int = MAX_POINTS) -> list[Point]:
    """At most *max_points* (>= 5) points: the first, the last, and per bucket its highest, lowest and last.

    Buckets are runs of :func:`bucket_size` consecutive points. Each keeps
    its first highest point (so the series' peak survives at its exact time
    and bytes), its first lowest (so a dip or the fall after a spike shows)
    and its last (so the line between buckets holds the true value). Kept
    points are original points, in their order.
    """
    if len(points) <= max_points:
        return points
    return [points[i] for i in kept(list(map(itemgetter(1), points)), max_points)]


def kept(values: Sequence[int], max_points: int = MAX_POINTS) -> list[int]:
    """The indices of the points :func:`downsample` keeps of a series whose bytes are *values*, in order."""
    n = len(values)
    if n <= max_points:
        return list(range(n))
    size = bucket_size(n, max_points)
    out = [0]
    for start in range(1, n - 1, size):
        chunk = values[start : min(start + size, n - 1)]
        high, low = chunk.index(max(chunk)), chunk.index(min(chunk))
        out += [start + j for j in sorted({high, low, len(chunk) - 1})]
    out.append(n - 1)
    return out


def bucket_size(count: int, max_points: int = MAX_POINTS) -> int:
    """How many consecutive points :func:`downsample` reduces to at most three, for a series of *count*."""
    buckets = max((max_points - 2) // 3, 1)
    return max(-(-(count - 2) // buckets), 1)  # ceiling division


def _encode_series(labels: Labels, points: list[Point]) -> dict[str, object]:
    """Times as differences from the previous point: small numbers compress well."""
    times, sizes, last = [], [], 0
    for t, b in points:
        times.append(t - last)
        sizes.append(b)
        last = t
    return {"labels": [list(pair) for pair in labels], "t": times, "b": sizes}


def _decode_payload(payload: object) -> dict[Labels, list[Point]]:
    """Validate the decoded JSON strictly: every value is checked, nothing is trusted."""
    if not isinstance(payload, Mapping) or not isinstance(payload.get("series"), list):
        raise ValueError("damaged timeline: no series list")
    entries = payload["series"]
    if len(entries) > _MAX_SERIES:
        raise ValueError("damaged timeline: too many series")
    out: dict[Labels, list[Point]] = {}
    for entry in entries:
        labels, points = _decode_series(entry)
        out[labels] = points
    return out


def _decode_series(entry: object) -> tuple[Labels, list[Point]]:
    if not isinstance(entry, Mapping):
        raise ValueError("damaged timeline: a series is not an object")
    raw_labels, times, sizes = entry.get("labels"), entry.get("t"), entry.get("b")
    if not isinstance(raw_labels, list) or not isinstance(times, list) or not isinstance(sizes, list):
        raise ValueError("damaged timeline: a series lacks labels, t or b")
    if len(times) != len(sizes):
        raise ValueError("damaged timeline: t and b differ in length")
    labels: list[tuple[str, str]] = []
    for pair in raw_labels:
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) for x in pair)):
            raise ValueError("damaged timeline: a label is not a [key, value] pair of strings")
        labels.append((pair[0], pair[1]))
    points: list[Point] = []
    now = 0
    for dt, b in zip(times, sizes, strict=True):
        if type(dt) is not int or type(b) is not int or b < 0 or b > _INT64_MAX:
            raise ValueError("damaged timeline: a point is not a pair of integers")
        now += dt
        if not 0 <= now <= _INT64_MAX:
            raise ValueError("damaged timeline: a time is out of range")
        points.append((now, b))
    # written series are downsampled already; one written by hand is made so here, so views stay bounded
    return tuple(sorted(labels)), downsample(points)
