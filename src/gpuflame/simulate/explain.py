"""Why a setting raises or lowers the reserved peak, measured from the replay at its reserved peak.

At a replay's reserved peak the reserved bytes are the allocated ones plus
the free ones, and the replay knows where each free byte sits and why each
allocated block is as large as it is. So the answer to "why more, why less"
is bytes the replay saw, per cause, beside the same causes under the
settings it is compared with:

- ``unsplit``: allocated blocks' bytes beyond their rounded requests (a
  cached block handed out whole: ``max_split_size_mb``'s oversize blocks,
  ``max_non_split_rounding_mb``, a large-pool rest of 1 MiB or less);
- ``unreleased``: free segments, whole, still reserved (released only when
  a ``cudaMalloc`` fails, so never where the device's size is not known),
  and an expandable segment's free pages at its ends, kept mapped;
- ``split_free``: free pieces between allocations of one segment;
- ``pages``: an expandable segment's free mapped bytes of less than a page
  next to its unmapped space (mapping rounds up to 2 or 20 MiB pages);
- ``other_stream``: bytes of segments made, up to the peak, while a cached
  block that fit sat on another stream (a block serves its own stream only).
"""

from __future__ import annotations

from typing import Any

from gpuflame.units import format_bytes

CAUSES = {
    "unsplit": "in blocks handed out whole, not split",
    "unreleased": "in free segments (or free pages) never released",
    "split_free": "free between allocations in split segments",
    "pages": "of pages rounded up (expandable segments map whole 2 or 20 MiB pages)",
    "other_stream": "of new segments made while a free block that fit sat on another stream",
}
SHOWN = 2 << 20  # a cause that moves less than this is not worth a word
NO_DEVICE = (
    "the replay never had to release memory (no device size known): --gpu-memory gives the answer on a real card"
)


def breakdown(sim: Any) -> dict[str, int]:
    """The causes' bytes in allocator *sim* as it stands (stopped at its reserved peak)."""
    out = dict.fromkeys(CAUSES, 0)
    out["unsplit"], out["other_stream"] = sim.unsplit, sim.other_stream
    for pool in (sim.small, sim.large):
        for b in pool.blocks.values():
            if b.segment.expandable:
                out[_expandable_cause(b)] += b.size
            elif b.whole():
                out["unreleased"] += b.size
            else:
                out["split_free"] += b.size
    return out


def _expandable_cause(b: Any) -> str:
    """A free mapped piece of an expandable segment: less than a page before unmapped space is page rounding;
    more there is kept mapped until a release; between allocations it is a split's rest."""
    edge = [n for n in (b.prev, b.next) if n is not None and not n.mapped]
    if not edge and b.prev is not None and b.next is not None:
        return "split_free"
    return "pages" if b.size < b.segment.page else "unreleased"


def why(new: dict[str, int] | None, old: dict[str, int] | None, device_known: bool) -> str | None:
    """The causes that moved between *old* and *new*, largest first, in one clause (None: none did)."""
    if not new or not old:
        return None
    moved = sorted(((new[k] - old[k], k) for k in CAUSES if abs(new[k] - old[k]) >= SHOWN), key=lambda x: -abs(x[0]))
    if not moved:
        return None
    parts = [f"{format_bytes(new[k])} {CAUSES[k]} (was {format_bytes(old[k])})" for _, k in moved]
    text = "at the reserved peak, " + "; ".join(parts)
    if not device_known and any(k == "unreleased" and d > 0 for d, k in moved):
        text += "; " + NO_DEVICE
    return text
