"""One watched process: what the BPF side is told about it, and how its frames are named."""

from __future__ import annotations

import bisect

from gpuflame.agent import procs, py_layout
from gpuflame.agent.elf import ElfFile
from gpuflame.agent.events import P_NATIVE, proc_value
from gpuflame.agent.lru import LRU
from gpuflame.agent.pyremote import CodeReader, Memory
from gpuflame.model.profile import NATIVE, Frame
from gpuflame.symbols.names import native_address_name

# native frames from these files are the interpreter itself: the Python frames stand for them
_INTERPRETER = ("libpython", "/python")
NATIVE_NAMES_KEPT = 1 << 16  # native frames named, per process


class Process:
    """A process the agent watches: its interpreter (if any), its code objects, its mappings."""

    def __init__(self, pid: int, native: bool) -> None:
        self.pid = pid
        self.comm = procs.comm(pid)
        self.native = native
        self.interpreter = procs.interpreter(pid)
        self.unverified = ""  # why its CPython is not walked although its version has offsets (py_layout)
        self.provisional = False  # caught before its first thread: the layout is to be checked again
        self.offsets: dict[str, int] = {}  # what its CPython is walked with (py_layout.offsets_for)
        self.reader = self._reader(pid)
        self._maps: list[procs.Mapping] = []
        self._starts: list[int] = []
        self._native_names: LRU[int, Frame] = LRU(NATIVE_NAMES_KEPT)
        self._shared = False  # the reader is the parent's (forked)

    def _reader(self, pid: int) -> CodeReader | None:
        """The code-object reader, once the process's CPython has read back as its offsets say (py_layout)."""
        interp = self.interpreter
        if interp is None or not procs.supported(interp.version):
            return None
        try:
            memory = Memory(pid)
        except OSError:
            return None  # it ended between reading its maps and opening its memory (a fork child: the parent's)
        offsets = py_layout.build_refused(interp.abiflags, interp.version) or py_layout.offsets_for(
            interp.version, interp.runtime, memory
        )
        if isinstance(offsets, str):
            why: str | None = offsets
        else:
            try:
                why = py_layout.check(pid, offsets, interp.runtime, memory)
            except py_layout.NotReady:
                why, self.provisional = None, True
        if why or isinstance(offsets, str):
            self.unverified = why or ""
            memory.close()
            return None
        self.offsets = offsets
        return CodeReader(
            memory,
            interp.version,
            offsets,
            root=f"/proc/{pid}/root",
            root_when_gone="/" if procs.sees_host_files(pid) else "",
        )

    def recheck(self) -> None:
        """Check a provisional layout again (the interpreter may have made its first thread by now)."""
        if not self.provisional or self.reader is None or self.interpreter is None:
            return
        try:
            why = py_layout.check(self.pid, self.offsets, self.interpreter.runtime, self.reader.memory)
        except py_layout.NotReady:
            return
        self.provisional = False
        self.unverified = why or ""

    def refuse(self, why: str) -> None:
        """Stop walking this process's Python: *why* its layout is not trusted."""
        self.provisional = False
        self.unverified = why
        if self.reader is not None and not self._shared:
            self.reader.memory.close()
        self.reader = None

    @classmethod
    def forked(cls, pid: int, parent: Process) -> Process:
        """A fork child: read as itself while it lives; if it is already gone, through its parent.

        Its code objects from before the fork sit at the same addresses in
        both (the child's memory is a copy), so its first events keep their names.
        """
        child = cls(pid, parent.native)
        if parent.python and not child.python:
            child.interpreter, child.reader, child._shared = parent.interpreter, parent.reader, True
            child.offsets = parent.offsets
            child.comm = child.comm or parent.comm
        return child

    @property
    def python(self) -> bool:
        return self.reader is not None

    @property
    def version(self) -> str:
        return self.interpreter.version if self.interpreter else ""

    def bpf_value(self) -> bytes:
        """The ``struct proc`` the BPF program reads for this process."""
        flags = P_NATIVE if (self.native or not self.python) else 0
        if self.reader is None or self.interpreter is None:
            return proc_value(0, flags, None)
        return proc_value(self.interpreter.runtime, flags, self.offsets)

    def python_frame(self, code: int, instr: int) -> Frame:
        assert self.reader is not None
        return self.reader.frame(code, instr)

    def native_frames(self, addresses: tuple[int, ...], above_python: bool = False) -> list[Frame]:
        """Native frames, leaf first, up to where the frame-pointer chain leaves code.

        Code built without frame pointers (libffi, most of glibc) ends the
        chain in a stack or data address: what follows is not a caller. With
        *above_python*, only the frames above the interpreter (its Python
        frames stand for it).
        """
        out = []
        for addr in addresses:
            m = self._mapping(addr)
            if m is None or "x" not in m.perms:
                break
            frame = self.native_frame(addr)
            if above_python and any(tag in frame.file for tag in _INTERPRETER):
                break
            out.append(frame)
        return out

    def native_frame(self, addr: int) -> Frame:
        frame = self._native_names.get(addr)
        if frame is None:
            frame = self._native_names[addr] = self._symbolize(addr)
        return frame

    def _symbolize(self, addr: int) -> Frame:
        """The ELF symbol holding *addr*; else the raw address with its module, as the AKS guide shows them."""
        m = self._mapping(addr)
        if m is None:
            return Frame(native_address_name(addr), kind=NATIVE)
        elf = procs.mapped_elf(self.pid, m, full=True)
        if elf is not None:
            vaddr = self._file_vaddr(elf, m, addr)
            sym = elf.function_at(vaddr) if vaddr is not None else None
            if sym is not None:
                return Frame(sym.name, m.path, 0, NATIVE)
        return Frame(native_address_name(addr), m.path, 0, NATIVE)

    @staticmethod
    def _file_vaddr(elf: ElfFile, m: procs.Mapping, addr: int) -> int | None:
        base = elf.vaddr_of_offset(m.offset)
        return None if base is None else addr - m.start + base

    def _mapping(self, addr: int) -> procs.Mapping | None:
        for attempt in range(2):
            i = bisect.bisect_right(self._starts, addr) - 1
            if i >= 0 and addr < self._maps[i].end:
                return self._maps[i]
            if attempt == 0:  # a library loaded since we last looked
                self._maps = sorted(procs.maps(self.pid), key=lambda m: m.start)
                self._starts = [m.start for m in self._maps]
        return None

    def close(self) -> None:
        if self.reader is not None and not self._shared:
            self.reader.memory.close()
