"""What the agent needs from ELF files: symbols, their file offsets, and names for addresses.

Uprobes are placed by file offset, ``_PyRuntime`` is found by its symbol, and
native frames are named from the symbol tables (``.symtab`` where the file
has one, else ``.dynsym``). Standard library only: the agent runs where
pyelftools may not be installed. The headers, sections and names are read
by ``symbols/elf.py``, the ELF reader the in-process native names share.

Any file a process maps may be crafted (a container's own ``libcuda.so.1``),
so every read is bounded: regular files only, opened non-blocking; at most
``MAX_SYMBOLS`` symbols per table and ``MAX_NAME`` bytes per name (a string
table without its NULs made each lookup scan to the end: quadratic), and a
caller that needs a few symbols names them (*wanted*) so only those are kept.
"""

from __future__ import annotations

import bisect
import mmap
import os
import struct
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field

from gpuflame.agent.confined import open_regular
from gpuflame.symbols.elf import (  # noqa: F401 - PF_X, STT_OBJECT: the agent's names for them
    PF_X,
    PT_GNU_EH_FRAME,
    PT_LOAD,
    SHT_DYNSYM,
    SHT_RELA,
    SHT_SYMTAB,
    STT_FUNC,
    STT_OBJECT,
    SYM_BYTES,
    ElfError,
    SectionHeader,
    c_string,
    is_elf64le,
    program_headers,
    section_headers,
)

R_X86_64_GLOB_DAT, R_X86_64_JUMP_SLOT, R_X86_64_RELATIVE = 6, 7, 8
RELA_BYTES = 24
MAX_SYMBOLS = 1 << 17  # per table: libtorch's .dynsym has ~100k; a crafted 16 MB one 700k
MAX_NAME = 4096  # bytes of one symbol name (long C++ names fit)
MAX_RELOCATIONS = 1 << 18


@dataclass
class Segment:
    vaddr: int
    offset: int
    filesz: int
    memsz: int
    flags: int


@dataclass(slots=True)
class Symbol:
    name: str
    value: int
    size: int
    kind: int


@dataclass
class ElfFile:
    """The segments and symbols of one ELF file."""

    path: str
    segments: list[Segment]
    symbols: dict[str, Symbol]
    eh_frame_hdr: Segment | None = None  # the sorted table of every function's start (.eh_frame_hdr)
    slots: dict[int, str] = field(default_factory=dict)  # GOT slot address -> the symbol it is bound to
    _sorted: list[Symbol] = field(default_factory=list, repr=False)
    _starts: list[int] = field(default_factory=list, repr=False)

    def file_offset(self, vaddr: int) -> int:
        """The file offset of virtual address *vaddr* (what a uprobe is placed by)."""
        for s in self.segments:
            if s.vaddr <= vaddr < s.vaddr + s.filesz:
                return vaddr - s.vaddr + s.offset
        raise ElfError(f"{self.path}: address {vaddr:#x} is in no loaded segment")

    def vaddr_of_offset(self, offset: int) -> int | None:
        for s in self.segments:
            if s.offset <= offset < s.offset + max(s.filesz, 1):
                return offset - s.offset + s.vaddr
        return None

    def function_at(self, vaddr: int) -> Symbol | None:
        """The function symbol holding *vaddr*, or None."""
        if not self._sorted:
            funcs = sorted((s for s in self.symbols.values() if s.kind == STT_FUNC and s.value), key=lambda s: s.value)
            self._sorted = funcs
            self._starts = [s.value for s in funcs]
        i = bisect.bisect_right(self._starts, vaddr) - 1
        if i < 0:
            return None
        sym = self._sorted[i]
        if vaddr < sym.value + max(sym.size, 1) or (sym.size == 0 and i + 1 == len(self._sorted)):
            return sym
        return None


def read_elf(
    path: str, full: bool = True, wanted: Collection[str] | None = None, slot_names: Collection[str] = ()
) -> ElfFile:
    """Parse *path* (only ``.dynsym`` unless *full*: fast, for the exported symbols); raises OSError or ElfError.

    *wanted*: keep only these symbols; *slot_names*: the GOT slots bound to these symbols, too.
    """
    fd = open_regular(path)
    try:
        data = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    except ValueError as exc:  # an empty file
        raise ElfError(f"{path}: not an ELF file") from exc
    finally:
        os.close(fd)
    with data:
        if not is_elf64le(data):
            raise ElfError(f"{path}: not a 64-bit little-endian ELF file")
        try:
            return _parse(path, data, (SHT_DYNSYM, SHT_SYMTAB) if full else (SHT_DYNSYM,), wanted, slot_names)
        except (struct.error, ValueError, IndexError) as exc:
            raise ElfError(f"{path}: truncated or damaged ELF file") from exc


