"""A snapshot's blocks read one way everywhere: their sizes, states and frames, the synthetic frames.

What the allocator holds when the snapshot was taken (formats/torch_snapshot.py
says what each view counts): every active block at its requested bytes
under its stack, the allocator's rounding and the cached free blocks under
synthetic frames; and the helpers every part of the conversion reads a
block or a size with.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuflame.errors import ProfileFormatError
from gpuflame.model.profile import SYNTHETIC, Frame, Profile
from gpuflame.symbols import names

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
