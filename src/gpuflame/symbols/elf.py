"""The one ELF reader: headers, sections, symbol tables and their names, from a memory-mapped 64-bit file.

Two readers of ELF files share it: the node agent (``agent/elf.py``: uprobe
offsets, ``_PyRuntime``, native frames of other processes; every count
bounded, since a target's files may be crafted) and the torch allocator
hook's native names (``capture/recorders/allocator/native/elf_symbols.py``,
inside the profiled process). Standard library only (``struct``, ``mmap``,
``array``): the profiled process and the agent import it, and neither may
need numpy. Only 64-bit little-endian files are read; anything else is
:class:`ElfError` (a ``ValueError``).
"""

from __future__ import annotations

import bisect
import mmap
import struct
import sys
from array import array

PT_LOAD = 1
PT_GNU_EH_FRAME = 0x6474E550
PF_X = 1
SHT_SYMTAB = 2
SHT_RELA = 4
SHT_DYNSYM = 11
STT_FUNC = 2
STT_OBJECT = 1
SYM_BYTES = 24  # Elf64_Sym: name u32, info u8, other u8, shndx u16, value u64, size u64
PAGE = 4096

ProgramHeader = tuple[int, int, int, int, int, int, int]  # type, flags, offset, vaddr, paddr, filesz, memsz
# name, type, flags, addr, offset, size, link, info, addralign, entsize
SectionHeader = tuple[int, int, int, int, int, int, int, int, int, int]


class ElfError(ValueError):
    """Not a 64-bit little-endian ELF file, or one cut short."""


def is_elf64le(data: mmap.mmap | bytes) -> bool:
    """Whether *data* starts as a 64-bit little-endian ELF file (the only kind read here)."""
    return data[:4] == b"\x7fELF" and len(data) > 5 and data[4] == 2 and data[5] == 1


def program_headers(data: mmap.mmap) -> list[ProgramHeader]:
    """Every program header (segment) of the file."""
    (phoff,) = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    return [struct.unpack_from("<IIQQQQQ", data, phoff + i * phentsize) for i in range(phnum)]


def section_headers(data: mmap.mmap) -> list[SectionHeader]:
    """Every section header of the file."""
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    return [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]


def c_string(data: mmap.mmap, start: int, end: int) -> str | None:
    """The NUL-terminated string at *start* that ends before *end*; None when no NUL comes first."""
    stop = data.find(b"\0", start, end)
    return None if stop < 0 else data[start:stop].decode("utf-8", "replace")


def first_load_vaddr(headers: list[ProgramHeader]) -> int | None:
    """The page-aligned address of the segment mapped from the file's start (what the load bias is taken from)."""
    return next((h[3] & ~(PAGE - 1) for h in headers if h[0] == PT_LOAD and h[2] == 0), None)


class FunctionTable:
    """The function symbols of one symbol table, sorted by address; a name is read only when asked for.

    Built for tables of half a million entries (``libtorch_cpu.so``'s
    ``.symtab``): three flat arrays, no object per symbol, and the string
    table stays in the mapping.
    """

    def __init__(self, data: mmap.mmap, symtab: SectionHeader, strtab: SectionHeader) -> None:
        self._data = data
        self._strings = (strtab[4], strtab[4] + strtab[5])
        heads, values, sizes = _columns(data, symtab[4], symtab[5] // SYM_BYTES)
        funcs = [i for i, head in enumerate(heads) if (head >> 32) & 0xF == STT_FUNC and values[i]]
        funcs.sort(key=values.__getitem__)
        self.starts = array("Q", [values[i] for i in funcs])
        self.ends = array("Q", [values[i] + max(sizes[i], 1) for i in funcs])
        self._names = array("Q", [heads[i] & 0xFFFFFFFF for i in funcs])

    def __len__(self) -> int:
        return len(self.starts)

    def name(self, vaddr: int) -> str | None:
        """The name of the function whose bytes hold *vaddr*, or None."""
        i = bisect.bisect_right(self.starts, vaddr) - 1
        if i < 0 or vaddr >= self.ends[i]:
            return None
        first, end = self._strings
        return c_string(self._data, first + self._names[i], end) or None


def _columns(data: mmap.mmap, offset: int, count: int) -> tuple[list[int], list[int], list[int]]:
    """A symbol table's entries as three columns: (name | info << 32 | ...), value, size.

    An entry is three little-endian 64-bit words; read as such in C where
    this machine is little-endian (10x faster than one unpack per entry).
    """
    if offset + count * SYM_BYTES > len(data):
        raise ElfError("symbol table runs past the end of the file")
    if sys.byteorder == "little":
        with memoryview(data) as whole, whole[offset : offset + count * SYM_BYTES] as raw, raw.cast("Q") as words:
            return words[0::3].tolist(), words[1::3].tolist(), words[2::3].tolist()
    rows = list(struct.iter_unpack("<QQQ", data[offset : offset + count * SYM_BYTES]))
    return [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]


def function_table(data: mmap.mmap, kind: int = SHT_SYMTAB) -> FunctionTable | None:
    """The functions of the file's first table of *kind* (``.symtab``: every function, exported or not)."""
    sections = section_headers(data)
    for sh in sections:
        if sh[1] == kind and sh[9] in (0, SYM_BYTES) and 0 <= sh[6] < len(sections):
            return FunctionTable(data, sh, sections[sh[6]])
    return None
