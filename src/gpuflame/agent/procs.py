"""Processes seen through /proc: their mappings, the CUDA driver they load, their interpreter.

Files are opened through ``/proc/PID/root/…`` so that a process in a container
(another mount namespace) is read as it sees its own files, from an agent
running on the host or with ``hostPID``.
"""

from __future__ import annotations

import os
import re
import stat
import struct
from collections.abc import Container
from dataclasses import dataclass

from gpuflame.agent.confined import open_in_root
from gpuflame.agent.elf import STT_FUNC, ElfError, ElfFile, pointer_at, read_at, read_elf
from gpuflame.agent.lru import LRU
from gpuflame.agent.py_offsets import OFFSETS
from gpuflame.boundary.ranks import VARIABLES, rank_labels

LIBCUDA = re.compile(r"(^|/)libcuda\.so(\.\d+)*$")
LIBPYTHON = re.compile(r"(^|/)libpython(\d)\.(\d+)([a-z]*)\.so")
PYTHON_EXE = re.compile(r"(^|/)python(\d)\.(\d+)([a-z]*)$")
PAGE = 4096
ENVIRON_BYTES = 1 << 20  # read of a process's environment: a rank is near its start, a hostile one is cut here


@dataclass(frozen=True)
class Mapping:
    start: int
    end: int
    perms: str
    offset: int
    inode: int
    dev: str
    path: str


def maps(pid: int) -> list[Mapping]:
    """The file mappings of *pid* (empty when it is gone)."""
    out = []
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) < 6 or not parts[5].startswith("/"):
                    continue
                lo, hi = parts[0].split("-")
                out.append(
                    Mapping(
                        int(lo, 16),
                        int(hi, 16),
                        parts[1],
                        int(parts[2], 16),
                        int(parts[4]),
                        parts[3],
                        parts[5].rstrip("\n"),
                    )
                )
    except (OSError, ValueError):
        return []
    return out


def in_root(pid: int, path: str) -> str:
    """*path* as process *pid* sees it, openable from here."""
    return f"/proc/{pid}/root{path}"


MAP_FILES = "/proc/{pid}/map_files/{start:x}-{end:x}"  # needs CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE


def map_file(pid: int, m: Mapping) -> str:
    """The magic link to the very file of mapping *m* (no path resolved)."""
    return MAP_FILES.format(pid=pid, start=m.start, end=m.end)


def open_mapped(pid: int, m: Mapping) -> tuple[int, bool]:
    """A read-only fd of the file of mapping *m*, and whether it is surely that file: the very file
    (:func:`map_file`), else its path resolved inside the process's root (no link leads out of it, but the
    process may have put another file there); raises OSError."""
    try:
        fd, exact = os.open(map_file(pid, m), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), True
    except OSError:
        fd, exact = open_in_root(f"/proc/{pid}/root", m.path), False
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{m.path}: not a regular file")
    return fd, exact


def mapped_elf(pid: int, m: Mapping, full: bool = False) -> ElfFile | None:
    """The parsed file of mapping *m* (:func:`open_mapped`, :func:`elf_file`)."""
    try:
        fd, _exact = open_mapped(pid, m)
    except OSError:
        return None
    try:
        return elf_file(f"/proc/self/fd/{fd}", full)
    finally:
        os.close(fd)


def is_mapped(st: os.stat_result, m: Mapping) -> bool:
    """*st* is the file of mapping *m* (its device and inode)."""
    major, minor = (int(x, 16) for x in m.dev.split(":"))
    return (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino) == (major, minor, m.inode)


def sees_host_files(pid: int) -> bool:
    """The process has this agent's mount namespace and root (not a container's): its paths are the host's."""
    try:
        same_ns = os.stat(f"/proc/{pid}/ns/mnt").st_ino == os.stat("/proc/self/ns/mnt").st_ino
        return same_ns and os.path.samestat(os.stat(f"/proc/{pid}/root"), os.stat("/"))
    except OSError:
        return False


def as_seen(path: str) -> str:
    """A ``/proc/PID/root/…`` path as its process sees it, for messages."""
    return re.sub(r"^/proc/\d+/root(?=/)", "", path)


def all_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def ranks(pid: int, proc: str = "/proc") -> dict[str, str]:
    """The process's rank labels (``boundary/ranks.py``) from its environment at exec; {} when unreadable or none.

    ``/proc/PID/environ`` is what the program was started with: a rank its
    launcher set before exec (torchrun, srun, mpirun, Accelerate, DeepSpeed),
    not one the program set in itself later.
    """
    try:
        with open(f"{proc}/{pid}/environ", "rb") as f:
            data = f.read(ENVIRON_BYTES)
    except OSError:
        return {}
    env = {}
    for entry in data.split(b"\0"):
        name, eq, value = entry.partition(b"=")
        if eq and name.decode("ascii", "replace") in VARIABLES:
            env[name.decode("ascii")] = value.decode("ascii", "replace")
    return rank_labels(env)


