"""Probing the CUDA driver: the BPF object loaded, uprobes on each distinct ``libcuda.so`` file, found again.

A uprobe sits on a file's inode, so each driver file is probed once and the
probes fire in every process that maps it. :class:`Probing` is the part of
:class:`~gpuflame.agent.agent.Agent` that loads the object, finds the driver
files (at start, from the kernel side's word when a process maps one, at each
rescan) and places the probes; its state is the Agent's.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable

from gpuflame.agent import procs
from gpuflame.agent.call_sites import DRIVER_FUNCTIONS
from gpuflame.agent.confined import open_regular
from gpuflame.agent.elf import ElfError, read_elf
from gpuflame.agent.events import (
    ALLOCS,
    FREES,
    INIT,
    PROC,
    RING_BYTES,
    SET_ENTRY_ONLY,
    SET_ONLY_REGISTERED,
    VMM,
)
from gpuflame.agent.libbpf import BpfError, BpfObject, Map, RingBuffer, possible_cpus
from gpuflame.agent.process import Process
from gpuflame.agent.state import AgentState
from gpuflame.errors import GpuflameError

LIBCUDA_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/nvidia/lib64",
    "/usr/local/cuda/compat",
)
UPROBE_PROGRAMS = (
    "alloc_enter",
    "pitch_enter",
    "create_enter",
    "free_enter",
    "alloc_exit",
    "free_exit",
    "init_enter",
    "ret_site",
    "vmm_enter",
    "vmm_exit",
    "code_freed",
)
# fexit on vm_mmap_pgoff: a driver file mapped later is probed at once; on do_sys_openat2: one opened, before
# it is mapped (else a raw tracepoint on every system call's exit does, driver_opened). Kernels that refuse
# fexit (lockdown, no BPF trampolines) load without them
OPTIONAL_PROGRAMS = ("driver_mapped", "driver_opened_fx")
CAPABILITIES = {"CAP_BPF": 39, "CAP_PERFMON": 38, "CAP_SYS_PTRACE": 19}
CAP_SYS_ADMIN = 21
SKIPPED_SAID = 5  # driver files that could not be probed, each named in the profile; the rest counted
PUSH_RBP = 0x55  # a probed function starting with it is emulated by the kernel; others are single-stepped


class AgentError(GpuflameError):
    """The agent cannot run here; one line says why."""


def missing_privileges() -> str | None:
    """Why this process cannot load the probes, or None."""
    try:
        with open("/proc/self/status") as f:
            caps = next(int(line.split()[1], 16) for line in f if line.startswith("CapEff:"))
    except (OSError, StopIteration, ValueError):
        return None if os.geteuid() == 0 else "cannot read this process's capabilities"
    missing = [name for name, bit in CAPABILITIES.items() if not caps >> bit & 1]
    if caps >> CAP_SYS_ADMIN & 1:
        missing = [m for m in missing if m == "CAP_SYS_PTRACE"]
    if not missing:
        return None
    return (
        "needs root, or the capabilities CAP_BPF, CAP_PERFMON and CAP_SYS_PTRACE "
        f"(missing: {', '.join(missing)}): it puts uprobes on the CUDA driver and reads other processes' memory"
    )


def first_byte(path: str, offset: int) -> int:
    """The byte at *offset* of a file (a function's first instruction byte); -1 where unreadable."""
    try:
        fd = open_regular(path)
    except OSError:
        return -1
    try:
        data = os.pread(fd, 1, offset)
    except (OSError, ValueError, OverflowError):
        return -1
    finally:
        os.close(fd)
    return data[0] if data else -1


def default_libcuda() -> list[str]:
    """libcuda.so.1 in the usual library folders (for a node where no process has loaded it yet)."""
    return [p for d in LIBCUDA_DIRS if os.path.exists(p := os.path.join(d, "libcuda.so.1"))]


class Probing(AgentState):
    """The Agent's probes: loading, driver files, attaching (mixed into :class:`~gpuflame.agent.agent.Agent`)."""

    def _attach_all(self, items: list[tuple[tuple[int, int], str]]) -> None:
        """Load, register the processes known now (before the probes: their first events have stacks), attach."""
        self._load(self._obj_path, multi=True)
        self.cuda_seen = bool(self._cuda_pids())
        for pid in self.pids or self._cuda_pids():
            self._register(pid)
        self._attach_items(items)
        if items and not self.attached and self.pids:  # watching every process: wait for a driver it can probe
            raise AgentError(f"no libcuda.so could be probed: {'; '.join(self.skipped)}")

    def _attach_items(self, items: list[tuple[tuple[int, int], str]]) -> None:
        """Probe these files; the first one probed tells whether the kernel takes uprobe-multi links."""
        if not items:
            return
        if not self.attached:
            try:
                self._attach_first(items)
            except BpfError:
                if not self._multi:
                    raise
                assert self._obj is not None  # _attach_first ran on the loaded object
                self._obj.close()  # a kernel before 6.6: one perf event per probe instead
                self._load(self._obj_path, multi=False)
                for pid in list(self.processes):
                    self._register(pid)
                self._attach_first(items)
        for key, path in items:
            if key not in self.attached and key not in self._unprobeable:
                self._attach_found(key, path)

    def _driver_users(self) -> list[int]:
        """The processes mapping a libcuda now, for the choice of probes (a uretprobe reaches them all)."""
        if not self.pids or self.probes_asked != "auto" or not procs.uretprobe_seccomp_kernel():
            return self._cuda_pids()
        return [pid for pid in procs.all_pids() if procs.libcuda_files(pid)]

    def probes_said(self) -> str:
        """The probes in words, for the watching line and the profile."""
        if self.probes == "entry":
            return (
                f"probes: entry-only, no uretprobes ({self.probes_why}); results read at each call's return "
                "site once probed, else at the thread's next driver call"
            )
        return f"probes: entry and return ({self.probes_why})"

    def _check_uretprobe_risk(self) -> None:
        """On 6.11-6.13 a uretprobe can get a seccomp-filtered process killed: never risk a watched one."""
        if self.probes == "entry" or not procs.uretprobe_seccomp_kernel():
            return
        filtered = [pid for pid in self.pids if procs.seccomp_filtered(pid)]
        if filtered:
            raise AgentError(
                f"process {', '.join(map(str, filtered))} runs under a seccomp filter, and on Linux "
                f"{os.uname().release} a uretprobe may get it killed (the filter can refuse the uretprobe "
                "syscall); not probing it with --probes return (--probes entry or auto would: no uretprobes)"
            )
        if not self.pids:
            sys.stderr.write(
                f"gpuflame agent: warning: on Linux {os.uname().release}, processes under a seccomp filter that "
                "refuses the uretprobe syscall are killed by uretprobes (--probes return); --probes entry "
                "avoids them\n"
            )

    def _load(self, path: str, multi: bool) -> None:
        """Load the object and open its maps and ring."""
        self._multi = multi
        self._code_free_probes = set()  # a new object: its probes are to be placed again
        self.unwatched_code_frees = set()
        multi_programs = UPROBE_PROGRAMS if multi else ()
        try:
            self._obj = BpfObject(path, {"live": self.max_blocks}, multi=multi_programs, skip=self._skip)
        except BpfError:
            if self._skip == OPTIONAL_PROGRAMS:
                raise
            self._skip = OPTIONAL_PROGRAMS  # a kernel that refuses fexit programs: rescans find new drivers
            self._obj = BpfObject(path, {"live": self.max_blocks}, multi=multi_programs, skip=self._skip)
        ncpu = possible_cpus()
        self._procs = Map(self._obj.map_fd("procs"), PROC.size)
        self._live = Map(self._obj.map_fd("live"), 8)
        self._late = Map(self._obj.map_fd("late"), 1)
        self._stats = Map(self._obj.map_fd("stats"), 8 * ncpu)
        settings = Map(self._obj.map_fd("settings"), 4)
        settings.update(SET_ONLY_REGISTERED.to_bytes(4, "little"), (1 if self.pids else 0).to_bytes(4, "little"))
        settings.update(SET_ENTRY_ONLY.to_bytes(4, "little"), (self.probes == "entry").to_bytes(4, "little"))
        if self._ring is not None:
            self._ring.close()
        self._ring = RingBuffer(self._obj.map_fd("events"), RING_BYTES, self._read_ring)
        for program in ("process_exit", "process_fork", "process_exec"):
            self._obj.attach(program)
        self._hold_maps()
        self.watch_loads = self.watch_opens = False
        for program in ("driver_opened_fx", "driver_opened"):  # the first this kernel takes
            if program in self._skip:
                continue
            try:
                self._obj.attach(program)
                self.watch_opens = True
                break
            except BpfError:  # neither: the mapping's word (fexit) or a rescan
                pass
        if "driver_mapped" not in self._skip:
            try:
                self._obj.attach("driver_mapped")
                self.watch_loads = True
            except BpfError:  # no BPF trampolines (fexit) here: a driver file loaded later waits for a rescan
                pass

    def _libcuda_files(self) -> dict[tuple[int, int], str]:
        files: dict[tuple[int, int], str] = {}
        candidates = list(self.libcuda)
        self._scanned = {pid: procs.libcuda_files(pid) for pid in self.pids or procs.all_pids()}
        for found in self._scanned.values():
            candidates += found.values()
        if not candidates:
            candidates = default_libcuda()
        for path in candidates:
            try:
                st = os.stat(path)
            except OSError as exc:
                if path in self.libcuda:
                    raise AgentError(f"--libcuda {path}: {exc.strerror}") from None
                continue
            files.setdefault((st.st_dev, st.st_ino), path)
        return files

    def _attach_first(self, items: list[tuple[tuple[int, int], str]]) -> None:
        """The first file that can be probed: the one that tells whether the kernel takes multi links."""
        for key, path in items:
            if self._attach_found(key, path):
                return

    def _attach_found(self, key: tuple[int, int], path: str) -> bool:
        """Probe a file; one a process mapped may be gone by now: noted and skipped (one named by --libcuda fails)."""
        try:
            self._attach_file(key, path)
            return True
        except AgentError as exc:
            if path in self.libcuda:
                raise
            self.skipped_total += 1
            if len(self.skipped) < SKIPPED_SAID:  # a hostile node can hold any number of files named libcuda.so.1
                self.skipped.append(str(exc))
            self._unprobeable.add(key)
            return False

    def _attach_file(self, key: tuple[int, int], path: str) -> None:
        """Entry and return probes on the driver functions one libcuda file has."""
        assert self._obj is not None
        try:
            elf = read_elf(path, full=False, wanted=DRIVER_FUNCTIONS)  # the driver functions are exported
        except (OSError, ElfError) as exc:
            why = exc.strerror if isinstance(exc, OSError) else exc
            raise AgentError(f"cannot read {procs.as_seen(path)}: {why}") from None
        probes: dict[tuple[str, bool], list[tuple[int, int]]] = {}

        def add(name: str, program: str, ret_program: str | None, cookie: int) -> None:
            sym = elf.symbols.get(name)
            if sym is None or not sym.value:
                self.missing_functions.add(name)
                return
            off = elf.file_offset(sym.value)
            if name != INIT and first_byte(path, off) != PUSH_RBP:  # cuInit runs once: its cost is moot
                self.single_stepped.add(name)
            probes.setdefault((program, False), []).append((off, cookie))
            if ret_program:
                probes.setdefault((ret_program, True), []).append((off, 0))

        returns = self.probes == "return"
        for name, (program, kind) in ALLOCS.items():
            add(name, program, "alloc_exit" if returns else None, kind)
        for name, kind in FREES.items():
            add(name, "free_enter", "free_exit" if returns else None, kind)
        for name, kind in VMM.items():
            add(name, "vmm_enter", "vmm_exit" if returns else None, kind)
        if not probes:
            raise AgentError(f"{path} has none of the CUDA driver's allocation functions")
        add(INIT, "init_enter", None, 0)
        for (program, ret), places in probes.items():
            if self._multi:
                self._obj.attach_uprobe_multi(program, path, [o for o, _ in places], [c for _, c in places], ret=ret)
            else:
                for off, cookie in places:
                    self._obj.attach_uprobe(program, path, off, ret=ret, cookie=cookie)
        self.attached[key] = path
        self._note_probed(key)

    def _cuda_pids(self) -> list[int]:
        """The processes that mapped a libcuda.so at start (scanned once by _libcuda_files)."""
        return [pid for pid, found in self._scanned.items() if found]

    def _watch_code_frees(self, proc: Process) -> None:
        """A uprobe on the interpreter's code_dealloc (once per file, so in every process running it): a code
        object's address reused by another (notebook cells, exec'd and generated code) gets its own name."""
        interp = proc.interpreter
        if not proc.python or interp is None or interp.mapping is None:
            return
        if interp.code_dealloc < 0:
            self.unwatched_code_frees.add(interp.path)
            return
        try:
            fd, _exact = procs.open_mapped(proc.pid, interp.mapping)
        except OSError:
            return
        try:
            st = os.fstat(fd)
            key = (st.st_dev, st.st_ino)
            if key in self._code_free_probes or self._obj is None:
                return
            path = f"/proc/self/fd/{fd}"
            if self._multi:
                self._obj.attach_uprobe_multi("code_freed", path, [interp.code_dealloc], [0], ret=False)
            else:
                self._obj.attach_uprobe("code_freed", path, interp.code_dealloc, ret=False)
            self._code_free_probes.add(key)
        except BpfError:
            self.unwatched_code_frees.add(interp.path)
        finally:
            os.close(fd)

    def _rescan(self) -> None:
        """New libcuda files (a container with its own driver copy, a watched process loading the driver late)
        and, without --pid, processes mapping them."""
        try:
            if not self.pids:  # a driver installed after the agent started (an idle node)
                self._attach_items(self._new_files(default_libcuda()))
            for pid in list(self.processes) if self.pids else procs.all_pids():
                files = procs.libcuda_files(pid)
                if files:
                    self.cuda_seen = True
                if files and pid not in self.processes and not self.pids:
                    with self._lock:  # known before its driver's probes are in: its first events have stacks
                        self._register(pid)
                self._probe_loaded(pid, files, None)
        except Exception as exc:  # noqa: BLE001
            self.counts["handler_errors"] += 1
            sys.stderr.write(f"gpuflame agent: rescan failed ({type(exc).__name__}: {exc})\n")

    def _driver_loaded(self, pid: int, mapped_ns: int) -> None:
        """The kernel side saw *pid* map a libcuda file: probe it now if it is new, and know the process."""
        if not self._wanted(pid):
            return
        files = procs.libcuda_files(pid)
        if not files:
            return
        self.cuda_seen = True
        if pid not in self.processes:  # before the probes: its first events have stacks
            self._register(pid)
        self._probe_loaded(pid, files, mapped_ns)

    def _probe_loaded(self, pid: int, files: dict[tuple[str, int], str], mapped_ns: int | None) -> None:
        """Probe the files *pid* maps that are new; it loaded them before their probes were in, so note the
        window (*mapped_ns*: when it mapped one, on the kernel's monotonic clock; None: found by a rescan)."""
        new = self._new_files(files.values())
        if not new:
            return
        before = len(self.attached)
        self._attach_items(new)
        if len(self.attached) > before:
            self._mark_late(pid, mapped_ns)

    def _mark_late(self, pid: int, since_ns: int | None) -> None:
        """*pid* may have called a driver file before its probes were in: note the window (None: a rescan) and
        have the kernel side send its frees of blocks never seen, to count what was missed."""
        ms = None if since_ns is None else max(0, time.monotonic_ns() - since_ns) // 1_000_000
        old = self.late_loads.get(pid, 0)
        self.late_loads[pid] = None if ms is None or old is None else max(old, ms)
        self.late_frees.setdefault(pid, 0)
        self._late.update(pid.to_bytes(4, "little"), b"\x01")

    def _driver_opened(self, pid: int, fd: int, opened_ns: int) -> bool:
        """The kernel side saw *pid* open a file named libcuda.so* as descriptor *fd*: the dynamic loader opens
        a library before it maps it, so a new driver file probed now is probed before the process can call it.
        Read through the process's own descriptor (the very file); the process is counted late only if it had
        mapped the file by the time the probes were in. Whether that file needs no more word (probed, or found
        not to be a driver)."""
        if pid == os.getpid() or not self._wanted(pid):
            return False  # the agent opens driver files itself to read them
        link = f"/proc/{pid}/fd/{fd}"
        try:
            seen = os.readlink(link)
            if not procs.LIBCUDA.search(seen):  # the number reused, or a libcuda.so.1.bak and the like
                raise OSError(f"{link} is no driver file now")
            mine = open_regular(link)
        except OSError:  # closed again: the loader closes it once mapped, so it is found mapped (if it is)
            self._driver_loaded(pid, opened_ns)
            return False
        try:
            st = os.fstat(mine)
            key = (st.st_dev, st.st_ino)
            if key in self.attached or key in self._unprobeable:
                return True
            self.cuda_seen = True
            if pid not in self.processes:  # before the probes: its first events have stacks
                self._register(pid)
            path, shown = f"/proc/self/fd/{mine}", procs.in_root(pid, seen)
            self._attach_items([(key, path)])
            if key in self._unprobeable and self.skipped and path in self.skipped[-1]:
                self.skipped[-1] = self.skipped[-1].replace(path, procs.as_seen(shown))
        finally:
            os.close(mine)
        if key not in self.attached:
            return key in self._unprobeable
        self.attached[key] = shown  # the path it was read through is closed now
        self.probed_on_open += 1
        mapped = {self._file_key(p) for p in procs.libcuda_files(pid).values()}
        if key in mapped:  # the loader was quicker: calls made before the probes were in are counted
            self._mark_late(pid, opened_ns)
        return True

    @staticmethod
    def _file_key(path: str) -> tuple[int, int] | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        return (st.st_dev, st.st_ino)

    def _new_files(self, paths: Iterable[str]) -> list[tuple[tuple[int, int], str]]:
        """The files among *paths* not probed yet (nor found unprobeable), by (device, inode)."""
        found: dict[tuple[int, int], str] = {}
        for path in paths:
            try:
                st = os.stat(path)
            except OSError:
                continue
            key = (st.st_dev, st.st_ino)
            if key not in self.attached and key not in self._unprobeable:
                found.setdefault(key, path)
        return list(found.items())
