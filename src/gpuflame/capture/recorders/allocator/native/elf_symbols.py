"""Names for native return addresses that ``dladdr`` cannot name, from the library's ``.symtab``.

``dladdr`` reads only the dynamic symbols, so a function that is not
exported (PyTorch's ``wrapper_CPU__empty_memory_format`` and the other
kernels registered from an anonymous namespace) comes back nameless and
would be drawn as a bare address. Release builds of PyTorch keep the full
symbol table, which names them: it is read here, once per library and only
when an address needs it (``libtorch_cpu.so``'s table is 13 MB of entries
over a 76 MB string table, which is memory-mapped, not read).

Nothing here raises: a library without a ``.symtab`` (stripped), a 32-bit or
big-endian one, or one this process has not mapped leaves the address
unnamed, and the frame keeps the address as its name, as the AKS flame-graph
reading guide shows native code with no symbol.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import re
import struct
from functools import lru_cache

from gpuflame.symbols.elf import ElfError, FunctionTable, first_load_vaddr, function_table, is_elf64le, program_headers


class LibrarySymbols:
    """The function symbols of one mapped library (``symbols/elf.py``'s table) and its load bias."""

    def __init__(self, path: str, bias: int, table: FunctionTable, data: mmap.mmap) -> None:
        self.path = path
        self.bias = bias
        self._table = table
        self._data = data  # the mapping the names are read from, kept open

    def name(self, address: int) -> str | None:
        """The mangled name of the function holding return address *address*, if the table has it."""
        return self._table.name(address - 1 - self.bias)  # a return address points after the call


def name_of(address: int, library: str) -> str | None:
    """The demangled name of *address* in *library* (a path ``dladdr`` gave), or None."""
    if not library:
        return None
    try:
        symbols = _symbols(os.path.realpath(library))
        mangled = symbols.name(address) if symbols is not None else None
        return without_template_arguments(_CLONE.sub("", demangle(mangled))) if mangled else None
    except Exception:  # a name is a nicety: never a failure of the profile that asked for it
        return None


# what GCC adds to local copies and ABI variants: `f(int) [clone .constprop.0]`, `name[abi:cxx11]`
_CLONE = re.compile(r"( \[clone [^\]]*\])+$|\[abi:[^\]]*\]")


def without_template_arguments(name: str) -> str:
    """``wrap_kernel_functor_unboxed_<...3 lines of types...>::call`` -> ``wrap_kernel_functor_unboxed_<…>::call``.

    The kernels PyTorch registers are template instances whose arguments run
    to hundreds of characters: too long for any bar, and the frames around
    them (``at::_ops::zeros::call``) already say which operation it is.
    """
    if "<" not in name or "operator" in name:
        return name
    out: list[str] = []
    depth = 0
    for ch in name:
        if ch == "<":
            if depth == 0:
                out.append("<…>")
            depth += 1
        elif ch == ">" and depth:
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out) if depth == 0 else name


@lru_cache(maxsize=32)
def _symbols(path: str) -> LibrarySymbols | None:
    bias = _load_bias(path)
    if bias is None:
        return None
    try:
        return _read(path, bias)
    except (OSError, ElfError, ValueError, struct.error, IndexError):
        return None


def _read(path: str, start: int) -> LibrarySymbols | None:
    with open(path, "rb") as f:
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        first_load = first_load_vaddr(program_headers(data)) if is_elf64le(data) else None
        table = function_table(data) if first_load is not None else None
    except (ValueError, struct.error, IndexError):
        table = None
    if table is None or first_load is None:  # not 64-bit little-endian, no offset-0 segment, or stripped
        data.close()
        return None
    return LibrarySymbols(path, start - first_load, table, data)


def _load_bias(path: str) -> int | None:
    """Where this process mapped the start of *path* (its offset-0 mapping), from /proc/self/maps."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                parts = line.split(maxsplit=5)
                if len(parts) == 6 and parts[5].strip() == path and int(parts[2], 16) == 0:
                    return int(parts[0].split("-", 1)[0], 16)
    except OSError:
        return None
    return None


@lru_cache(maxsize=1)
def _cxa_demangle() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    name = ctypes.util.find_library("stdc++") or "libstdc++.so.6"
    try:
        fn = ctypes.CDLL(name).__cxa_demangle
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_void_p
    fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
    return fn


def demangle(mangled: str) -> str:
    """``_ZN2at6native9empty_cpuE...`` -> ``at::native::empty_cpu(...)``; the name itself if not C++."""
    fn = _cxa_demangle()
    if fn is None or not mangled.startswith("_Z"):
        return mangled
    status = ctypes.c_int(0)
    out = fn(mangled.encode("utf-8", "replace"), None, None, ctypes.byref(status))
    if not out or status.value != 0:
        return mangled
    try:
        return ctypes.string_at(out).decode("utf-8", "replace")
    finally:
        ctypes.CDLL(None).free(ctypes.c_void_p(out))
