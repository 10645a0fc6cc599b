"""A model of PyTorch's CUDA caching allocator, block by block.

It follows ``c10/cuda/CUDACachingAllocator.cpp`` of PyTorch
:data:`PYTORCH_RULES` (a snapshot does not say which PyTorch recorded it, so
every file replays under these rules): requests rounded to 512 bytes (or to
``roundup_power2_divisions``), two pools (requests up to 1 MiB are small),
new segments of 2 MiB (small), 20 MiB (1-10 MiB requests) or the request
rounded to 2 MiB; best fit per stream, ties broken by the lower address
(``BlockComparatorSize``: stream, size, address); a block split when the
rest is at least 512 bytes (small pool, expandable segments) or more than
1 MiB (large pool, requests under ``max_split_size``); blocks of
``max_split_size`` or more never split, and used for a request only within
``max_non_split_rounding`` (20 MiB) of it; free neighbours merged, but not
while a free waits for its stream (``free_requested`` before
``free_completed``); when ``cudaMalloc`` fails: the cached oversize blocks
released first (``release_available_cached_blocks``), then every whole free
segment after completing the waiting frees (``release_cached_blocks``), and
the allocation retried; ``garbage_collection_threshold``; and
``expandable_segments`` (one growing segment per pool and stream, mapped
in 2 MiB (small) or 20 MiB (large) pages, unmapped when released).

Where the C++ code would release a split block (it only releases whole
segments in practice), this model releases whole segments only. The
garbage collector runs, as in PyTorch, only where the program set a memory
fraction (``set_per_process_memory_fraction``: its ``allowed_memory_maximum``
is *fraction_limit* here, the fraction of the device's total memory);
``garbage_collection_threshold`` alone does nothing.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from typing import TypeGuard

from gpuflame.simulate.blocks import (
    LARGE_BUFFER,
    MIN_BLOCK,
    SMALL_BUFFER,
    SMALL_SIZE,
    Block,
    Live,
    Pool,
    Segment,
    allocation_size,
    round_size,
)
from gpuflame.simulate.settings import SIZE_MAX, Settings

PYTORCH_RULES = "2.8"
EXPANDABLE_SPACE = 1 << 40  # an expandable segment's address space when the device size is unknown


class Allocator:
    """One device's caching allocator; its segment events are in :attr:`events`."""

    def __init__(
        self,
        settings: Settings,
        capacity: int | None = None,
        new_address: Callable[[int], int] | None = None,
        fraction_limit: int | None = None,
    ) -> None:
        self.settings = settings
        # bytes the device lets us reserve (None: no limit); a memory fraction's limit caps it too
        self.capacity = capacity if fraction_limit is None else min(capacity or fraction_limit, fraction_limit)
        self.fraction_limit = fraction_limit  # allowed_memory_maximum: None unless a memory fraction is set
        self.small, self.large = Pool(True), Pool(False)
        self.reserved = self.allocated = 0
        self.reserved_peak = self.allocated_peak = self.allocated_at_reserved_peak = 0
        self.reserved_at_allocated_peak = 0
        self.unsplit = 0  # bytes of allocated blocks beyond their rounded requests (blocks not split), now
        self.other_stream = 0  # bytes of segments made while a cached block that fit sat on another stream
        self.segments: dict[int, Segment] = {}
        self.pending: dict[int, Block] = {}  # id -> block whose free waits for its stream
        # what the trace would show of the allocator's own doing: (segment_alloc|_free|_map|_unmap, addr, size)
        # and the waiting frees a release completes (free_completed, addr, requested)
        self.events: list[tuple[str, int, int]] = []
        self._next = 0x7F00_0000_0000
        self.new_address = new_address or self._fresh_address

    def _fresh_address(self, size: int) -> int:
        addr = self._next
        self._next += -(-size // SMALL_BUFFER) * SMALL_BUFFER
        return addr

    @property
    def gc_on(self) -> bool:
        """PyTorch: ``set_fraction && garbage_collection_threshold() > 0``."""
        return self.settings.garbage_collection_threshold > 0 and self.fraction_limit is not None

    def segment_for(self, orig: int) -> int:
        """What a request needs from the device with no cached block: a segment, or (expandable) pages."""
        size = round_size(orig, self.settings)
        if self.settings.expandable_segments:
            page = SMALL_BUFFER if size <= SMALL_SIZE else LARGE_BUFFER
            return -(-size // page) * page
        return allocation_size(size)

    # -- the allocator's entry points ------------------------------------------------

    def malloc(self, orig: int, stream: int = 0, site: int = 0, cached: bool = True) -> Block | None:
        """A block for a request of *orig* bytes, or None: out of memory (the state keeps what the tries did).

        *cached* false skips the search of the cached blocks: the replay of a
        malloc whose search failed before the release the trace shows.
        """
        size = round_size(orig, self.settings)
        pool = self.small if size <= SMALL_SIZE else self.large
        seg_size = allocation_size(size)
        if self.gc_on:
            pool.calls += 1
        b = self._get_free_block(pool, stream, size) if cached else None
        if b is None:
            elsewhere = any(s != stream and lst and lst[-1][0] >= size for s, lst in pool.free.items())
            reserved = self.reserved
            if self.gc_on:
                self._garbage_collect()
            b = self._alloc_block(pool, stream, size, seg_size, site)
            if b is None and self._release_available(pool, stream, size):
                b = self._alloc_block(pool, stream, size, seg_size, site)
            if b is None and self.release_cached():
                b = self._alloc_block(pool, stream, size, seg_size, site)
            if elsewhere and b is not None:
                self.other_stream += max(self.reserved - reserved, 0)
        if b is None:
            return None
        b = self._found(b, pool, size, orig, site)
        self.note_peak()
        return b

    def free_request(self, b: Block) -> None:
        """``free_requested``: the block waits for its stream before it can be reused."""
        if b.allocated:
            b.allocated, b.pending = False, True
            self.pending[id(b)] = b

    def free_complete(self, b: Block) -> None:
        """``free_completed`` (free_block): merged with free neighbours, back in its pool."""
        if not (b.allocated or b.pending):
            return
        self.pending.pop(id(b), None)
        b.allocated = b.pending = False
        self.allocated -= b.size
        self.unsplit -= b.spare
        b.spare = 0
        pool = self.small if b.segment.small else self.large
        self._merge(b, b.prev, pool)
        self._merge(b, b.next, pool)
        pool.insert(b)

    def free(self, b: Block) -> None:
        self.free_request(b)
        self.free_complete(b)

    def release_cached(self) -> bool:
        """``empty_cache()`` and the last retry: finish waiting frees, release every whole free segment."""
        for b in list(self.pending.values()):
            self.events.append(("free_completed", b.addr, b.requested))  # as the trace records it
            self.free_complete(b)
        for pool in (self.large, self.small):
            to_unmap = []
            for b in pool.ordered():
                if b.segment.expandable:
                    to_unmap.append(b)
                elif b.whole():
                    self._release_block(b, pool)
            for b in to_unmap:
                self._unmap(b, pool)
        return True

    def release_segment(self, addr: int) -> bool:
        """Release the segment at *addr* if it is whole and free (a recorded ``segment_free`` followed)."""
        seg = self.segments.get(addr)
        if seg is None or seg.expandable:
            return False
        pool = self.small if seg.small else self.large
        b = pool.blocks.get(addr)
        if b is None or not b.whole():
            return False
        self._release_block(b, pool)
        return True

    # -- finding and making blocks ------------------------------------------------------

    def fits_cached(self, orig: int, stream: int = 0) -> bool:
        """Whether a cached block would serve a request of *orig* bytes now (nothing changes)."""
        size = round_size(orig, self.settings)
        return self._find_free(self.small if size <= SMALL_SIZE else self.large, stream, size) is not None

    def _get_free_block(self, pool: Pool, stream: int, size: int) -> Block | None:
        b = self._find_free(pool, stream, size)
        if b is not None:
            pool.remove(b)
        return b

    def _find_free(self, pool: Pool, stream: int, size: int) -> Block | None:
        lst = pool.free.get(stream)
        if not lst:
            return None
        i = bisect_left(lst, (size, -1))
        if i == len(lst):
            return None
        b = pool.blocks[lst[i][1]]
        if b.segment.expandable and self.settings.expandable_segments:
            # best fit counts an expandable block at the size it can grow to
            while i + 1 < len(lst) and _grows_to(nxt := pool.blocks[lst[i + 1][1]]) < _grows_to(b):
                i, b = i + 1, nxt
        split_max = self.settings.max_split_size
        if size < split_max <= b.size:
            return None  # an oversize block is not split for a smaller request
        if size >= split_max and b.size >= size + self.settings.max_non_split_rounding:
            return None  # nor used for a request far below its size
        return b

    def _alloc_block(self, pool: Pool, stream: int, size: int, seg_size: int, site: int) -> Block | None:
        """cudaMalloc a new segment (or map pages of an expandable one); None when the device is full."""
        if self.settings.expandable_segments:
            return self._expandable_block(pool, stream, size, site)
        if self.capacity is not None and self.reserved + seg_size > self.capacity:
            return None
        addr = self.new_address(seg_size)
        seg = self.segments[addr] = Segment(addr, seg_size, pool.small, stream, site)
        self.reserved += seg_size
        self.events.append(("segment_alloc", addr, seg_size))
        return Block(addr, seg_size, seg)

    def _found(self, b: Block, pool: Pool, size: int, orig: int, site: int) -> Block:
        """alloc_found_block: the lower part is handed out, the rest stays free."""
        rest = b.size - size
        if pool.small or self.settings.expandable_segments:
            split = rest >= MIN_BLOCK
        else:
            split = size < self.settings.max_split_size and rest > SMALL_SIZE
        if split:
            new = Block(b.addr, size, b.segment)
            new.prev, new.next = b.prev, b
            if b.prev is not None:
                b.prev.next = new
            b.prev = new
            b.addr += size
            b.size = rest
            b.origin = site
            pool.insert(b)
            b = new
        b.allocated, b.requested, b.site = True, orig, site
        b.spare = b.size - size
        self.unsplit += b.spare
        self.allocated += b.size
        return b

    def _merge(self, dst: Block, src: Block | None, pool: Pool) -> None:
        """try_merge_blocks: *dst* takes in a free neighbour *src*."""
        if src is None or src.allocated or src.pending or src.mapped != dst.mapped:
            return
        if src.mapped:
            pool.remove(src)
        else:
            pool.remove_unmapped(src)
        if src.size > dst.size:
            dst.origin = src.origin
        if dst.prev is src:
            dst.addr = src.addr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size

    def _release_block(self, b: Block, pool: Pool) -> None:
        pool.remove(b)
        del self.segments[b.addr]
        self.reserved -= b.size
        self.events.append(("segment_free", b.addr, b.size))

    def _release_available(self, pool: Pool, stream: int, size: int) -> bool:
        """release_available_cached_blocks: free oversize cached blocks, largest first (max_split_size only)."""
        split_max = self.settings.max_split_size
        if split_max == SIZE_MAX:
            return False
        key = max(size, split_max)
        lst = pool.free.get(stream, [])
        i = bisect_left(lst, (key, -1))
        if i < len(lst) and not pool.blocks[lst[i][1]].segment.expandable:
            b = pool.blocks[lst[i][1]]
            if b.whole():
                self._release_block(b, pool)
            return True
        released = 0
        i -= 1
        while released < key and i >= 0 and lst[i][0] >= split_max:
            b = pool.blocks[lst[i][1]]
            i -= 1
            if not b.segment.expandable and b.whole():
                self._release_block(b, pool)
                released += b.size
        return released >= key

    def _garbage_collect(self) -> None:
        """garbage_collect_cached_blocks: release whole large blocks unused for longer than average."""
        assert self.fraction_limit is not None
        threshold = int(self.settings.garbage_collection_threshold * self.fraction_limit)
        if self.reserved <= threshold:
            return
        target, reclaimed = self.reserved - threshold, 0
        pool = self.large
        whole = [b for b in pool.ordered() if b.whole()]
        total_age = sum(pool.calls - b.gc_base for b in whole)
        count = len(whole)
        freed = True
        while reclaimed < target and freed and count > 0:
            threshold_age = total_age / count
            freed = False
            for b in [b for b in pool.ordered() if b.whole() and not b.segment.expandable]:
                age = pool.calls - b.gc_base
                if age >= threshold_age:
                    freed = True
                    reclaimed += b.size
                    total_age -= age
                    count -= 1
                    self._release_block(b, pool)

    def note_peak(self) -> None:
        """The peaks so far; at the reserved peak, the most allocated while it held (its least fragmentation,
        as ``report`` takes it from a snapshot); at the allocated peak, the least reserved while it held."""
        if self.reserved > self.reserved_peak or (
            self.reserved == self.reserved_peak and self.allocated > self.allocated_at_reserved_peak
        ):
            self.reserved_peak = self.reserved
            self.allocated_at_reserved_peak = self.allocated
        if self.allocated > self.allocated_peak or (
            self.allocated == self.allocated_peak and self.reserved < self.reserved_at_allocated_peak
        ):
            self.allocated_peak = self.allocated
            self.reserved_at_allocated_peak = self.reserved

    # -- expandable segments -----------------------------------------------------------

    def _expandable_block(self, pool: Pool, stream: int, size: int, site: int) -> Block | None:
        """try_allocate_expandable_block: free and unmapped room of *size* bytes, mapped as needed."""
        c = self._expandable_candidate(pool, stream, size, site)
        if not c.mapped and not self._map(c, min(c.size, size), pool):
            return None
        while c.size < size:
            nxt = c.next
            assert nxt is not None
            if not self._map(nxt, min(size - c.size, nxt.size), pool):
                return None
            c = nxt
        pool.remove(c)
        return c

    def _expandable_candidate(self, pool: Pool, stream: int, size: int, site: int) -> Block:
        for addr in pool.unmapped.get(stream, ()):
            c = pool.unmapped_blocks[addr]
            if _usable(c.prev):
                c = c.prev
            room = 0
            b: Block | None = c
            while room < size and _usable(b):
                room += b.size
                b = b.next
            if room >= size:
                return c
        space = self.capacity + self.capacity // 8 if self.capacity else EXPANDABLE_SPACE
        page = SMALL_BUFFER if pool.small else LARGE_BUFFER
        space = -(-space // page) * page
        addr = self.new_address(space)
        seg = self.segments[addr] = Segment(addr, space, pool.small, stream, site, expandable=True)
        c = Block(addr, space, seg, mapped=False)
        pool.insert_unmapped(c)
        return c

    def _map(self, b: Block, size: int, pool: Pool) -> bool:
        """map_block: map whole pages at the start of unmapped *b*, merged with free mapped neighbours."""
        page = b.segment.page
        mapped = min(-(-size // page) * page, b.size)
        if self.capacity is not None and self.reserved + mapped > self.capacity:
            return False
        pool.remove_unmapped(b)
        b.mapped = True
        if mapped < b.size:
            rest = Block(b.addr + mapped, b.size - mapped, b.segment, mapped=False)
            rest.prev, rest.next = b, b.next
            if b.next is not None:
                b.next.prev = rest
            b.next = rest
            b.size = mapped
            pool.insert_unmapped(rest)
        self.events.append(("segment_map", b.addr, mapped))
        b.segment.mapped += mapped
        self._merge(b, b.prev, pool)
        self._merge(b, b.next, pool)
        pool.insert(b)
        self.reserved += mapped
        return True

    def _unmap(self, b: Block, pool: Pool) -> None:
        """unmap_block: unmap the whole pages inside free block *b*; the ends stay mapped and free."""
        page, base = b.segment.page, b.segment.addr
        begin = base + -(-(b.addr - base) // page) * page
        end = base + (b.addr + b.size - base) // page * page
        if end <= begin:
            return
        pool.remove(b)
        if begin > b.addr:
            before = Block(b.addr, begin - b.addr, b.segment)
            before.prev, before.next, before.origin = b.prev, b, b.origin
            if b.prev is not None:
                b.prev.next = before
            b.prev = before
            pool.insert(before)
        if end < b.addr + b.size:
            after = Block(end, b.addr + b.size - end, b.segment)
            after.prev, after.next, after.origin = b, b.next, b.origin
            if b.next is not None:
                b.next.prev = after
            b.next = after
            pool.insert(after)
        b.addr, b.size, b.mapped = begin, end - begin, False
        self.reserved -= end - begin
        self.events.append(("segment_unmap", begin, end - begin))
        b.segment.mapped -= end - begin
        self._merge(b, b.prev, pool)
        self._merge(b, b.next, pool)
        pool.insert_unmapped(b)

    # -- a state that existed before the replay ----------------------------------------

    def add_segment(self, addr: int, size: int, small: bool, stream: int, live: list[Live]) -> list[Block]:
        """A segment that exists already, with its live blocks (addr, size, requested, site, pending)."""
        seg = self.segments[addr] = Segment(addr, size, small, stream, 0)
        return self._settle(seg, self._pieces(seg, addr, addr + size, live))

    def add_expandable(self, ranges: list[tuple[int, int]], small: bool, stream: int, live: list[Live]) -> list[Block]:
        """An expandable segment that exists already: its mapped *ranges* (addr, size) and live blocks.

        The segment's address space starts at its lowest mapped byte (a
        snapshot shows only the mapped ranges).
        """
        ranges = sorted(ranges)
        base = ranges[0][0]
        page = SMALL_BUFFER if small else LARGE_BUFFER
        space = -(-max(EXPANDABLE_SPACE, ranges[-1][0] + ranges[-1][1] - base) // page) * page
        seg = self.segments[base] = Segment(base, space, small, stream, 0, expandable=True)
        chain: list[Block] = []
        at = base
        for addr, size in ranges:
            if addr > at:
                chain.append(Block(at, addr - at, seg, mapped=False))
            chain += self._pieces(seg, addr, addr + size, [x for x in live if addr <= x[0] < addr + size])
            seg.mapped += size
            at = addr + size
        chain.append(Block(at, base + space - at, seg, mapped=False))
        return self._settle(seg, chain)

    def _pieces(self, seg: Segment, start: int, end: int, live: list[Live]) -> list[Block]:
        """Blocks covering [start, end): the live ones, free ones between them."""
        chain: list[Block] = []
        at = start
        for b_addr, b_size, requested, site, pending in sorted(live):
            if b_addr > at:
                chain.append(Block(at, b_addr - at, seg))
            b = Block(b_addr, b_size, seg)
            b.allocated, b.pending, b.requested, b.site = not pending, pending, requested, site
            if pending:
                self.pending[id(b)] = b
            chain.append(b)
            at = b_addr + b_size
        if at < end:
            chain.append(Block(at, end - at, seg))
        return chain

    def _settle(self, seg: Segment, chain: list[Block]) -> list[Block]:
        """Link *chain*, file its free blocks in their pool, count it; the live blocks."""
        pool = self.small if seg.small else self.large
        for a, b in zip(chain, chain[1:], strict=False):
            a.next, b.prev = b, a
        for b in chain:
            if b.allocated or b.pending:
                self.allocated += b.size
            elif b.mapped:
                pool.insert(b)
            else:
                pool.insert_unmapped(b)
        self.reserved += seg.mapped
        self.note_peak()
        return [b for b in chain if b.allocated or b.pending]


def _grows_to(b: Block) -> int:
    nxt = b.next
    return b.size + (nxt.size if nxt is not None and not nxt.mapped else 0)


def _usable(b: Block | None) -> TypeGuard[Block]:
    return b is not None and not b.allocated and not b.pending
