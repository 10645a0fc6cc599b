"""The few libbpf calls the agent makes, through ctypes (Debian's ``libbpf1``, 1.1 or later).

No PyPI binding for libbpf is kept up (``pylibbpf`` is alpha and has no ring
buffer), and bcc needs kernel headers and a compiler on the node; libbpf with
a CO-RE object built once is what eBPF projects ship today. Only the standard
library is used, so the agent starts without numpy or rich.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import mmap
import os
import select
import struct
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from gpuflame.errors import GpuflameError

PRINT_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
LIBBPF_WARN = 0
# the most one drain reads: about 5,000 records, 5 ms of booking, between two looks at the agent's stop flag
# (1 MiB made a stop wait up to 2 s for the reader thread, and overshoot its bound as long, with the agent
# given a twentieth of a CPU; a drain's own cost is a few microseconds)
CHUNK_BYTES = 256 << 10
DETACH_THREADS = 32  # links taken off at once (a kernel before 6.6 has one per probe: dozens per driver file)


class BpfError(GpuflameError):
    """libbpf refused something; the message carries its own log lines."""


class UprobeOpts(ctypes.Structure):
    """``struct bpf_uprobe_opts`` (libbpf 1.1)."""

    _fields_ = [
        ("sz", ctypes.c_size_t),
        ("ref_ctr_offset", ctypes.c_size_t),
        ("bpf_cookie", ctypes.c_uint64),
        ("retprobe", ctypes.c_bool),
        ("func_name", ctypes.c_char_p),
    ]


def _load_library() -> ctypes.CDLL:
    for name in ("libbpf.so.1", ctypes.util.find_library("bpf") or "libbpf.so"):
        try:
            return ctypes.CDLL(name, use_errno=True)
        except OSError:
            continue
    raise BpfError("libbpf is not installed (Debian/Ubuntu: apt-get install libbpf1)")


_lib: ctypes.CDLL | None = None
_log: list[str] = []
_libc = ctypes.CDLL(None, use_errno=True)


@PRINT_FN
def _print(level: int, fmt: bytes, args: int) -> int:
    """libbpf's log, kept for the error message instead of spilling onto stderr."""
    buf = ctypes.create_string_buffer(4096)
    _libc.vsnprintf(buf, ctypes.c_size_t(len(buf)), fmt, ctypes.c_void_p(args))
    _log.append(buf.value.decode(errors="replace").rstrip())
    del _log[:-40]
    return 0


def lib() -> ctypes.CDLL:
    """libbpf with the signatures declared once."""
    global _lib
    if _lib is not None:
        return _lib
    b = _load_library()
    p, i, s = ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p
    sigs: dict[str, tuple[object, list[object]]] = {
        "bpf_object__open_file": (p, [s, p]),
        "bpf_object__load": (i, [p]),
        "bpf_object__close": (None, [p]),
        "bpf_object__find_map_by_name": (p, [p, s]),
        "bpf_object__find_program_by_name": (p, [p, s]),
        "bpf_map__set_max_entries": (i, [p, ctypes.c_uint32]),
        "bpf_map__fd": (i, [p]),
        "bpf_program__attach": (p, [p]),
        "bpf_program__fd": (i, [p]),
        "bpf_program__set_expected_attach_type": (i, [p, i]),
        "bpf_program__set_autoload": (i, [p, ctypes.c_bool]),
        "bpf_program__attach_uprobe_opts": (p, [p, i, s, ctypes.c_size_t, ctypes.POINTER(UprobeOpts)]),
        "bpf_link__destroy": (i, [p]),
        "bpf_map_update_elem": (i, [i, p, p, ctypes.c_uint64]),
        "bpf_map_delete_elem": (i, [i, p]),
        "bpf_map_lookup_elem": (i, [i, p, p]),
        "bpf_map_get_next_key": (i, [i, p, p]),
        "libbpf_num_possible_cpus": (i, []),
        "libbpf_set_print": (p, [PRINT_FN]),
    }
    for name, (restype, argtypes) in sigs.items():
        fn = getattr(b, name)
        fn.restype = restype
        fn.argtypes = argtypes
    b.libbpf_set_print(_print)
    _lib = b
    return b