def looks_like_python(pid: int) -> bool:
    """An executable named python* (worth watching for its interpreter from its very start)."""
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe")).startswith("python")
    except OSError:
        return False


def seccomp_filtered(pid: int, proc: str = "/proc") -> bool:
    """The process runs under a seccomp filter (containers' default profiles, sandboxes)."""
    try:
        with open(f"{proc}/{pid}/status") as f:
            return any(line.split()[1:2] == ["2"] for line in f if line.startswith("Seccomp:"))
    except OSError:
        return False


def uretprobe_seccomp_kernel(release: str | None = None) -> bool:
    """Linux 6.11-6.13 run uretprobes through a syscall that seccomp filters can refuse (killing the process).

    Later kernels (and stable ones with "seccomp: passthrough uretprobe syscall
    without filtering") exempt it; a backport cannot be seen from the version.
    """
    m = re.match(r"(\d+)\.(\d+)", release or os.uname().release)
    return m is not None and (int(m.group(1)), int(m.group(2))) in ((6, 11), (6, 12), (6, 13))


# The oldest kernel the BPF object loads on: uprobes' attach cookies (bpf_get_attach_cookie and perf links,
# 5.15); before it, task storage in tracing programs (5.12), global functions with pointer arguments (5.12),
# BTF tracepoints, fexit and the ring buffer (5.5-5.8). Loops are bounded loops (5.3), not bpf_loop (5.17).
# Uprobe-multi links (6.6) and fexit on vm_mmap_pgoff (driver files loaded later) have fallbacks.
# docs/agent-kernels.md says which kernel each was tested on.
KERNEL_FLOOR = (5, 15)
KERNEL_FLOOR_NEEDS = "uprobe attach cookies"


def below_kernel_floor(release: str | None = None) -> str | None:
    """The one line saying this kernel is older than the agent supports, or None."""
    release = release or os.uname().release
    m = re.match(r"(\d+)\.(\d+)", release)
    if not m or (int(m.group(1)), int(m.group(2))) >= KERNEL_FLOOR:
        return None
    floor = ".".join(map(str, KERNEL_FLOOR))
    return (
        f"Linux {release} is older than the agent's floor, {floor} (its BPF programs need {KERNEL_FLOOR_NEEDS}); "
        f"run it on a {floor} or newer kernel"
    )


PROBE_MODES = ("auto", "return", "entry")


def choose_probes(
    asked: str, pids: list[int], driver_users: list[int], release: str | None = None, proc: str = "/proc"
) -> tuple[str, str]:
    """``("return" | "entry", why)``: the probes for this run (``--probes``).

    A uprobe sits on a file's inode, so a uretprobe fires in every process that
    maps the library, watched or not. ``auto`` keeps return probes unless the
    kernel is 6.11-6.13 and a process they could reach runs under a seccomp
    filter: with --pid, a watched process or one mapping the driver now
    (*driver_users*); watching every process, always on such a kernel (a
    container under its runtime's default profile can start at any moment).
    """
    if asked != "auto":
        return asked, "asked for"
    release = release or os.uname().release
    if not uretprobe_seccomp_kernel(release):
        return "return", f"Linux {release} runs uretprobes without a syscall seccomp could refuse"
    if not pids:
        return "entry", (
            f"on Linux {release} a uretprobe can get a process under a seccomp filter killed, "
            "and any process may start under one"
        )
    filtered = sorted({pid for pid in [*pids, *driver_users] if seccomp_filtered(pid, proc)})
    if filtered:
        return "entry", (
            f"on Linux {release} a uretprobe can get a process under a seccomp filter killed "
            f"(pid {', '.join(map(str, filtered))})"
        )
    return "return", f"no process mapping the driver runs under a seccomp filter (Linux {release})"


def alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def libcuda_files(pid: int) -> dict[tuple[str, int], str]:
    """(device, inode) -> an openable path, for each libcuda.so the process maps."""
    found: dict[tuple[str, int], str] = {}
    for m in maps(pid):
        if LIBCUDA.search(m.path) and (m.dev, m.inode) not in found:
            found[(m.dev, m.inode)] = in_root(pid, m.path)
    return found


@dataclass(frozen=True)
class Interpreter:
    """Where a process's CPython keeps its runtime, and which version it is."""

    runtime: int
    version: str
    path: str
    mapping: Mapping | None = None  # one mapping of the interpreter's file (to open it as mapped)
    code_dealloc: int = -1  # file offset of CPython's code_dealloc, -1 where not found
    abiflags: str = ""  # from the file's name: t (free-threaded), d (debug)


