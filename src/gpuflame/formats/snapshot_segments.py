"""The ``inuse_*`` view of a snapshot, from its segments: what the allocator held when it was taken.

Every active block at its requested bytes under its stack, the allocator's
rounding and the cached free blocks under synthetic frames
(formats/torch_snapshot.py says what each view counts).
"""

from __future__ import annotations

from typing import Any

from gpuflame.errors import ProfileFormatError
from gpuflame.formats.snapshot_blocks import (
    ACTIVE_STATES,
    CACHED_FREE_FRAME,
    ROUNDING_FRAME,
    RowKey,
    block_frames,
    checked_int,
    requested_bytes,
    tally,
)
from gpuflame.formats.snapshot_book import SnapshotBook
from gpuflame.model.categories import BLOCK_CATEGORY_KEY


def book_in_use(conv: SnapshotBook) -> None:
    """In use: active blocks at their requested bytes, the allocator's rounding, cached free blocks."""
    cached: dict[int, int] = {}
    held: list[tuple[int, int, Any]] = []  # (device, address, block) of each active block
    for seg in conv.segments:
        device = checked_int(seg.get("device", 0), "segment device")
        total = checked_int(seg["total_size"], "segment total_size")
        conv.reserved[device] = conv.reserved.get(device, 0) + total
        active = conv.active.setdefault(device, {})
        address = seg.get("address", 0)
        covered = 0
        for block in seg["blocks"]:
            size = block["size"]
            state = block["state"]
            if type(size) is not int or type(state) is not str or size < 0:
                raise ProfileFormatError("a block's size or state is not a size/string")
            if state in ACTIVE_STATES:
                addr = block.get("address")
                if addr is None:  # older snapshots: blocks follow each other in the segment
                    addr = covered + address
                if type(addr) is not int:
                    raise ProfileFormatError("a block's address is not an integer")
                active[addr] = block
                held.append((device, addr, block))
            else:
                cached[device] = cached.get(device, 0) + size
            covered += size
        if total > covered:  # a segment whose blocks do not cover it: reserved, unused
            cached[device] = cached.get(device, 0) + total - covered
    rounding = _book_held(conv, held)
    for frame, sizes in ((ROUNDING_FRAME, rounding), (CACHED_FREE_FRAME, cached)):
        for device, size in sorted(sizes.items()):
            if size:
                conv.add((conv.profile.frame_id(frame),), device, "inuse_space", size, 0)


def _book_held(conv: SnapshotBook, held: list[tuple[int, int, Any]]) -> dict[int, int]:
    """The inuse_* rows of the active blocks (their stacks read at once); returns each device's rounding."""
    rounding: dict[int, int] = {}
    inuse_by_device: dict[int, dict[RowKey, list[int]]] = {}
    stacks = conv.stacks.many([block_frames(block) for _, _, block in held])
    for (device, addr, block), st in zip(held, stacks, strict=True):
        asked = requested_bytes(block)
        rounding[device] = rounding.get(device, 0) + block["size"] - asked
        key = (st, block.get(BLOCK_CATEGORY_KEY) if conv.categorize else None, conv.phase_of_block(device, addr))
        tally(inuse_by_device.setdefault(device, {}), key, asked)
    for device in conv.active:  # in the order the segments name the devices
        for (st, marked, phase), (size, count) in inuse_by_device.get(device, {}).items():
            conv.add(st, device, "inuse_space", size, count, {BLOCK_CATEGORY_KEY: marked}, phase)
    return rounding
