"""A snapshot's segments and blocks: the ``inuse_*`` view, the synthetic frames, one reading of a block.

What the allocator holds when the snapshot was taken (formats/torch_snapshot.py
says what each view counts): every active block at its requested bytes
under its stack, the allocator's rounding and the cached free blocks under
synthetic frames; and the helpers every part of the conversion reads a
block or a size with.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gpuflame.errors import ProfileFormatError
from gpuflame.model.categories import BLOCK_CATEGORY_KEY
from gpuflame.model.profile import SYNTHETIC, Frame, Profile
from gpuflame.symbols import names

if TYPE_CHECKING:
    from gpuflame.formats.torch_snapshot import _Converter


CACHED_FREE_FRAME = Frame(names.CACHED_FREE, kind=SYNTHETIC)
ROUNDING_FRAME = Frame(names.ALLOCATOR_ROUNDING, kind=SYNTHETIC)
BEFORE_TRACE_FRAME = Frame("<allocated before the trace>", kind=SYNTHETIC)
NO_STACK_FRAME = Frame("<no stack recorded>", kind=SYNTHETIC)

# why a block has no Python stack: the note said under the synthetic frame that holds it
STACKLESS_WHY = {
    BEFORE_TRACE_FRAME.name: (
        "was allocated before the trace began, so its stack is not known: the trace's ring buffer had wrapped "
        "(raise max_entries in torch.cuda.memory._record_memory_history) or recording started after these "
        "blocks were made (start it before the model is loaded)"
    ),
    NO_STACK_FRAME.name: (
        "has no stack in the snapshot: its blocks were allocated while torch recorded no stacks (before "
        "torch.cuda.memory._record_memory_history was called, the usual case for weights loaded first, or with "
        "stacks off), or by C++ code with no Python caller (cuBLAS workspaces, NCCL buffers); start recording "
        "before the model is loaded to see them"
    ),
}

INT64_MAX = (1 << 63) - 1  # what pprof can store

# one row of a view: (stack, the block's category or None, the phase it was allocated in or None)
RowKey = tuple[tuple[int, ...], Any, str | None]


# "active_awaiting_free" is how torch's docstring spells the state the C++ code writes
# as "active_pending_free"; accept both.
ACTIVE_STATES = frozenset(("active_allocated", "active_pending_free", "active_awaiting_free"))


def book_in_use(conv: _Converter) -> None:
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


def _book_held(conv: _Converter, held: list[tuple[int, int, Any]]) -> dict[int, int]:
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


def tally(rows: dict[Any, list[int]], key: Any, size: int) -> None:
    """One more allocation of *size* bytes in the row of *key*: ``[bytes, count]``, as every view books them."""
    row = rows.get(key)
    if row is None:
        rows[key] = [size, 1]
    else:
        row[0] += size
        row[1] += 1


def block_frames(block: Mapping[str, Any]) -> Any:
    frames = block.get("frames")
    if frames is None and "history" in block:  # snapshots before torch 2.1
        history = block["history"]
        if isinstance(history, list) and history and isinstance(history[0], dict):
            return history[0].get("frames")
    return frames


def allocated_bytes(profile: Profile, type_name: str) -> int:
    """A view's live allocations: its total without the allocator's rounding and cached blocks."""
    i = profile.type_index(type_name)
    reserve = (names.ALLOCATOR_ROUNDING, names.CACHED_FREE)
    frames = profile.frames
    return sum(s.values[i] for s in profile.samples if frames[s.stack[0]].name not in reserve)


def requested_bytes(block: Mapping[str, Any]) -> int:
    """What an active block's allocation asked for: the unit of every view.

    The trace records requested bytes, so peak, in use and allocated all
    count them; the block's ``size`` adds the allocator's rounding. Snapshots
    older than ``requested_size`` (torch < 2.0) give the block size.
    """
    size = block["size"]
    asked = block.get("requested_size")
    if type(asked) is int and 0 <= asked <= size:
        return asked
    return size


def checked_int(value: Any, what: str) -> int:
    """A size, count or index from the snapshot: a non-negative integer pprof can hold."""
    if type(value) is int and 0 <= value <= INT64_MAX:
        return value
    raise ProfileFormatError(f"{what} is not a non-negative integer ({type(value).__name__})")
