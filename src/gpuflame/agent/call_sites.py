"""Return sites for entry-only probes, verified in the file itself before a probe goes there.

The BPF side reports where a driver call returns to as it finds it on the
calling thread's stack: a value the process controls (``push X; jmp
cuMemAlloc``). A uprobe sits on a file's inode, in every process that maps
the file, so a site taken on trust would let any process plant a breakpoint
in any byte of any file it maps (libc, a neighbour's binary). A site is
probed only when, in the very file mapped there (opened through
``/proc/PID/map_files``, or inside the process's root with its device and
inode checked against the mapping), decoding from the start of its function
(``.eh_frame_hdr``) ends an instruction exactly at the site, that
instruction is a call, and a direct call targets a driver function (itself,
or the PLT stub whose GOT slot is bound to it). An indirect call's target is
only known at run time; its site is still an instruction boundary right
after a call, where a probe changes nothing but costs a breakpoint.
Whatever cannot be verified is not probed: its results are read at the
thread's next driver call, or counted as unknown.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass

from gpuflame.agent import procs, x86
from gpuflame.agent.elf import PF_X, ElfError, ElfFile, read_elf
from gpuflame.agent.events import ALLOCS, FREES, INIT, VMM
from gpuflame.agent.lru import LRU

DRIVER_FUNCTIONS = frozenset((*ALLOCS, *FREES, *VMM, INIT))
MAX_FUNCTION_BYTES = 1 << 16  # decoded from a function's start to the site; a longer function is not probed
MAX_SITES = 256  # return sites probed in all (each costs a breakpoint in every process mapping its file)
FILES_KEPT = 16  # parsed files remembered (by device, inode and modification time)
ENDBR64, BND = b"\xf3\x0f\x1e\xfa", 0xF2


@dataclass
class Site:
    """A verified return site: an open fd of the mapped file (probe it as ``/proc/self/fd/N``) and the offset."""

    fd: int
    offset: int
    key: tuple[int, int, int]  # (device, inode, offset)
    shown: str  # the path as the process sees it, for messages

    @property
    def path(self) -> str:
        return f"/proc/self/fd/{self.fd}"

    def close(self) -> None:
        os.close(self.fd)


class Verifier:
    """Checks return addresses; keeps the last few parsed files."""

    def __init__(self) -> None:
        self._files: LRU[tuple[int, int, int], ElfFile] = LRU(FILES_KEPT)

    def site(self, pid: int, addr: int) -> Site | str:
        """The file and offset to probe for return address *addr* of *pid*, or why it is not probed."""
        m = next((m for m in procs.maps(pid) if m.start <= addr < m.end), None)
        if m is None or "x" not in m.perms:
            return "not in code mapped from a file"
        try:
            fd = _open_mapped(pid, m)
        except OSError:
            return "its file cannot be opened as the one mapped"
        offset = addr - m.start + m.offset
        try:
            st = os.fstat(fd)
            why = self._verify(fd, (st.st_dev, st.st_ino, st.st_mtime_ns), offset)
        except (OSError, ElfError, ValueError, struct.error) as exc:
            why = f"its file cannot be read ({exc})"
        if why:
            os.close(fd)
            return why
        return Site(fd, offset, (st.st_dev, st.st_ino, offset), m.path)

    def _elf(self, fd: int, key: tuple[int, int, int]) -> ElfFile:
        elf = self._files.get(key)
        if elf is None:
            elf = self._files[key] = read_elf(
                f"/proc/self/fd/{fd}", full=False, wanted=DRIVER_FUNCTIONS, slot_names=DRIVER_FUNCTIONS
            )
        return elf

    def _verify(self, fd: int, key: tuple[int, int, int], offset: int) -> str | None:
        """Why the instruction at file *offset* is not a verified return site from the driver (None: it is)."""
        elf = self._elf(fd, key)
        vaddr = elf.vaddr_of_offset(offset)
        segment = next((s for s in elf.segments if vaddr is not None and s.vaddr <= vaddr < s.vaddr + s.filesz), None)
        if vaddr is None or segment is None or not segment.flags & PF_X:
            return "not in the file's code"
        with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as data:
            start = _function_start(data, elf, vaddr - 1)
            if start is None or not segment.vaddr <= start < vaddr or vaddr - start > MAX_FUNCTION_BYTES:
                return "its function's start is not known"
            code = data[offset - (vaddr - start) : offset]
            call = _last_instruction(code)
            if call is None:
                return "not at an instruction boundary"
            kind = x86.call_at(code, call, len(code) - call)
            if kind is None:
                return "not right after a call"
            if kind == "direct":
                target = vaddr + int.from_bytes(code[-4:], "little", signed=True)
                if not _calls_driver(data, elf, target):
                    return "right after a call to another function"
        return None


def _open_mapped(pid: int, m: procs.Mapping) -> int:
    """The file mapped at *m*, read-only; found by its path (no map_files), it must be the same file."""
    fd, exact = procs.open_mapped(pid, m)
    if not exact and not procs.is_mapped(os.fstat(fd), m):
        os.close(fd)
        raise OSError(f"{m.path} is not the file mapped")
    return fd


def _last_instruction(code: bytes) -> int | None:
    """Where the last instruction starts, decoding from the start; None unless one ends exactly at the end."""
    pos, last = 0, None
    while pos < len(code):
        size = x86.length(code, pos)
        if size is None:
            return None
        last, pos = pos, pos + size
    return last if pos == len(code) else None


def _function_start(data: mmap.mmap, elf: ElfFile, vaddr: int) -> int | None:
    """The start of the function holding *vaddr*, from ``.eh_frame_hdr``'s sorted table (the usual encodings)."""
    hdr = elf.eh_frame_hdr
    if hdr is None:
        return None
    version, ptr_enc, count_enc, table_enc = data[hdr.offset : hdr.offset + 4]
    ptr_size = {3: 4, 0xB: 4, 4: 8, 0xC: 8}.get(ptr_enc & 0xF)
    if version != 1 or ptr_size is None or count_enc != 0x03 or table_enc != 0x3B:
        return None
    table = hdr.offset + 4 + ptr_size + 4
    (count,) = struct.unpack_from("<I", data, table - 4)
    count = min(count, max(0, hdr.offset + hdr.filesz - table) // 8)
    lo, hi = 0, count
    while lo < hi:  # the last entry starting at or before vaddr
        mid = (lo + hi) // 2
        if hdr.vaddr + struct.unpack_from("<i", data, table + 8 * mid)[0] <= vaddr:
            lo = mid + 1
        else:
            hi = mid
    return None if lo == 0 else hdr.vaddr + struct.unpack_from("<i", data, table + 8 * (lo - 1))[0]


def _calls_driver(data: mmap.mmap, elf: ElfFile, target: int) -> bool:
    """*target* is a driver function of this file, or a PLT stub jumping through a GOT slot bound to one."""
    if any(sym.value == target for sym in elf.symbols.values()):
        return True
    try:
        at = elf.file_offset(target)
    except ElfError:
        return False
    stub = data[at : at + 16]
    pos = len(ENDBR64) if stub.startswith(ENDBR64) else 0
    pos += stub[pos : pos + 1] == bytes([BND])
    if stub[pos : pos + 2] != b"\xff\x25" or len(stub) < pos + 6:
        return False
    slot = target + pos + 6 + int.from_bytes(stub[pos + 2 : pos + 6], "little", signed=True)
    return slot in elf.slots
