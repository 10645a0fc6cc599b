"""Code objects read from another process's memory, named as in-process capture names them.

The BPF program records (code object address, instruction pointer) per frame;
here they become :class:`~gpuflame.model.Frame` s with the same name
(``co_qualname`` through :func:`display_name`, or qualname recovery from the
source on 3.10), file and line as :mod:`gpuflame.capture.code_frames` gives in
the process itself. A code object lives as long as its function, so it is
read once per process and cached; lines come from its own line table.

The process may be hostile: every read is capped (``MAX_STRING`` characters,
``MAX_LINETABLE`` bytes) and the caches are bounded (:class:`~gpuflame.agent.lru.LRU`:
``CODE_CACHE_BYTES`` of code objects, ``FRAME_CACHE_ENTRIES`` named frames per
process); an entry forgotten is read again while the process lives.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from gpuflame.agent.confined import read_in_root
from gpuflame.agent.events import CodeRecord
from gpuflame.agent.lru import LRU
from gpuflame.model.profile import Frame
from gpuflame.symbols.names import MODULE, display_name
from gpuflame.symbols.source_index import MAX_SOURCE_BYTES, FileIndex, index_source

MAX_STRING = 4096
MAX_LINETABLE = 1 << 18  # a 10,000-line function's table is ~60 KiB
CODE_CACHE_ENTRIES = 1 << 15
CODE_CACHE_BYTES = 16 << 20  # per process: name, file and line table of each code object kept
FRAME_CACHE_ENTRIES = 1 << 16
SOURCES_KEPT = 32  # 3.10: parsed source files, per process
CODE_OVERHEAD = 256  # bytes a cached code object costs besides its strings and table


class Memory:
    """Reads of one process's memory through ``/proc/PID/mem``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)

    def read(self, addr: int, size: int) -> bytes:
        data = os.pread(self._fd, size, addr)
        if len(data) != size:
            raise OSError(f"short read at {addr:#x} in process {self.pid}")
        return data

    def u64(self, addr: int) -> int:
        return int.from_bytes(self.read(addr, 8), "little")

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


@dataclass(frozen=True)
class Code:
    """What naming a frame needs from one code object."""

    name: str
    file: str
    firstlineno: int
    linetable: bytes
    version: str
    adaptive: int  # address of the first instruction (3.11+), 0 on 3.10

    def lasti(self, instr: int) -> int:
        """Byte offset of the running instruction from the frame's raw instruction field."""
        if self.adaptive:
            return instr - self.adaptive
        return instr * 2  # 3.10: f_lasti counts code units

    def line(self, lasti: int) -> int:
        found = line_for(self.linetable, self.firstlineno, lasti, self.version)
        return found if found is not None else self.firstlineno


