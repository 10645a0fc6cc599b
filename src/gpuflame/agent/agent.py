"""The node agent: uprobes on the CUDA driver of every process (or the chosen ones), frees included.

:class:`Agent` loads the BPF object, places the probes on each distinct
``libcuda.so`` file (a uprobe on a file's inode fires in every process that
maps it), tells the BPF side where each process's interpreter is, and reads
the events ring on one thread: allocations become rows of a
:class:`~gpuflame.agent.ledger.Ledger` keyed by the Python stack, frees and
process exits take them back. :meth:`Agent.snapshot` is the profile so far.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterable

from gpuflame.agent import alive, build, procs
from gpuflame.agent.call_sites import DRIVER_FUNCTIONS, MAX_SITES, Verifier
from gpuflame.agent.confined import open_regular
from gpuflame.agent.elf import ElfError, read_elf
from gpuflame.agent.events import (
    ALLOCS,
    BLOCK_KEY,
    EV_ALLOC,
    EV_CODE,
    EV_CODE_FREED,
    EV_DRIVER,
    EV_EXEC,
    EV_EXIT,
    EV_FORK,
    EV_FREE,
    EV_NEW_PROCESS,
    EV_RESULT,
    EV_SITE,
    EV_VMM,
    F_FAILED,
    F_NO_THREAD,
    F_NOT_REGISTERED,
    F_PENDING,
    F_REPLACED,
    F_RETURNED,
    F_TRUNCATED,
    F_UNKNOWN,
    F_UNTRACKED,
    FREES,
    HEADER,
    INIT,
    K_CREATE,
    K_MAP,
    K_RELEASE,
    K_RETAIN,
    K_UNMAP,
    LIVE_BLOCKS,
    N_STATS,
    PROC,
    RING_BYTES,
    SET_ENTRY_ONLY,
    SET_ONLY_REGISTERED,
    STAT_CALLS_FULL,
    STAT_LIVE_FULL,
    STAT_LOST_EVENTS,
    STAT_UNKNOWN_FREES,
    VMM,
    Header,
    code_record,
    device_label,
    header,
    native_frames,
    python_frames,
    unpack_free,
    vmm_handle,
)
from gpuflame.agent.ledger import Ledger
from gpuflame.agent.libbpf import BpfError, BpfObject, Map, RingBuffer, possible_cpus
from gpuflame.agent.pending import Pending, PendingResults
from gpuflame.agent.process import Process
from gpuflame.errors import GpuflameError
from gpuflame.model.profile import SYNTHETIC, Frame, Profile
from gpuflame.model.sample_types import memory_sample_types

POLL_MS = 20
RESCAN_SECONDS = 2.0  # every process: new libcuda files and the processes mapping them
SITE_CHECKS_PER_PROCESS = 64  # return addresses one process may have checked (each reads its maps and code)
PID_RESCAN_SECONDS = 0.25  # --pid: the watched processes loading the driver
REGISTER_WINDOW = 3.0  # how long a new process is looked at for its interpreter
LIBCUDA_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/nvidia/lib64",
    "/usr/local/cuda/compat",
)

UPROBE_PROGRAMS = ("alloc_enter", "pitch_enter", "create_enter", "free_enter", "alloc_exit", "free_exit", "init_enter",
                   "ret_site", "vmm_enter", "vmm_exit", "code_freed")

# fexit on vm_mmap_pgoff: a driver file mapped later is probed at once; kernels that refuse fexit (lockdown,
# no BPF trampolines) load without it and find such files at the next rescan
OPTIONAL_PROGRAMS = ("driver_mapped",)

NO_PYTHON_STACK = Frame("<no Python stack>", kind=SYNTHETIC)
TOO_EARLY = Frame("<before the agent knew the process>", kind=SYNTHETIC)
TRUNCATED = Frame("<deeper frames not recorded>", kind=SYNTHETIC)
OVER_LIMIT = (Frame("<stacks beyond the agent's limit>", kind=SYNTHETIC),)
MAX_STACKS = 1 << 18  # distinct stacks named (each a row of the ledger and of the profile)
MAX_RAW_STACK_BYTES = 64 << 20  # the raw frames kept to recognise stacks already named

NEVER_READY = "its thread list never read back where the agent's table says it is"
NO_CUDA_PROCESS = ("gpuflame agent: no CUDA process was seen: no process loaded libcuda.so while the agent "
                   "watched")
OUTPUT_MODE = 0o600  # the agent's profiles hold every process's stacks and pods: for their owner only
CAPABILITIES = {"CAP_BPF": 39, "CAP_PERFMON": 38, "CAP_SYS_PTRACE": 19}
CAP_SYS_ADMIN = 21


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


PUSH_RBP = 0x55  # a probed function starting with it is emulated by the kernel; others are single-stepped


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


class Agent:
    """Probes, the ring reader thread, and what they have recorded."""

    def __init__(
        self,
        pids: Iterable[int] = (),
        libcuda: Iterable[str] = (),
        native: bool = False,
        max_blocks: int = LIVE_BLOCKS,
        labels_for: Callable[[int], dict[str, str]] | None = None,
        probes: str = "auto",
        alive_file: str | None = None,
    ) -> None:
        self.pids = sorted(set(pids))
        self.libcuda = list(libcuda)
        self.native = native
        self.max_blocks = max_blocks
        self.labels_for = labels_for  # pid -> extra labels (Kubernetes), or None
        self.probes_asked = probes  # auto | return | entry (procs.choose_probes)
        self.alive_file = alive_file  # touched by the reader thread (alive.py)
        self.cuda_seen = False  # a process loaded the driver or allocated while we watched
        self.watch_loads = False  # the kernel side tells of a driver file mapped (else: found at rescans)
        self._code_free_probes: set[tuple[int, int]] = set()  # interpreter files whose code_dealloc is probed
        self.unwatched_code_frees: set[str] = set()  # interpreters without one: a reused code address misnames
        self._skip: tuple[str, ...] = ()  # optional programs this kernel refused
        self.late_loads: dict[int, int | None] = {}  # pid -> ms from its driver load to the probes (None: a rescan)
        self.probes = ""  # return | entry, chosen at start
        self.probes_why = ""
        self.pending = PendingResults()  # entry-only: allocations whose result is not read yet
        self.return_sites: dict[tuple[int, int, int], str] = {}  # entry-only: (dev, inode, offset) probed
        self._verifier = Verifier()  # entry-only: return sites checked in their file before a probe
        self._site_checks: dict[int, int] = {}  # pid -> return addresses checked
        self.ledger = Ledger()
        self.processes: dict[int, Process] = {}
        self.attached: dict[tuple[int, int], str] = {}
        self.missing_functions: set[str] = set()
        self.single_stepped: set[str] = set()  # probed functions not starting with push %rbp
        self.unsupported: set[str] = set()  # Python versions seen without offsets
        self.unverified: dict[int, str] = {}  # pid -> why its CPython's layout was not trusted (py_layout)
        self._never_ready: set[int] = set()  # processes whose thread list stayed empty through their window
        self.skipped: list[str] = []  # libcuda files found but not probed, and why
        self._unprobeable: set[tuple[int, int]] = set()
        self.counts = {"not_registered": 0, "no_thread": 0, "truncated": 0, "untracked": 0, "handler_errors": 0,
                       "results_next_entry": 0, "results_unknown": 0, "results_unread": 0, "sites_unprobed": 0,
                       "sites_unverified": 0, "stacks_over_limit": 0}
        self.started_ns = 0
        self.first_event_ns = 0
        self._stacks: list[tuple[Frame, ...]] = []
        self._stack_ids: dict[tuple[Frame, ...], int] = {}
        self._raw_ids: dict[tuple[int, bytes], int] = {}
        self._raw_bytes = 0  # the raw stacks kept as keys
        self.max_stacks = MAX_STACKS
        self._labels: dict[int, dict[str, str]] = {}
        self._waiting: dict[int, float] = {}  # pid -> until when to look for its interpreter
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._incoming: list[bytes] = []
        self._obj: BpfObject | None = None
        self._ring: RingBuffer | None = None
        self._multi = True
        self.final_stats: dict[str, int] = {}
        self._scanned: dict[int, dict[tuple[str, int], str]] = {}
        self._exited: set[int] = set()

    # -- starting ----------------------------------------------------------------

    def start(self, thread: bool = True) -> None:
        """Load, attach, register; raises :class:`AgentError` with one line on failure.

        *thread* False: no reader thread; the caller books events with :meth:`poll`.
        """
        why = procs.below_kernel_floor() or missing_privileges()
        if why:
            raise AgentError(why)
        for pid in self.pids:
            if not procs.alive(pid):
                raise AgentError(f"no process {pid}")
        files = self._libcuda_files()
        self.probes, self.probes_why = procs.choose_probes(self.probes_asked, self.pids, self._driver_users())
        self._check_uretprobe_risk()
        try:
            self._obj_path = str(build.ensure())
        except build.BuildError as exc:
            raise AgentError(f"the agent's BPF object is not built and cannot be built here: {exc}") from None
        self._attach_all(list(files.items()))  # none yet (an idle node): each file is probed as it appears
        self.started_ns = time.time_ns()
        if thread:
            self._thread = threading.Thread(target=self._loop, name="gpuflame-agent", daemon=True)
            self._thread.start()

    def _attach_all(self, items: list[tuple[tuple[int, int], str]]) -> None:
        """Load, register the processes known now (before the probes: their first events have stacks), attach."""
        self._load(self._obj_path, multi=True)
        self.cuda_seen = bool(self._cuda_pids())
        for pid in self.pids or self._cuda_pids():
            self._register(pid)
        self._attach_items(items)
        if items and not self.attached:
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
            return (f"probes: entry-only, no uretprobes ({self.probes_why}); results read at each call's return "
                    "site once probed, else at the thread's next driver call")
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
                "syscall); not probing it with --probes return (--probes entry or auto would: no uretprobes)")
        if not self.pids:
            sys.stderr.write(
                f"gpuflame agent: warning: on Linux {os.uname().release}, processes under a seccomp filter that "
                "refuses the uretprobe syscall are killed by uretprobes (--probes return); --probes entry "
                "avoids them\n")

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
        self._stats = Map(self._obj.map_fd("stats"), 8 * ncpu)
        settings = Map(self._obj.map_fd("settings"), 4)
        settings.update(SET_ONLY_REGISTERED.to_bytes(4, "little"), (1 if self.pids else 0).to_bytes(4, "little"))
        settings.update(SET_ENTRY_ONLY.to_bytes(4, "little"), (self.probes == "entry").to_bytes(4, "little"))
        if self._ring is not None:
            self._ring.close()
        self._ring = RingBuffer(self._obj.map_fd("events"), RING_BYTES, self._incoming.append)
        for program in ("process_exit", "process_fork", "process_exec"):
            self._obj.attach(program)
        self.watch_loads = False
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

    def _cuda_pids(self) -> list[int]:
        """The processes that mapped a libcuda.so at start (scanned once by _libcuda_files)."""
        return [pid for pid, found in self._scanned.items() if found]

    def watching(self) -> str:
        """What the one 'watching' line says."""
        who = f"pid {', '.join(map(str, self.pids))}" if self.pids else "every process that loads the CUDA driver"
        files = ", ".join(sorted({procs.as_seen(path) for path in self.attached.values()}))
        py = sum(1 for p in self.processes.values() if p.python)
        if self.attached:
            through = f"through {len(self.attached)} libcuda file(s): {files}"
        elif self.pids:
            through = ("(libcuda.so is not loaded yet: probed when it is; a driver file named otherwise is "
                       "not found: give it with --libcuda PATH)")
        else:
            through = "(no libcuda.so loaded yet: waiting for CUDA processes; each driver file is probed as it appears)"
        line = f"gpuflame agent: watching {who} ({len(self.processes)} now, {py} Python) {through}"
        line += f"; {self.probes_said()}"
        if self.single_stepped:
            line += (f"; note: {', '.join(sorted(self.single_stepped))} do not start with push %rbp, "
                     "so the kernel single-steps their probes (slower calls)")
        return line

    # -- registering processes ----------------------------------------------------

    def _wanted(self, pid: int) -> bool:
        return not self.pids or pid in self.processes or pid in self.pids

    def _register(self, pid: int, parent: Process | None = None) -> Process | None:
        """Tell the BPF side where *pid*'s interpreter is; keep its frame namer."""
        old = self.processes.pop(pid, None)
        if old is not None:
            old.close()
        try:
            proc = Process.forked(pid, parent) if parent is not None else Process(pid, self.native)
        except OSError:
            return None  # gone already
        self.processes[pid] = proc
        if proc.provisional and pid in self._never_ready:
            proc.refuse(NEVER_READY)
        self._procs.update(pid.to_bytes(4, "little"), proc.bpf_value())
        self._labels[pid] = self._process_labels(proc)
        self._watch_code_frees(proc)
        if proc.interpreter is None and procs.looks_like_python(pid) or proc.provisional:
            self._waiting.setdefault(pid, time.monotonic() + REGISTER_WINDOW)  # libpython not mapped yet
        else:
            self._waiting.pop(pid, None)
        if proc.unverified and self.unverified.get(pid) != proc.unverified:
            self.unverified[pid] = proc.unverified
            sys.stderr.write(f"gpuflame agent: pid {pid} (Python {proc.version}): {proc.unverified}; its "
                             "allocations get native stacks\n")
        elif proc.interpreter is not None and not proc.python and proc.version not in self.unsupported:
            self.unsupported.add(proc.version)
            sys.stderr.write(f"gpuflame agent: Python {proc.version} (pid {pid}) is not supported "
                             f"({procs.supported_said()} are): its allocations get native stacks\n")
        return proc

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

    def _process_labels(self, proc: Process) -> dict[str, str]:
        labels = {"pid": str(proc.pid), "comm": proc.comm}
        if self.labels_for is not None:
            labels.update(self.labels_for(proc.pid))
        return labels

    def _retry_waiting(self) -> None:
        """Processes just started (exec) or not yet showing an interpreter: look again."""
        now = time.monotonic()
        for pid, until in list(self._waiting.items()):
            if now > until or not procs.alive(pid):
                self._waiting.pop(pid, None)
                proc = self.processes.get(pid)
                if proc is not None and proc.provisional and procs.alive(pid):
                    self._never_ready.add(pid)
                    self._register(pid)
                continue
            proc = self.processes.get(pid)
            if proc is not None and proc.provisional:  # its layout could not be checked yet: again
                proc.recheck()
                if proc.unverified:
                    self._register(pid)  # not the table's layout after all: native stacks from now on
                elif not proc.provisional:
                    self._waiting.pop(pid, None)
                continue
            if procs.interpreter(pid) is not None:
                self._register(pid)

    # -- the reader thread ----------------------------------------------------------

    def _loop(self) -> None:
        every = self._rescan_every()
        next_scan = time.monotonic() + every
        next_touch = 0.0
        while not self._stop.is_set():
            busy = self._ring is not None and self._ring.more
            self.poll(0 if busy else 2 if self._waiting else POLL_MS)  # a new process: catch its interpreter early
            now = time.monotonic()
            if now > next_scan:
                next_scan = now + every
                self._rescan()
            if self.alive_file and now > next_touch:
                next_touch = now + alive.TOUCH_EVERY_S
                self._touch_alive()

    def _touch_alive(self) -> None:
        try:
            alive.touch(self.alive_file)  # type: ignore[arg-type]
        except OSError as exc:
            self.counts["handler_errors"] += 1
            sys.stderr.write(f"gpuflame agent: cannot touch {self.alive_file}: {exc.strerror}\n")
            self.alive_file = None  # said once; the liveness probe will say the rest

    def poll(self, timeout_ms: int = POLL_MS) -> None:
        """Read what the ring holds and book it."""
        assert self._ring is not None
        self._ring.drain(timeout_ms)
        batch, self._incoming[:] = list(self._incoming), []
        with self._lock:
            for data in batch:
                try:
                    self._handle(data)
                except Exception as exc:  # noqa: BLE001 - one bad record must not stop the agent
                    self.counts["handler_errors"] += 1
                    if self.counts["handler_errors"] == 1:
                        sys.stderr.write(f"gpuflame agent: could not book an event ({type(exc).__name__}: {exc})\n")
            if self._waiting:
                self._retry_waiting()

    def _rescan(self) -> None:
        """New libcuda files (a container with its own driver copy, a watched process loading the driver late)
        and, without --pid, processes mapping them."""
        try:
            if not self.pids:  # a driver installed after the agent started (an idle node)
                self._attach_items(self._new_files(default_libcuda()))
            for pid in list(self.processes) if self.pids else procs.all_pids():
                files = procs.libcuda_files(pid)
                self._probe_loaded(pid, files, None)
                if files:
                    self.cuda_seen = True
                if files and pid not in self.processes and not self.pids:
                    with self._lock:
                        self._register(pid)
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
        self._probe_loaded(pid, files, mapped_ns)
        if pid not in self.processes:
            self._register(pid)

    def _probe_loaded(self, pid: int, files: dict[tuple[str, int], str], mapped_ns: int | None) -> None:
        """Probe the files *pid* maps that are new; it loaded them before their probes were in, so note the
        window (*mapped_ns*: when it mapped one, on the kernel's monotonic clock; None: found by a rescan)."""
        new = self._new_files(files.values())
        if not new:
            return
        before = len(self.attached)
        self._attach_items(new)
        if len(self.attached) > before:
            ms = None if mapped_ns is None else max(0, time.monotonic_ns() - mapped_ns) // 1_000_000
            old = self.late_loads.get(pid, 0)
            self.late_loads[pid] = None if ms is None or old is None else max(old, ms)

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

    def _handle(self, data: bytes) -> None:
        kind = data[0]
        if kind == EV_FREE:  # the most frequent with allocations: kept short
            tgid, addr = unpack_free(data)
            if data[1] == K_RELEASE:
                self.ledger.release(tgid, addr)
            else:
                self.ledger.free(tgid, (0, addr))
        elif kind == EV_ALLOC:
            self._alloc(data)
        elif kind == EV_RESULT:
            self._result(header(data))
        elif kind == EV_SITE:
            self._probe_return_site(header(data))
        elif kind == EV_CODE:
            record = code_record(data)
            proc = self.processes.get(record.tgid)
            if proc is not None and proc.reader is not None:
                proc.reader.remember(record)
        elif kind == EV_CODE_FREED:
            h = header(data)
            self._code_freed(h.tgid, h.addr)
        elif kind == EV_VMM:
            h = header(data)
            if h.kind == K_MAP:
                self.ledger.map(h.tgid, h.addr, h.size, vmm_handle(data))
            elif h.kind == K_UNMAP:
                self.ledger.unmap(h.tgid, h.addr, h.size)
            elif h.kind == K_RETAIN:
                self.ledger.retain(h.tgid, h.addr)
        elif kind == EV_DRIVER:
            h = header(data)
            self._driver_loaded(h.tgid, h.ts)
        elif kind == EV_EXIT:
            self._exit(header(data).tgid)
        elif kind == EV_NEW_PROCESS:
            tgid = header(data).tgid
            if self._wanted(tgid) and (tgid not in self.processes or not self.processes[tgid].python):
                self._register(tgid)
        elif kind == EV_FORK:
            h = header(data)
            if h.tgid in self.processes:
                self._register(h.addr, parent=self.processes[h.tgid])
        elif kind == EV_EXEC:
            tgid = header(data).tgid
            if tgid in self.processes or (not self.pids and procs.looks_like_python(tgid)):
                self._register(tgid)  # a new image: what we knew of the process is void

    def _code_freed(self, pid: int, code: int) -> None:
        """A code object named in a stack is gone: forget its name and the raw stacks holding its address."""
        proc = self.processes.get(pid)
        if proc is not None and proc.reader is not None:
            proc.reader.forget(code)
        needle = code.to_bytes(8, "little")
        self._raw_ids = {k: v for k, v in self._raw_ids.items() if k[0] != pid or needle not in k[1]}
        self._raw_bytes = sum(len(raw) for _, raw in self._raw_ids)

    def _alloc(self, data: bytes) -> None:
        _type, kind, _n, _nn, flags, tgid, tid, addr, size, _ts, device, seq, _comm = HEADER.unpack_from(data)
        raw = (tgid, data[HEADER.size :])
        stack = self._raw_ids.get(raw)
        if stack is None:  # a stack not seen before (the BPF side woke us at once for it)
            stack = self._new_stack(raw, header(data), data)
            if stack is None:
                return
        if flags:
            for flag, name in ((F_NOT_REGISTERED, "not_registered"), (F_NO_THREAD, "no_thread"),
                               (F_TRUNCATED, "truncated"), (F_UNTRACKED, "untracked")):
                if flags & flag:
                    self.counts[name] += 1
        if flags & F_PENDING:
            self.pending.add(tgid, tid, Pending(seq, kind, device_label(device), stack))
            return
        self.ledger.alloc(tgid, device_label(device), stack, (int(kind == K_CREATE), addr), size,
                          park=not flags & F_REPLACED and kind != K_CREATE)

    # -- entry-only probes: results read back ------------------------------------------

    def _result(self, h: Header) -> None:
        call = self.pending.take(h.tgid, h.tid, h.seq)
        if call is None or h.flags & F_FAILED:
            return  # an allocation not booked (a process not watched), or the call failed: nothing allocated
        if h.flags & F_UNKNOWN:
            self.counts["results_unknown"] += 1
            return
        if not h.flags & F_RETURNED:
            self.counts["results_next_entry"] += 1
        self.ledger.alloc(h.tgid, call.device, call.stack, (int(call.kind == K_CREATE), h.addr), h.size)

    def _probe_return_site(self, h: Header) -> None:
        """A plain uprobe where a driver call returns to (in its file: every process that maps it), once verified.

        The address comes from the process's stack: only a site :mod:`call_sites` has verified in the file
        (right after a call into the driver) is probed; the others are counted, their results read at the
        thread's next driver call.
        """
        checked = self._site_checks[h.tgid] = self._site_checks.get(h.tgid, 0) + 1
        if len(self.return_sites) >= MAX_SITES or checked > SITE_CHECKS_PER_PROCESS:
            self.counts["sites_unverified"] += 1
            return
        site = self._verifier.site(h.tgid, h.addr)
        if isinstance(site, str):
            self.counts["sites_unverified"] += 1
            if self.counts["sites_unverified"] == 1:
                sys.stderr.write(f"gpuflame agent: not probing return address {h.addr:#x} of pid {h.tgid}: {site} "
                                 "(its results are read at the next driver call)\n")
            return
        try:
            if site.key in self.return_sites:
                return
            assert self._obj is not None  # return sites are found in the events of a loaded object
            if self._multi:
                self._obj.attach_uprobe_multi("ret_site", site.path, [site.offset], [0], ret=False)
            else:
                self._obj.attach_uprobe("ret_site", site.path, site.offset, ret=False)
        except BpfError:
            self.counts["sites_unprobed"] += 1
            return
        finally:
            site.close()
        self.return_sites[site.key] = site.shown

    def _new_stack(self, raw: tuple[int, bytes], h: Header, data: bytes) -> int | None:
        self.cuda_seen = True
        if not self.first_event_ns:
            self.first_event_ns = time.time_ns()
        proc = self.processes.get(h.tgid)
        if proc is None and self._wanted(h.tgid):
            proc = self._register(h.tgid)
        if proc is None:
            return None
        if len(self._stacks) >= self.max_stacks or self._raw_bytes >= MAX_RAW_STACK_BYTES:
            self.counts["stacks_over_limit"] += 1  # a process making stacks without end: bounded, and said
            return self._intern(OVER_LIMIT)
        self._raw_bytes += len(raw[1])
        stack = self._raw_ids[raw] = self._intern(self._frames(proc, h, data))
        return stack

    def _frames(self, proc: Process, h: Header, data: bytes) -> tuple[Frame, ...]:
        frames: list[Frame] = []
        if h.nnative:
            addresses = native_frames(data, h.nframes, h.nnative)
            frames += proc.native_frames(addresses, above_python=bool(h.nframes and proc.python))
        if h.nframes and proc.python:
            frames += [proc.python_frame(code, instr) for code, instr in python_frames(data, h.nframes)]
            if h.flags & F_TRUNCATED:
                frames.append(TRUNCATED)
        elif proc.python or h.flags & F_NOT_REGISTERED and not h.nnative:
            frames.append(TOO_EARLY if h.flags & F_NOT_REGISTERED else NO_PYTHON_STACK)
        return tuple(frames) or (NO_PYTHON_STACK,)

    def _intern(self, frames: tuple[Frame, ...]) -> int:
        sid = self._stack_ids.get(frames)
        if sid is None:
            sid = self._stack_ids[frames] = len(self._stacks)
            self._stacks.append(frames)
        return sid

    def forget_exited(self) -> None:
        """Drop the rows of processes that have ended (a long-running agent pushing every interval keeps
        only live processes; their last push carried their final values)."""
        with self._lock:
            for pid in self._exited:
                self.ledger.drop(pid)
                self._labels.pop(pid, None)
            self._exited.clear()

    def _exit(self, pid: int) -> None:
        self._exited.add(pid)
        self._site_checks.pop(pid, None)
        self.counts["results_unread"] += self.pending.drop(pid)
        for is_handle, addr in self.ledger.exit(pid):
            self._live.delete(BLOCK_KEY.pack(pid, is_handle, addr))
        proc = self.processes.pop(pid, None)
        if proc is not None:
            proc.close()
        self._raw_ids = {k: v for k, v in self._raw_ids.items() if k[0] != pid}
        self._raw_bytes = sum(len(raw) for _, raw in self._raw_ids)

    # -- results --------------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        """The BPF side's counters, summed over CPUs, and the reader's."""
        if self._obj is None:
            return dict(self.final_stats or self.counts)
        out = dict(self.counts)
        names = {STAT_LOST_EVENTS: "lost_events", STAT_LIVE_FULL: "live_map_full",
                 STAT_UNKNOWN_FREES: "unknown_frees", STAT_CALLS_FULL: "calls_map_full"}
        for i in range(N_STATS):
            raw = self._stats.lookup(i.to_bytes(4, "little"))
            out[names[i]] = sum(int.from_bytes(raw[k : k + 8], "little") for k in range(0, len(raw), 8)) if raw else 0
        if self.probes == "entry":  # every free reaches user space at its entry, before the driver says no
            out["unknown_frees_at_entry"] = self.ledger.unmatched_frees
        else:  # after a live-map overflow the kernel sends the frees it does not know: matched here
            out["unknown_frees"] += self.ledger.unmatched_frees
        return out

    def snapshot(self) -> Profile:
        """Everything booked so far, as a profile (peak, in use, allocated)."""
        with self._lock:
            profile = Profile(sample_types=memory_sample_types(), default_type="peak_space")
            for (pid, device), stack, values in self.ledger.rows():
                if not any(values):
                    continue
                labels = dict(self._labels.get(pid, {"pid": str(pid)}), device=device)
                profile.add(self._stacks[stack], values, labels)
            stats = self.stats()
        profile.time_nanos = self.started_ns
        profile.duration_nanos = max(0, time.time_ns() - self.started_ns) if self.started_ns else 0
        profile.comments += loss_notes(stats, self.probes_said())
        if not self.cuda_seen:
            profile.comments.append(NO_CUDA_PROCESS)
        if self.late_loads:
            profile.comments.append(self._late_note())
        for path in sorted(self.unwatched_code_frees):
            profile.comments.append(f"gpuflame agent: code objects freed in {path} are not seen (no code_dealloc "
                                    "found): code made again at a freed one's address keeps the old name")
        for pid, why in sorted(self.unverified.items()):
            profile.comments.append(f"gpuflame agent: pid {pid}'s Python was not walked ({why}): native stacks")
        for version in sorted(self.unsupported):
            profile.comments.append(f"gpuflame agent: Python {version} is not supported "
                                    f"({procs.supported_said()} are): its processes' allocations have native stacks")
        return profile

    def _rescan_every(self) -> float:
        return PID_RESCAN_SECONDS if self.pids else RESCAN_SECONDS  # a few watched processes are cheap to look at

    def _late_note(self) -> str:
        """What a driver file loaded after the agent started may have cost: the window before its probes."""
        n = len(self.late_loads)
        known = [ms for ms in self.late_loads.values() if ms is not None]
        window = (f"probed {max(known)} ms after the load at most" if len(known) == n
                  else f"probed at a rescan, up to {self._rescan_every():g} s after the load")
        return (f"gpuflame agent: {n} process{'es' if n > 1 else ''} loaded a driver file the agent had not probed "
                f"yet ({window}): allocations in between are missing, their frees counted as unknown")

    def stop(self) -> None:
        """Stop reading, book what is left, detach everything."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
        if self._ring is not None:
            self.poll(0)
            while self._ring.more:
                self.poll(0)
            self.counts["results_unread"] += len(self.pending.calls)
            self._ring.close()
            self._ring = None
        if self._obj is not None:
            self.final_stats = self.stats()
            self._obj.close()
            self._obj = None
        for proc in self.processes.values():
            proc.close()


def loss_notes(stats: dict[str, int], probes: str = "") -> list[str]:
    """What the profile does not hold, in words (a profile lost silently is a bug); the first note is always there."""
    notes = [f"gpuflame agent: {probes + '; ' if probes else ''}blocks allocated before the agent started are not "
             "known; their frees are ignored, so in-use counts only blocks allocated since"]
    said = {
        "lost_events": "events were lost (the ring buffer was full): the totals are short",
        "live_map_full": "blocks were not tracked in the kernel (live-block map full, raise --max-blocks): "
                         "their frees were matched in user space instead (each free one more event)",
        "calls_map_full": "driver calls were missed (too many threads inside the driver at once)",
        "unknown_frees": "frees of blocks allocated before the agent started were ignored",
        "unknown_frees_at_entry": "frees of addresses not known here were ignored (blocks allocated before the "
                                  "agent started, or frees the driver refused: entry-only probes see them all)",
        "not_registered": "allocations came before the agent knew the process: no Python stack for them",
        "no_thread": "allocations came from threads with no Python thread state",
        "truncated": "stacks were deeper than the frames recorded",
        "handler_errors": "events could not be booked (internal error)",
        "results_unknown": "allocations were not counted: entry-only probes, made before their call site's "
                           "return probe was placed, and their result was in memory the caller may have reused",
        "results_unread": "allocations were not counted: entry-only probes, their result was never read "
                          "(the process ended or the agent stopped before a return probe saw it)",
        "sites_unprobed": "return sites could not be probed (entry-only probes): results read at the next call",
        "stacks_over_limit": "allocations were booked under <stacks beyond the agent's limit> (too many distinct "
                             "stacks)",
        "sites_unverified": "return addresses were not probed: not verified as right after a call into the driver "
                            "in the file mapped there (entry-only probes); results read at the next call",
    }
    for key, text in said.items():
        if stats.get(key):
            notes.append(f"gpuflame agent: {stats[key]} {text}")
    return notes