def _parse(
    path: str, data: mmap.mmap, tables: tuple[int, ...], wanted: Collection[str] | None, slot_names: Collection[str]
) -> ElfFile:
    segments, eh_frame_hdr = [], None
    for p_type, p_flags, p_offset, p_vaddr, _paddr, p_filesz, p_memsz in program_headers(data):
        if p_type == PT_LOAD:
            segments.append(Segment(p_vaddr, p_offset, p_filesz, p_memsz, p_flags))
        elif p_type == PT_GNU_EH_FRAME:
            eh_frame_hdr = Segment(p_vaddr, p_offset, p_filesz, p_memsz, p_flags)
    sections = section_headers(data)
    symbols: dict[str, Symbol] = {}
    # .dynsym first, .symtab second: the full table wins where both name a symbol
    for wanted_table in tables:
        for sh in sections:
            if sh[1] == wanted_table:
                for sym in _symbols(data, sh, sections):
                    if wanted is None or sym.name in wanted:
                        symbols[sym.name] = sym
    out = ElfFile(path, segments, symbols, eh_frame_hdr)
    if slot_names:
        out.slots = _slots(data, sections, slot_names)
    return out


def _symbols(data: mmap.mmap, sh: SectionHeader, sections: list[SectionHeader]) -> Iterator[Symbol]:
    """The named, defined symbols of one table (at most MAX_SYMBOLS)."""
    if sh[9] not in (0, SYM_BYTES):
        return
    strtab = sections[sh[6]]
    for i in range(min(sh[5] // SYM_BYTES, MAX_SYMBOLS)):
        st_name, st_info, _other, st_shndx, st_value, st_size = struct.unpack_from("<IBBHQQ", data, sh[4] + i * 24)
        if st_name and st_shndx:
            name = _name(data, strtab, st_name)
            if name is not None:
                yield Symbol(name, st_value, st_size, st_info & 0xF)


def _name(data: mmap.mmap, strtab: SectionHeader, index: int) -> str | None:
    """A NUL-terminated name of a string table, None where it runs past MAX_NAME or the table."""
    start, end = strtab[4] + index, strtab[4] + strtab[5]
    return c_string(data, start, min(end, start + MAX_NAME))


def _slots(data: mmap.mmap, sections: list[SectionHeader], names: Collection[str]) -> dict[int, str]:
    """GOT slot -> symbol name, for the relocations that bind a slot to one of *names* (PLT calls)."""
    out: dict[int, str] = {}
    for sh in sections:
        if sh[1] != SHT_RELA or sh[9] not in (0, RELA_BYTES) or not 0 < sh[6] < len(sections):
            continue
        symtab = sections[sh[6]]
        if symtab[1] != SHT_DYNSYM or not 0 <= symtab[6] < len(sections):
            continue
        for i in range(min(sh[5] // RELA_BYTES, MAX_RELOCATIONS)):
            r_offset, r_info = struct.unpack_from("<QQ", data, sh[4] + i * RELA_BYTES)
            index = r_info >> 32
            if r_info & 0xFFFFFFFF in (R_X86_64_GLOB_DAT, R_X86_64_JUMP_SLOT) and index < symtab[5] // SYM_BYTES:
                st_name = struct.unpack_from("<I", data, symtab[4] + index * SYM_BYTES)[0]
                name = _name(data, sections[symtab[6]], st_name)
                if name is not None and name in names:
                    out[r_offset] = name
    return out


def pointer_at(path: str, elf: ElfFile, vaddr: int) -> int | None:
    """The address a pointer at *vaddr* holds once loaded (a static table's function pointer, such as a
    type's ``tp_dealloc``): its R_X86_64_RELATIVE relocation's addend, else the file's own 8 bytes."""
    fd = open_regular(path)
    try:
        data = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)
    with data:
        try:
            (shoff,) = struct.unpack_from("<Q", data, 0x28)
            (shentsize, shnum) = struct.unpack_from("<HH", data, 0x3A)
            for i in range(shnum):
                sh = struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
                if sh[1] != SHT_RELA or sh[9] not in (0, RELA_BYTES):
                    continue
                for k in range(min(sh[5] // RELA_BYTES, MAX_RELOCATIONS)):
                    r_offset, r_info, addend = struct.unpack_from("<QQq", data, sh[4] + k * RELA_BYTES)
                    if r_offset == vaddr and r_info & 0xFFFFFFFF == R_X86_64_RELATIVE:
                        return addend
            return struct.unpack_from("<Q", data, elf.file_offset(vaddr))[0] or None
        except (struct.error, ValueError, IndexError, ElfError):
            return None


def read_at(path: str, elf: ElfFile, vaddr: int, size: int) -> bytes:
    """*size* bytes of the file's initialised data at *vaddr* (a constant such as ``Py_Version``)."""
    fd = open_regular(path)
    try:
        return os.pread(fd, size, elf.file_offset(vaddr))
    finally:
        os.close(fd)