class CodeReader:
    """Code objects of one process, read once each."""

    def __init__(
        self, memory: Memory, version: str, offsets: dict[str, int], root: str = "", root_when_gone: str = ""
    ) -> None:
        self.memory = memory
        self.version = version
        self.off = offsets
        self.root = root  # /proc/PID/root, to read 3.10 sources as the process sees them
        self.root_when_gone = root_when_gone  # "/" for a process that saw the host's files: read there once gone
        self._codes: LRU[int, Code | None] = LRU(CODE_CACHE_ENTRIES, CODE_CACHE_BYTES, _code_bytes)
        self._frames: LRU[tuple[int, int], tuple[Code | None, Frame]] = LRU(FRAME_CACHE_ENTRIES)
        self._sources: LRU[str, FileIndex | None] = LRU(SOURCES_KEPT)

    def frame(self, code_addr: int, instr: int) -> Frame:
        """The frame of *instr* in the code object at *code_addr* (kept while that object is the one there)."""
        key = (code_addr, instr)
        cached = self._frames.get(key)
        code = self.code(code_addr)
        if cached is not None and cached[0] is code:
            return cached[1]
        frame = self._make(code_addr, code, instr)
        self._frames[key] = (code, frame)
        return frame

    def forget(self, code_addr: int) -> None:
        """The code object at *code_addr* was deallocated: the next one there is read afresh."""
        self._codes.pop(code_addr)

    @staticmethod
    def _make(code_addr: int, code: Code | None, instr: int) -> Frame:
        if code is None:
            return Frame(f"<unreadable code object 0x{code_addr:x}>", kind="synthetic")
        return Frame(code.name, code.file, code.line(code.lasti(instr)))

    def remember(self, r: CodeRecord) -> None:
        """A code object as the BPF side copied it (sent before the first stack holding it).

        Used when complete; a name, file or line table longer than the copy is
        read from memory instead, if the process is still there to read.
        """
        if self._codes.get(r.code) is not None:
            return
        raw_name, name_whole = _decode(r.name, r.name_state, r.name_len)
        file, file_whole = _decode(r.file, r.file_state, r.file_len)
        table = r.table[: r.table_len]
        if not (name_whole and file_whole and len(table) == r.table_len):
            try:
                self._codes[r.code] = self._read_code(r.code)
                return
            except (OSError, ValueError, OverflowError, UnicodeError, struct.error):
                pass  # gone: keep what was copied
        if self.off["code_qualname"] >= 0:
            name = display_name(raw_name)
            adaptive = r.code + self.off["code_adaptive"]
        else:
            name = self._name_from_source(file, r.firstlineno, raw_name)
            adaptive = 0
        self._codes[r.code] = Code(name, file, r.firstlineno, table, self.version, adaptive)

    def code(self, addr: int) -> Code | None:
        if addr in self._codes:
            return self._codes.get(addr)
        try:
            code = self._read_code(addr)
        except (OSError, ValueError, OverflowError, UnicodeError, struct.error):
            code = None
        self._codes[addr] = code
        return code

    @property
    def cached_bytes(self) -> int:
        """What the code objects kept weigh (bounded by CODE_CACHE_BYTES)."""
        return self._codes.weight

    def _read_code(self, addr: int) -> Code | None:
        o, m = self.off, self.memory
        type_addr = m.u64(addr + o["object_type"])
        if self.string_at(m.u64(type_addr + o["type_name"]), 16) != "code":
            return None  # a shim frame's executable, or a stale pointer
        file = self.unicode(m.u64(addr + o["code_filename"]))
        (firstlineno,) = struct.unpack("<i", m.read(addr + o["code_firstlineno"], 4))
        linetable = self.bytes_object(m.u64(addr + o["code_linetable"]))
        if o["code_qualname"] >= 0:
            name = display_name(self.unicode(m.u64(addr + o["code_qualname"])))
            adaptive = addr + o["code_adaptive"]
        else:  # 3.10: no co_qualname; recover it from the source, as in-process capture does
            co_name = self.unicode(m.u64(addr + o["code_name"]))
            name = self._name_from_source(file, firstlineno, co_name)
            adaptive = 0
        return Code(name, file, firstlineno, linetable, self.version, adaptive)

    def _name_from_source(self, file: str, firstlineno: int, co_name: str) -> str:
        """3.10's qualname, recovered from the source as the process sees it: a file named by the process is
        read only inside its root (no link out of it, regular files, capped), once it is gone only if that root
        was the host's; *co_name* where it cannot be read."""
        index = None
        root = self.root if os.path.isdir(self.root) else self.root_when_gone
        if root and file.startswith("/") and co_name != MODULE:
            if file in self._sources:
                index = self._sources.get(file)
            else:
                index = self._sources[file] = _index(read_in_root(root, file, MAX_SOURCE_BYTES + 1))
        return display_name(index.qualname(firstlineno, co_name) if index is not None else co_name)

    def string_at(self, addr: int, limit: int) -> str:
        """A C string (a type's ``tp_name``)."""
        raw = self.memory.read(addr, limit)
        return raw.split(b"\0", 1)[0].decode(errors="replace")

    def unicode(self, addr: int) -> str:
        """A compact ``str`` object: ASCII or 1/2/4 bytes per character."""
        o, m = self.off, self.memory
        length = int.from_bytes(m.read(addr + o["unicode_length"], 8), "little", signed=True)
        (state,) = struct.unpack("<I", m.read(addr + o["unicode_state"], 4))
        kind, compact, ascii_ = (state >> 2) & 7, (state >> 5) & 1, (state >> 6) & 1
        if not compact or not 0 <= length <= MAX_STRING or kind not in (1, 2, 4):
            raise ValueError("not a compact str")
        if ascii_:
            return m.read(addr + o["unicode_ascii_data"], length).decode("ascii")
        raw = m.read(addr + o["unicode_compact_data"], length * kind)
        return raw.decode({1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}[kind])

    def bytes_object(self, addr: int) -> bytes:
        size = int.from_bytes(self.memory.read(addr + self.off["bytes_size"], 8), "little", signed=True)
        if not 0 <= size <= MAX_LINETABLE:
            raise ValueError("not a bytes object")
        return self.memory.read(addr + self.off["bytes_data"], size)


