"""The records the BPF program sends and the structures it reads, as bytes (mirrors bpf/agent.h).

tests/agent/test_events.py checks every constant here against agent.h.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

# kinds: which driver function
K_ALLOC, K_ALLOC_ASYNC, K_ALLOC_POOL_ASYNC, K_ALLOC_MANAGED, K_ALLOC_PITCH, K_CREATE = 0, 1, 2, 3, 4, 5
K_ALLOC_HOST, K_HOST_ALLOC, K_FREE, K_FREE_ASYNC, K_RELEASE, K_FREE_HOST = 6, 7, 8, 9, 10, 11
K_MAP, K_UNMAP, K_RETAIN = 12, 13, 14  # VMM references

# event types
EV_ALLOC, EV_FREE, EV_EXIT, EV_NEW_PROCESS, EV_FORK, EV_EXEC, EV_CODE = 1, 2, 3, 4, 5, 6, 7
EV_RESULT, EV_SITE = 8, 9  # entry-only probes: an allocation's outcome; a return address to probe
EV_DRIVER = 10  # a process mapped a libcuda file (probed at once if new)
EV_DRIVER_OPENED = 13  # a process opened a libcuda file: addr is its descriptor (probed before it is mapped)
EV_CODE_FREED = 12  # a code object of a sent stack was deallocated (its address may be reused)
EV_VMM = 11  # a VMM reference: kind, addr, size, and the handle after the header

# event flags
F_NOT_REGISTERED, F_NO_THREAD, F_TRUNCATED, F_UNTRACKED = 1, 2, 4, 8
F_PENDING, F_FAILED, F_RETURNED, F_UNKNOWN = 16, 32, 64, 128
F_HELD = 512  # EV_DRIVER_OPENED: the kernel side stopped the process (--hold-late-drivers): resume it
F_REPLACED = 256  # an allocation at an address whose free was missed (frees are sent at their entry)

DEVICE_CUDA, DEVICE_HOST = -1, -2
P_NATIVE = 1
STAT_LOST_EVENTS, STAT_LIVE_FULL, STAT_UNKNOWN_FREES, STAT_CALLS_FULL, STAT_RING_REFUSED = 0, 1, 2, 3, 4
STAT_LOST_ALLOCS, STAT_LOST_ALLOC_BYTES, STAT_LOST_FREES = 5, 6, 7  # what the lost events were
STAT_FRAME_READS = 8  # user-memory reads the frame walk made (a page or less each): its cost, not a loss
N_STATS = 9
SET_ONLY_REGISTERED, SET_ENTRY_ONLY, SET_LIVE_OVERFLOWED = 0, 1, 2
MAX_FRAMES = 128
RING_BYTES = 16 * 1024 * 1024  # the events ring (its size is fixed in agent.h)
OUTPUT_TRIES = 128  # a record the ring refuses while it has room is tried this often in all (agent.h)
FRAME_BYTES = 104  # the BPF walk reads this much of each interpreter frame at once
LIVE_BLOCKS = 262144  # default size of the live-block map (--max-blocks)

# the driver functions probed: symbol -> (entry program, kind)
ALLOCS = {
    "cuMemAlloc_v2": ("alloc_enter", K_ALLOC),
    "cuMemAllocAsync": ("alloc_enter", K_ALLOC_ASYNC),
    "cuMemAllocAsync_ptsz": ("alloc_enter", K_ALLOC_ASYNC),  # cuda.h's per-thread default stream variants
    "cuMemAllocFromPoolAsync": ("alloc_enter", K_ALLOC_POOL_ASYNC),
    "cuMemAllocFromPoolAsync_ptsz": ("alloc_enter", K_ALLOC_POOL_ASYNC),
    "cuMemAllocManaged": ("alloc_enter", K_ALLOC_MANAGED),
    "cuMemAllocPitch_v2": ("pitch_enter", K_ALLOC_PITCH),
    "cuMemCreate": ("create_enter", K_CREATE),
    "cuMemAllocHost_v2": ("alloc_enter", K_ALLOC_HOST),
    "cuMemHostAlloc": ("alloc_enter", K_HOST_ALLOC),
}
FREES = {
    "cuMemFree_v2": K_FREE,
    "cuMemFreeAsync": K_FREE_ASYNC,
    "cuMemFreeAsync_ptsz": K_FREE_ASYNC,
    "cuMemRelease": K_RELEASE,
    "cuMemFreeHost": K_FREE_HOST,
}
# VMM references: symbol -> kind (one entry program, vmm_enter; its uretprobe vmm_exit)
VMM = {
    "cuMemMap": K_MAP,
    "cuMemUnmap": K_UNMAP,
    "cuMemRetainAllocationHandle": K_RETAIN,
}
INIT = "cuInit"

HEADER = struct.Struct("<BBHHHIIQQQiI16s")
# a record where it lies in the ring, its 8-byte ring header first: length word (busy and discard bits),
# type, kind, flags, tgid, tid, addr, size, device (what booking a free or an allocation of a named stack needs)
RING_RECORD = struct.Struct("<I4xBB4xHIIQQ8xi")
OFFSET_FIELDS = (
    "runtime_interp_head",
    "interp_threads_head",
    "tstate_next",
    "tstate_native_thread_id",
    "tstate_thread_id",
    "tstate_cframe",
    "cframe_current_frame",
    "tstate_frame",
    "frame_previous",
    "frame_code",
    "frame_instr",
    "frame_instr_size",
    "frame_owner",
    "owner_cstack",
)
# struct code_offsets: the py_offsets.py name each takes its value from (3.10 has no co_qualname)
CODE_OFFSET_FIELDS = {
    "code_name": ("code_qualname", "code_name"),
    "code_filename": ("code_filename",),
    "code_firstlineno": ("code_firstlineno",),
    "code_linetable": ("code_linetable",),
    "unicode_state": ("unicode_state",),
    "unicode_length": ("unicode_length",),
    "unicode_ascii_data": ("unicode_ascii_data",),
    "unicode_compact_data": ("unicode_compact_data",),
    "bytes_size": ("bytes_size",),
    "bytes_data": ("bytes_data",),
}
PROC = struct.Struct("<QII" + "i" * (len(OFFSET_FIELDS) + len(CODE_OFFSET_FIELDS)))
CODE_NAME_BYTES, CODE_FILE_BYTES, CODE_TABLE_BYTES = 128, 256, 1024
CODE_RECORD = struct.Struct(f"<B3xIQiIIIII{CODE_NAME_BYTES}s{CODE_FILE_BYTES}s{CODE_TABLE_BYTES}s")
BLOCK_KEY = struct.Struct("<IIQ")


class Header(NamedTuple):
    """struct event_header."""

    type: int
    kind: int
    nframes: int
    nnative: int
    flags: int
    tgid: int
    tid: int
    addr: int
    size: int
    ts: int
    device: int
    seq: int  # entry-only probes: a thread's allocation number (its pending EV_ALLOC and its EV_RESULT)
    comm: bytes


def header(data: bytes) -> Header:
    """The fields every record but a code record starts with."""
    return Header._make(HEADER.unpack_from(data))


_FREE = struct.Struct("<6xHIIQQ")  # flags, tgid, tid, address and size of a free record, nothing else


def unpack_free(data: bytes) -> tuple[int, int, int, int, int]:
    return _FREE.unpack_from(data)


def vmm_handle(data: bytes) -> int:
    """The handle an EV_VMM record carries after its header (cuMemMap's)."""
    return int.from_bytes(data[HEADER.size : HEADER.size + 8], "little")


def python_frames(data: bytes, n: int) -> list[tuple[int, int]]:
    """(code object, instruction) per frame, leaf first."""
    flat = struct.unpack_from(f"<{2 * n}Q", data, HEADER.size)
    return list(zip(flat[0::2], flat[1::2], strict=True))


def native_frames(data: bytes, nframes: int, nnative: int) -> tuple[int, ...]:
    return struct.unpack_from(f"<{nnative}Q", data, HEADER.size + 16 * nframes)


def code_offset(offsets: dict[str, int], field: str) -> int:
    """The first of a code_offsets field's sources that this version has."""
    return next(offsets[name] for name in CODE_OFFSET_FIELDS[field] if offsets[name] >= 0)


def proc_value(runtime: int, flags: int, offsets: dict[str, int] | None) -> bytes:
    if not offsets:
        return PROC.pack(runtime, flags, 0, *[0] * (len(OFFSET_FIELDS) + len(CODE_OFFSET_FIELDS)))
    values = [offsets[f] for f in OFFSET_FIELDS] + [code_offset(offsets, f) for f in CODE_OFFSET_FIELDS]
    return PROC.pack(runtime, flags, 0, *values)


class CodeRecord(NamedTuple):
    """What the BPF side copied of one code object (struct code_record)."""

    tgid: int
    code: int
    firstlineno: int
    name_state: int
    file_state: int
    name_len: int
    file_len: int
    table_len: int
    name: bytes
    file: bytes
    table: bytes


def code_record(data: bytes) -> CodeRecord:
    return CodeRecord._make(CODE_RECORD.unpack_from(data)[1:])


_DEVICES = {DEVICE_HOST: "host", DEVICE_CUDA: "cuda"}


def device_label(device: int) -> str:
    """``cuda`` (the context's device), ``cuda:N`` (cuMemCreate names it), ``host`` (pinned memory)."""
    name = _DEVICES.get(device)
    return name if name is not None else f"cuda:{device}"