def _fail(what: str) -> BpfError:
    err = ctypes.get_errno()
    log = [line for line in _log if line.strip()][-6:]
    _log.clear()
    detail = f": {os.strerror(err)}" if err else ""
    more = ("\n  " + "\n  ".join(log)) if log else ""
    return BpfError(f"{what}{detail}{more}")


SYS_BPF = 321  # x86-64
BPF_LINK_CREATE = 28
BPF_TRACE_UPROBE_MULTI = 48
BPF_F_UPROBE_MULTI_RETURN = 1


class LinkCreateUprobeMulti(ctypes.Structure):
    """``union bpf_attr`` for BPF_LINK_CREATE with ``uprobe_multi`` (kernel 6.6+)."""

    _fields_ = [
        ("prog_fd", ctypes.c_uint32),
        ("target_fd", ctypes.c_uint32),
        ("attach_type", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("path", ctypes.c_uint64),
        ("offsets", ctypes.c_uint64),
        ("ref_ctr_offsets", ctypes.c_uint64),
        ("cookies", ctypes.c_uint64),
        ("cnt", ctypes.c_uint32),
        ("multi_flags", ctypes.c_uint32),
        ("pid", ctypes.c_uint32),
        ("pad", ctypes.c_uint32 * 7),
    ]


class BpfObject:
    """One loaded BPF object: its maps, programs and the links that attach them.

    *multi* names the uprobe programs to attach as uprobe-multi links (kernel
    6.6+; libbpf 1.1 predates them, so the link is made with the bpf syscall):
    one link per program and file instead of one perf event per probe, which
    detaches in one RCU grace period instead of one per probe (100 ms each).
    """

    def __init__(
        self,
        path: str,
        max_entries: dict[str, int] | None = None,
        multi: tuple[str, ...] = (),
        skip: tuple[str, ...] = (),
    ) -> None:
        b = lib()
        self._obj = b.bpf_object__open_file(path.encode(), None)
        self.fds: list[int] = []
        if not self._obj:
            raise _fail(f"cannot open the BPF object {path}")
        for name, n in (max_entries or {}).items():
            b.bpf_map__set_max_entries(self._map(name), n)
        for name in multi:  # those of them the object has (a benchmark's empty stand-in has fewer)
            prog = b.bpf_object__find_program_by_name(self._obj, name.encode())
            if prog:
                b.bpf_program__set_expected_attach_type(prog, BPF_TRACE_UPROBE_MULTI)
        for name in skip:  # programs this kernel refuses (optional ones): not loaded
            b.bpf_program__set_autoload(self._program(name), False)
        if b.bpf_object__load(self._obj) != 0:
            err = _fail("the kernel refused the agent's BPF programs")
            self.close()
            raise err
        self.links: list[int] = []

    def _map(self, name: str) -> int:
        m = lib().bpf_object__find_map_by_name(self._obj, name.encode())
        if not m:
            raise BpfError(f"the BPF object has no map {name!r}")
        return m

    def map_fd(self, name: str) -> int:
        return lib().bpf_map__fd(self._map(name))

    def _program(self, name: str) -> int:
        prog = lib().bpf_object__find_program_by_name(self._obj, name.encode())
        if not prog:
            raise BpfError(f"the BPF object has no program {name!r}")
        return prog

    def attach(self, program: str) -> None:
        """Attach a tracepoint program where its section name says."""
        link = lib().bpf_program__attach(self._program(program))
        if not link:
            raise _fail(f"cannot attach {program}")
        self.links.append(link)

    def attach_uprobe(self, program: str, path: str, offset: int, *, ret: bool, cookie: int = 0, pid: int = -1) -> int:
        """A uprobe (or uretprobe) at *offset* in the file *path*, for one pid or all (-1)."""
        opts = UprobeOpts(ctypes.sizeof(UprobeOpts), 0, cookie, ret, None)
        link = lib().bpf_program__attach_uprobe_opts(self._program(program), pid, path.encode(), offset, opts)
        if not link:
            raise _fail(f"cannot attach {'a uretprobe' if ret else 'a uprobe'} to {path}+{offset:#x}")
        self.links.append(link)
        return link

    def attach_uprobe_multi(
        self, program: str, path: str, offsets: list[int], cookies: list[int], *, ret: bool
    ) -> None:
        """One uprobe-multi link: *program* at every offset of *path*, in every process."""
        n = len(offsets)
        c_path = ctypes.create_string_buffer(path.encode())
        c_offsets = (ctypes.c_uint64 * n)(*offsets)
        c_cookies = (ctypes.c_uint64 * n)(*cookies)
        attr = LinkCreateUprobeMulti(
            prog_fd=lib().bpf_program__fd(self._program(program)),
            attach_type=BPF_TRACE_UPROBE_MULTI,
            path=ctypes.addressof(c_path),
            offsets=ctypes.addressof(c_offsets),
            cookies=ctypes.addressof(c_cookies),
            cnt=n,
            multi_flags=BPF_F_UPROBE_MULTI_RETURN if ret else 0,
        )
        syscall = _libc.syscall
        syscall.restype = ctypes.c_long
        fd = syscall(
            ctypes.c_long(SYS_BPF),
            ctypes.c_long(BPF_LINK_CREATE),
            ctypes.byref(attr),
            ctypes.c_uint(ctypes.sizeof(attr)),
        )
        if fd < 0:
            raise _fail(f"cannot attach {program} to {path} ({n} uprobe{'s' if n > 1 else ''})")
        self.fds.append(fd)

    def detach(self) -> None:
        """Take every probe and tracepoint off, keeping the maps and the ring: no record is added after this
        returns (the kernel waits for running handlers), so what the ring holds can still be read.

        The links go side by side (up to DETACH_THREADS at once): each waits for its own grace period (a
        uprobe's SRCU), about 75 ms, so a dozen links one after the other took 0.7-1.1 s of a stop; together,
        0.15-0.3 s (BENCHMARKS.md)."""
        b = lib()
        undo = [partial(b.bpf_link__destroy, link) for link in getattr(self, "links", [])]
        undo += [partial(os.close, fd) for fd in getattr(self, "fds", [])]
        self.links, self.fds = [], []
        if len(undo) < 2:
            for step in undo:
                step()
            return
        # ctypes and os.close let go of the GIL while the kernel waits
        with ThreadPoolExecutor(min(DETACH_THREADS, len(undo)), thread_name_prefix="gpuflame-detach") as pool:
            for done in [pool.submit(step) for step in undo]:
                done.result()

    def close(self) -> None:
        self.detach()
        b = lib()
        if self._obj:
            b.bpf_object__close(self._obj)
            self._obj = None


class Map:
    """A BPF map by fd, with keys and values as bytes."""

    def __init__(self, fd: int, value_size: int) -> None:
        self.fd = fd
        self.value_size = value_size

    def update(self, key: bytes, value: bytes) -> bool:
        return lib().bpf_map_update_elem(self.fd, key, value, 0) == 0

    def delete(self, key: bytes) -> bool:
        return lib().bpf_map_delete_elem(self.fd, key) == 0

    def lookup(self, key: bytes) -> bytes | None:
        buf = ctypes.create_string_buffer(self.value_size)
        if lib().bpf_map_lookup_elem(self.fd, key, buf) != 0:
            return None
        return buf.raw

    def keys(self, key_size: int, limit: int = 1 << 16) -> list[bytes]:
        """The keys (of *key_size* bytes) the map holds now, at most *limit* (a hash map's order)."""
        out: list[bytes] = []
        key = ctypes.create_string_buffer(key_size)
        prev = None
        while len(out) < limit and lib().bpf_map_get_next_key(self.fd, prev, key) == 0:
            out.append(key.raw)
            prev = ctypes.create_string_buffer(key.raw, key_size)
        return out


def possible_cpus() -> int:
    return max(1, lib().libbpf_num_possible_cpus())


class RingBuffer:
    """The events ring, read through its memory mapping (as libbpf does, without a C callback per record).

    Layout (kernel/bpf/ringbuf.c): the consumer position on the first page
    (ours to write), then the producer position and the data pages, mapped
    twice in a row so that a record wrapping the end reads in one piece. A
    record is an 8-byte header (length, busy and discard bits) and its data,
    8-byte aligned. :meth:`drain` hands the reader the mapping and the
    positions; the reader walks the records itself (stopping at one still
    being written, skipping discarded ones), reading each where it lies,
    and says where it stopped: a Python call per record would cost more
    than booking it. :attr:`more` says records are left.
    """

    BUSY = 1 << 31
    DISCARD = 1 << 30

    def __init__(self, fd: int, size: int, reader: Reader, limit: int = CHUNK_BYTES) -> None:
        page = mmap.PAGESIZE
        self._reader = reader
        self._limit = limit
        self._page = page
        self._mask = size - 1
        self.more = False
        try:
            self._consumer = mmap.mmap(fd, page, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=0)
            self._data = mmap.mmap(fd, page + 2 * size, mmap.MAP_SHARED, mmap.PROT_READ, offset=page)
        except OSError as exc:
            raise BpfError(f"cannot map the events ring buffer: {exc.strerror}") from None
        self._epoll: select.epoll | None = select.epoll()
        self._epoll.register(fd, select.EPOLLIN)

    def wait(self, timeout_ms: int) -> None:
        """Wait up to *timeout_ms* for records (returns at once if some wait)."""
        if timeout_ms and not self.more:
            assert self._epoll is not None, "waited on after close"
            self._epoll.poll(timeout_ms / 1000)

    def drain(self, timeout_ms: int = 0) -> int:
        """:meth:`wait`, then have the reader read up to *limit* bytes of records; how many bytes it read.

        The producer position is read again each time the reader catches up with it, so records written
        meanwhile are read in the same drain."""
        self.wait(timeout_ms)
        start = consumer = POSITION.unpack_from(self._consumer, 0)[0]
        end = start + self._limit
        while consumer < end:
            stop = min(POSITION.unpack_from(self._data, 0)[0], end)
            if consumer >= stop:
                break
            consumer = self._reader(self._data, self._page, self._mask, consumer, stop)
            if consumer < stop:
                break  # a record still being written
        POSITION.pack_into(self._consumer, 0, consumer)  # the space is the producer's again
        self.more = consumer >= end
        return consumer - start

    def left(self, until: float = math.inf) -> tuple[int, bool]:
        """The records not read yet, counted by their headers and not read: (how many, exact).

        Past *until* (monotonic seconds) the rest is estimated from the mean size of the records counted: a
        full ring of small records is 300,000 headers, about 0.1 s to walk, twenty times that for an agent
        given a twentieth of a core."""
        consumer = start = POSITION.unpack_from(self._consumer, 0)[0]
        producer = POSITION.unpack_from(self._data, 0)[0]
        page, mask, flags, n = self._page >> 2, self._mask, self.BUSY | self.DISCARD, 0
        with memoryview(self._data) as raw, raw.cast("I") as words:  # released: the mapping can be closed
            while consumer < producer:
                if not n & 0x1FF and n and time.monotonic() > until:
                    return n + round((producer - consumer) * n / (consumer - start)), False
                word = words[page + ((consumer & mask) >> 2)]
                if word & self.BUSY:
                    return n + 1, True  # still being written (never once the probes are off): not read either
                n += not word & self.DISCARD
                consumer += ((word & ~flags) + 15) & ~7  # the 8-byte header, 8-aligned
        return n, True

    def close(self) -> None:
        if self._epoll is not None:
            self._epoll.close()
            self._consumer.close()
            self._data.close()
            self._epoll = None


POSITION = struct.Struct("<Q")  # the consumer and producer positions


# (ring mapping, offset of its data, position mask, consumer position, stop position) -> the consumer position
# after the records read (at or past stop, or before the first record still being written): a reader of
# RingBuffer.drain; a record's at page + (position & mask)
Reader = Callable[[mmap.mmap, int, int, int, int], int]
