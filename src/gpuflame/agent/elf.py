"""What the agent needs from ELF files: symbols, their file offsets, and names for addresses.

Uprobes are placed by file offset, ``_PyRuntime`` is found by its symbol, and
native frames are named from the symbol tables (``.symtab`` where the file
has one, else ``.dynsym``). Standard library only: the agent runs where
pyelftools may not be installed.
"""

from __future__ import annotations

import bisect
import mmap
import struct
from dataclasses import dataclass, field

PT_LOAD = 1
PF_X = 1
SHT_SYMTAB = 2
SHT_DYNSYM = 11
STT_FUNC = 2
STT_OBJECT = 1


class ElfError(ValueError):
    """Not a 64-bit little-endian ELF file, or one cut short."""


@dataclass
class Segment:
    vaddr: int
    offset: int
    filesz: int
    memsz: int
    flags: int


@dataclass
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


def read_elf(path: str, full: bool = True) -> ElfFile:
    """Parse *path* (only ``.dynsym`` unless *full*: fast, for the exported symbols); raises OSError or ElfError."""
    with open(path, "rb") as f:
        try:
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError as exc:  # an empty file
            raise ElfError(f"{path}: not an ELF file") from exc
    with data:
        if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
            raise ElfError(f"{path}: not a 64-bit little-endian ELF file")
        try:
            return _parse(path, data, (SHT_DYNSYM, SHT_SYMTAB) if full else (SHT_DYNSYM,))
        except (struct.error, ValueError, IndexError) as exc:
            raise ElfError(f"{path}: truncated or damaged ELF file") from exc


def _parse(path: str, data: mmap.mmap, tables: tuple[int, ...]) -> ElfFile:
    (phoff, shoff) = struct.unpack_from("<QQ", data, 0x20)
    (phentsize, phnum, shentsize, shnum) = struct.unpack_from("<HHHH", data, 0x36)
    segments = []
    for i in range(phnum):
        p_type, p_flags, p_offset, p_vaddr, _paddr, p_filesz, p_memsz = struct.unpack_from(
            "<IIQQQQQ", data, phoff + i * phentsize
        )
        if p_type == PT_LOAD:
            segments.append(Segment(p_vaddr, p_offset, p_filesz, p_memsz, p_flags))
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    symbols: dict[str, Symbol] = {}
    # .dynsym first, .symtab second: the full table wins where both name a symbol
    for wanted in tables:
        for sh in sections:
            if sh[1] != wanted:
                continue
            strtab = sections[sh[6]]
            str_off, str_size = strtab[4], strtab[5]
            for off in range(sh[4], sh[4] + sh[5], sh[9] or 24):
                st_name, st_info, _other, st_shndx, st_value, st_size = struct.unpack_from("<IBBHQQ", data, off)
                if not st_name or st_shndx == 0:
                    continue
                end = data.find(b"\0", str_off + st_name, str_off + str_size)
                if end < 0:
                    continue
                name = data[str_off + st_name : end].decode(errors="replace")
                symbols[name] = Symbol(name, st_value, st_size, st_info & 0xF)
    return ElfFile(path, segments, symbols)


def read_at(path: str, elf: ElfFile, vaddr: int, size: int) -> bytes:
    """*size* bytes of the file's initialised data at *vaddr* (a constant such as ``Py_Version``)."""
    with open(path, "rb") as f:
        f.seek(elf.file_offset(vaddr))
        return f.read(size)