ELF_FILES_KEPT = 64  # parsed files remembered, with at most ELF_SYMBOLS_KEPT symbols among them
ELF_SYMBOLS_KEPT = 1 << 19
_ELF_CACHE: LRU[tuple[int, int, int, bool], ElfFile | None] = LRU(
    ELF_FILES_KEPT, ELF_SYMBOLS_KEPT, lambda elf: len(elf.symbols)
)


def elf_file(path: str, full: bool = False) -> ElfFile | None:
    """The parsed file, once per file on the host (by inode: every process of one install shares it)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (st.st_dev, st.st_ino, st.st_mtime_ns, full)
    if key in _ELF_CACHE:
        return _ELF_CACHE.get(key)
    try:
        elf = read_elf(path, full)
    except (OSError, ElfError):
        elf = None
    _ELF_CACHE[key] = elf
    return elf


def load_bias(elf: ElfFile, mappings: list[Mapping]) -> int | None:
    """Where the file was loaded: its mapping's start minus the segment's page-aligned address."""
    for m in sorted(mappings, key=lambda m: m.start):
        for s in elf.segments:
            if s.offset & ~(PAGE - 1) == m.offset:
                return m.start - (s.vaddr & ~(PAGE - 1))
    return None


def python_version(path: str, elf: ElfFile) -> str | None:
    """``3.11`` from the ``Py_Version`` constant (3.11+), else from the file's name."""
    sym = elf.symbols.get("Py_Version")
    if sym is not None:
        try:
            (hexversion,) = struct.unpack("<I", read_at(path, elf, sym.value, 4))
            return f"{hexversion >> 24}.{(hexversion >> 16) & 0xFF}"
        except (OSError, ElfError, struct.error):
            pass
    m = LIBPYTHON.search(path) or PYTHON_EXE.search(path)
    return f"{m.group(2)}.{m.group(3)}" if m else None


def interpreter(pid: int) -> Interpreter | None:
    """The CPython runtime of *pid*: ``_PyRuntime`` in the executable or a mapped libpython."""
    mappings = maps(pid)
    by_path: dict[str, list[Mapping]] = {}
    for m in mappings:
        by_path.setdefault(m.path, []).append(m)
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None
    candidates = [p for p in by_path if LIBPYTHON.search(p)] + [exe]
    for path in candidates:
        if path not in by_path:
            continue
        try:
            fd, _exact = open_mapped(pid, by_path[path][0])
        except OSError:
            continue
        try:
            real = f"/proc/self/fd/{fd}"
            elf = elf_file(real)
            if elf is None or "_PyRuntime" not in elf.symbols:
                continue
            version = python_version(real, elf) or python_version(path, elf)
            dealloc = code_dealloc(real) if version is not None else -1
        finally:
            os.close(fd)
        bias = load_bias(elf, by_path[path])
        if version is None or bias is None:
            continue
        named = LIBPYTHON.search(path) or PYTHON_EXE.search(path)
        return Interpreter(
            bias + elf.symbols["_PyRuntime"].value,
            version,
            path,
            by_path[path][0],
            dealloc,
            build_flags(named.group(4) if named else "", elf.symbols),
        )
    return None


# functions only a debug (Py_DEBUG) or a free-threaded build exports: its kind, whatever its file is called
BUILD_SYMBOLS = {"_Py_NegativeRefcount": "d", "_Py_MergeZeroLocalRefcount": "t"}


def build_flags(named: str, symbols: Container[str]) -> str:
    """The ABI flags of an interpreter file: those its name has, and those its exported functions show."""
    return named + "".join(flag for sym, flag in BUILD_SYMBOLS.items() if sym in symbols and flag not in named)


TP_DEALLOC = 48  # PyTypeObject.tp_dealloc on every 64-bit CPython (after the header, name and sizes)


def code_dealloc(path: str) -> int:
    """The file offset of CPython's ``code_dealloc`` in an interpreter file: its symbol (unstripped builds), else
    where ``PyCode_Type.tp_dealloc`` points; -1 where neither says."""
    elf = elf_file(path, full=True)
    if elf is None:
        return -1
    sym = elf.symbols.get("code_dealloc")
    vaddr = sym.value if sym is not None and sym.kind == STT_FUNC else None
    if vaddr is None and "PyCode_Type" in elf.symbols:
        vaddr = pointer_at(path, elf, elf.symbols["PyCode_Type"].value + TP_DEALLOC)
    try:
        return elf.file_offset(vaddr) if vaddr else -1
    except ElfError:
        return -1


def supported(version: str) -> bool:
    return version in OFFSETS


def supported_said() -> str:
    """The CPython versions with offsets, in words (3.10-3.13)."""
    versions = sorted(OFFSETS, key=lambda v: tuple(map(int, v.split("."))))
    return f"{versions[0]}-{versions[-1]}"


def pid_namespace_pid(pid: int) -> int:
    """The pid the process sees itself as (its innermost PID namespace)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError):
        pass
    return pid
