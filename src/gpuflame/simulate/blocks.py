"""The pieces of the caching-allocator model: request rounding, segment sizes, segments, blocks, pools.

The rules that move them are :mod:`gpuflame.simulate.allocator`'s; these are
the shapes it moves (and the sizes ``c10/cuda/CUDACachingAllocator.cpp``
names), kept apart so that each module reads on its own.
"""

from __future__ import annotations

from bisect import bisect_left, insort

from gpuflame.simulate.settings import LARGE_BUFFER, Settings

MIN_BLOCK = 512  # kMinBlockSize
SMALL_SIZE = 1 << 20  # kSmallSize: the largest request of the small pool
SMALL_BUFFER = 2 << 20  # kSmallBuffer: a small pool's segment (and its expandable page)
# LARGE_BUFFER (kLargeBuffer, settings.py's): a 1-10 MiB request's segment (and a large expandable page)
MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc
ROUND_LARGE = 2 << 20  # kRoundLarge


def round_size(size: int, settings: Settings) -> int:
    """The block size of a request of *size* bytes (round_size)."""
    if size < MIN_BLOCK:
        return MIN_BLOCK
    divisions = settings.divisions(size)
    if divisions > 1 and size > MIN_BLOCK * divisions:
        return _next_division(size, divisions)
    return -(-size // MIN_BLOCK) * MIN_BLOCK


def _next_division(size: int, divisions: int) -> int:
    """roundup_power2_next_division: the next of *divisions* equal steps between two powers of two."""
    if size & (size - 1) == 0:
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)
    if step == 0:
        return floor << 1
    rounded = size & ~(step - 1)
    return size if rounded == size else rounded + step


def allocation_size(size: int) -> int:
    """The segment cudaMalloc'd for a block of *size* (get_allocation_size)."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


Live = tuple[int, int, int, int, bool]  # a block alive at the start: addr, size, requested, site, pending


class Segment:
    """One cudaMalloc (or one expandable segment's address space)."""

    __slots__ = ("addr", "size", "small", "stream", "site", "expandable", "page", "mapped")

    def __init__(self, addr: int, size: int, small: bool, stream: int, site: int, expandable: bool = False) -> None:
        self.addr, self.size, self.small, self.stream, self.site = addr, size, small, stream, site
        self.expandable = expandable
        self.page = SMALL_BUFFER if small else LARGE_BUFFER
        self.mapped = 0 if expandable else size  # the bytes it holds on the device

    def reserved(self) -> int:
        return self.mapped


class Block:
    """A piece of a segment: allocated, waiting for its stream (pending), free, or (expandable) unmapped."""

    __slots__ = (
        "addr",
        "size",
        "stream",
        "segment",
        "prev",
        "next",
        "allocated",
        "pending",
        "mapped",
        "requested",
        "site",
        "origin",
        "gc_base",
        "spare",
    )

    def __init__(self, addr: int, size: int, segment: Segment, mapped: bool = True) -> None:
        self.addr, self.size, self.segment, self.stream = addr, size, segment, segment.stream
        self.prev: Block | None = None
        self.next: Block | None = None
        self.allocated = self.pending = False
        self.mapped = mapped
        self.requested = 0
        self.site = 0  # the stack that holds it (allocated)
        self.origin = segment.site  # the stack whose allocation split it off (free): who made this waste
        self.gc_base = 0
        self.spare = 0  # handed out whole: its bytes beyond the rounded request (not split off)

    def whole(self) -> bool:
        return self.prev is None and self.next is None


class Pool:
    """Free blocks of one pool per stream, sorted by (size, address) as BlockComparatorSize sorts them."""

    def __init__(self, small: bool) -> None:
        self.small = small
        self.free: dict[int, list[tuple[int, int]]] = {}
        self.blocks: dict[int, Block] = {}  # address -> free mapped block
        self.unmapped: dict[int, list[int]] = {}  # stream -> addresses (expandable segments' unmapped ranges)
        self.unmapped_blocks: dict[int, Block] = {}
        self.calls = 0  # get_free_block calls, the garbage collector's clock

    def insert(self, b: Block) -> None:
        b.gc_base = self.calls
        insort(self.free.setdefault(b.stream, []), (b.size, b.addr))
        self.blocks[b.addr] = b

    def remove(self, b: Block) -> None:
        lst = self.free[b.stream]
        del lst[bisect_left(lst, (b.size, b.addr))]
        del self.blocks[b.addr]

    def insert_unmapped(self, b: Block) -> None:
        insort(self.unmapped.setdefault(b.stream, []), b.addr)
        self.unmapped_blocks[b.addr] = b

    def remove_unmapped(self, b: Block) -> None:
        lst = self.unmapped[b.stream]
        del lst[bisect_left(lst, b.addr)]
        del self.unmapped_blocks[b.addr]

    def ordered(self) -> list[Block]:
        """Free blocks in the allocator's order: stream, size, address."""
        return [self.blocks[a] for s in sorted(self.free) for _, a in self.free[s]]
