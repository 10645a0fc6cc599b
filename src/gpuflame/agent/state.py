"""The state the Agent's parts share, declared once with its types (no behaviour).

:class:`~gpuflame.agent.agent.Agent` is made of parts, one module each
(``probing.py``, ``registry.py``, ``booking.py``) that read and write the
same attributes. :class:`AgentState` is their common base: it only declares
those attributes (``Agent.__init__`` gives them their values) and, for the
type checker alone, the methods one part calls on another, so each part is
checked on its own against the same contract.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import mmap
    import subprocess
    import threading
    from collections.abc import Callable

    from gpuflame.agent.call_sites import Verifier
    from gpuflame.agent.ledger import Ledger
    from gpuflame.agent.libbpf import BpfObject, Map, RingBuffer
    from gpuflame.agent.pending import PendingResults
    from gpuflame.agent.process import Process
    from gpuflame.model.profile import Frame


class AgentState:
    """Declarations only: what the Agent's parts share."""

    # what the Agent was asked (its arguments)
    pids: list[int]  # the watched processes; empty: every process that loads the driver
    libcuda: list[str]  # driver files named by --libcuda
    native: bool
    max_blocks: int  # the kernel side's live-block map
    labels_for: Callable[[int], dict[str, str]] | None  # pid -> extra labels (Kubernetes), or None
    probes_asked: str  # auto | return | entry (procs.choose_probes)

    # probing.py: the BPF object, its maps and ring, the driver files probed
    probes: str  # return | entry, chosen at start
    probes_why: str
    cuda_seen: bool  # a process loaded the driver or allocated while we watched
    watch_loads: bool  # the kernel side tells of a driver file mapped (else: found at rescans)
    watch_opens: bool  # the kernel side tells of a driver file opened (probed before the process maps it)
    probed_on_open: int  # driver files probed from an open's word

    # holding.py: the hold on a process that opens a driver file not probed yet (--hold-late-drivers)
    hold: bool
    _hold_map: Map  # the hold's settings and the reader's sign of life, for the kernel side
    _held: Map  # tgid -> when the kernel side stopped it
    _probed_files: Map  # the kernel's (dev, inode) of each driver file probed
    _beat_ns: int
    _resumer: subprocess.Popen[bytes] | None  # resume.py: lets held processes go at the bound, or at our end
    _resumer_pipe: int  # its pipe's write end (-1: none)
    _obj_path: str
    _obj: BpfObject | None
    _ring: RingBuffer | None
    _multi: bool  # uprobe-multi links (else one perf event per probe)
    _skip: tuple[str, ...]  # optional programs this kernel refused
    _procs: Map  # pid -> where its interpreter is, for the BPF side
    _live: Map  # the kernel side's live blocks
    _stats: Map  # the BPF side's counters, per CPU
    _scanned: dict[int, dict[tuple[str, int], str]]  # pid -> the libcuda files it mapped at start
    attached: dict[tuple[int, int], str]  # (device, inode) -> a path of each driver file probed
    _unprobeable: set[tuple[int, int]]
    skipped: list[str]  # libcuda files found but not probed, and why (the first few)
    skipped_total: int  # how many in all
    missing_functions: set[str]
    single_stepped: set[str]  # probed functions not starting with push %rbp
    late_loads: dict[int, int | None]  # pid -> ms from its driver load to the probes (None: a rescan)
    late_frees: dict[int, int]  # pid (in late_loads) -> its frees of blocks allocated before those probes
    _late: Map  # the kernel side's late_loads: whose frees of blocks never seen are sent, to count
    _code_free_probes: set[tuple[int, int]]  # interpreter files whose code_dealloc is probed
    unwatched_code_frees: set[str]  # interpreters without one: a reused code address misnames

    # registry.py: the processes known
    processes: dict[int, Process]
    _labels: dict[int, dict[str, str]]
    _waiting: dict[int, float]  # pid -> until when to look for its interpreter
    _never_ready: set[int]  # processes whose thread list stayed empty through their window
    unverified: dict[int, str]  # pid -> why its CPython's layout was not trusted (py_layout)
    unsupported: set[str]  # Python versions seen without offsets

    # booking.py: the ring's records in the ledger, under interned stacks
    ledger: Ledger
    pending: PendingResults  # entry-only: allocations whose result is not read yet
    return_sites: dict[tuple[int, int, int], str]  # entry-only: (dev, inode, offset) probed
    _verifier: Verifier  # entry-only: return sites checked in their file before a probe
    _site_checks: dict[int, int]  # pid -> return addresses checked
    counts: dict[str, int]  # the reader's own counters (stats())
    first_event_ns: int
    _stacks: list[tuple[Frame, ...]]
    _stack_ids: dict[tuple[Frame, ...], int]
    _raw_stacks: dict[int, dict[bytes, int]]  # pid -> the frames as the BPF side sent them -> stack id
    _raw_bytes: int  # the raw stacks kept as keys
    max_stacks: int
    _exited: set[int]  # processes ended since the last forget_exited()
    _lock: threading.Lock  # the reader thread against snapshot() and rescans

    if TYPE_CHECKING:  # what one part calls on another (defined in probing.py and registry.py)

        def _register(self, pid: int, parent: Process | None = None) -> Process | None: ...

        def _wanted(self, pid: int) -> bool: ...

        def _watch_code_frees(self, proc: Process) -> None: ...

        def _driver_loaded(self, pid: int, mapped_ns: int) -> None: ...

        def _driver_opened(self, pid: int, fd: int, opened_ns: int) -> bool: ...

        def _hold_maps(self) -> None: ...

        def _note_probed(self, key: tuple[int, int]) -> None: ...

        def _note_opened(self, dev: int, ino: int) -> None: ...

        def _let_go(self, pid: int) -> None: ...

        def _beat(self, force: bool = False) -> None: ...

        def _stop_hold(self) -> None: ...

        def _let_all_go(self) -> None: ...

        def _read_ring(self, data: mmap.mmap, page: int, mask: int, consumer: int, stop: int) -> int: ...
