"""A recorder's per-phase books as the profile's phase table (model/phases.py).

Both torch recorders keep, per phase id, its first start, last end, highest
live total (and when), what was in use at its end and, per site, the bytes
live at that highest moment; this turns them into :class:`PhaseStat` rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from gpuflame.capture.books import phases
from gpuflame.model.phases import PhaseStat, ordered

# (phase id, start ns, end ns (0: still running), peak, peak ns, in use at end, [(site, bytes at the peak)])
RawRow = tuple[int, int, int, int, int, int, Iterable[tuple[int, int]]]


def stats(
    raw: Iterable[RawRow], device: str, pid: str, window: tuple[int, int], leaf_of: Callable[[int], str]
) -> list[PhaseStat]:
    """One row per phase seen; *window* is the recording's (start, end) ns; *leaf_of* names a site's function."""
    started, ended = window
    out = []
    for phase_id, start, end, peak, peak_ns, inuse_end, at_peak in raw:
        by_function: dict[str, int] = {}
        for site, nbytes in at_peak:
            if nbytes:
                name = leaf_of(site)
                by_function[name] = by_function.get(name, 0) + nbytes
        top = max(by_function.items(), key=lambda kv: (kv[1], kv[0]), default=("", 0))
        out.append(
            PhaseStat(
                phases.name_of(phase_id),
                device,
                pid,
                start=start if phase_id else started,
                end=end or ended,
                peak=peak,
                peak_time=peak_ns,
                inuse_end=inuse_end,
                top=top[0],
                top_bytes=top[1],
                order=phase_id,
            )
        )
    return ordered(out)