def _index(source: bytes | None) -> FileIndex | None:
    if source is None or len(source) > MAX_SOURCE_BYTES:
        return None
    try:
        return index_source(source)
    except (SyntaxError, ValueError, UnicodeError, MemoryError, RecursionError):
        return None


def _code_bytes(code: Code) -> int:
    return CODE_OVERHEAD + len(code.name) + len(code.file) + len(code.linetable)


def _decode(raw: bytes, state: int, length: int) -> tuple[str, bool]:
    """Characters of a copied str (its state word says ASCII or 1/2/4 bytes each); and whether all were copied."""
    width = 1 if (state >> 6) & 1 else max(1, (state >> 2) & 7)
    need = length * width
    got = min(need, len(raw)) // width * width
    codec = {1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}.get(width, "latin-1")
    return raw[:got].decode(codec, errors="replace"), need <= len(raw)


def line_for(table: bytes, firstlineno: int, lasti: int, version: str) -> int | None:
    """The line of byte offset *lasti*, from ``co_linetable`` (None where the table says no line)."""
    if version == "3.10":
        return _line_310(table, firstlineno, lasti)
    return _line_311(table, firstlineno, lasti)


def _line_310(table: bytes, line: int, lasti: int) -> int | None:
    """3.10's table: (bytes advanced, line delta) pairs; a delta of -128 means no line."""
    end = 0
    current: int | None = line
    for i in range(0, len(table) - 1, 2):
        start, end = end, end + table[i]
        delta = table[i + 1] - 256 if table[i + 1] > 127 else table[i + 1]
        if delta == -128:
            current = None
        else:
            line += delta
            current = line
        if start <= lasti < end:
            return current
    return None


def _line_311(table: bytes, line: int, lasti: int) -> int | None:
    """3.11+'s location table (CPython's Objects/locations.md; 3.14's is the same)."""
    pos, addr, n = 0, 0, len(table)

    def varint() -> int:
        nonlocal pos
        b = table[pos]
        pos += 1
        value, shift = b & 63, 0
        while b & 64:
            b = table[pos]
            pos += 1
            shift += 6
            value |= (b & 63) << shift
        return value

    while pos < n:
        first = table[pos]
        pos += 1
        code, length = (first >> 3) & 15, (first & 7) + 1
        delta: int | None = 0
        if code == 15:
            delta = None
        elif code == 14:
            v = varint()
            delta = -(v >> 1) if v & 1 else v >> 1
            varint(), varint(), varint()
        elif code == 13:
            v = varint()
            delta = -(v >> 1) if v & 1 else v >> 1
        elif code >= 10:
            delta = code - 10
            pos += 2
        else:
            pos += 1
        if delta is not None:
            line += delta
        end = addr + length * 2
        if addr <= lasti < end:
            return line if delta is not None else None
        addr = end
    return None
