"""The node agent: uprobes on the CUDA driver of every process (or the chosen ones), frees included.

:class:`Agent` loads the BPF object, places the probes on each distinct
``libcuda.so`` file (a uprobe on a file's inode fires in every process that
maps it), tells the BPF side where each process's interpreter is, and reads
the events ring on one thread: allocations become rows of a
:class:`~gpuflame.agent.ledger.Ledger` keyed by the Python stack, frees and
process exits take them back. :meth:`Agent.snapshot` is the profile so far.

Its parts, one module each, share the Agent's state: ``probing.py`` (the BPF
object, driver files, uprobes), ``registry.py`` (the processes and their
interpreters), ``booking.py`` (each record of the ring into the ledger), all
on ``state.py``, which declares that shared state with its types; this module
gives the state its values and has the start, reader loop, snapshot and stop.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterable

from gpuflame.agent import alive, build, nvml, procs
from gpuflame.agent.booking import MAX_STACKS, Booking
from gpuflame.agent.call_sites import Verifier
from gpuflame.agent.events import (
    LIVE_BLOCKS,
    N_STATS,
    OUTPUT_TRIES,
    STAT_CALLS_FULL,
    STAT_FRAME_READS,
    STAT_LIVE_FULL,
    STAT_LOST_ALLOC_BYTES,
    STAT_LOST_ALLOCS,
    STAT_LOST_EVENTS,
    STAT_LOST_FREES,
    STAT_RING_REFUSED,
    STAT_UNKNOWN_FREES,
)
from gpuflame.agent.holding import HOLD_BOUND_MS, Holding
from gpuflame.agent.ledger import Ledger
from gpuflame.agent.pending import PendingResults
from gpuflame.agent.probing import UPROBE_PROGRAMS, AgentError, Probing, missing_privileges
from gpuflame.agent.registry import Registry
from gpuflame.model.profile import SYNTHETIC, Frame, Profile
from gpuflame.model.sample_types import memory_sample_types

__all__ = [
    "DRAIN_AT_STOP_S",
    "NO_CUDA_PROCESS",
    "OUTPUT_MODE",
    "UPROBE_PROGRAMS",
    "Agent",
    "AgentError",
    "loss_notes",
    "missing_privileges",
]

POLL_MS = 20
RESCAN_SECONDS = 2.0  # every process: new libcuda files and the processes mapping them
LATE_SAID = 5  # processes that loaded a driver file before its probes, each said in the profile; the rest summed
# the counters of what the profile does not hold (each said in its notes), as numbers for --json
LOSSES = (
    "lost_events",
    "ring_refused",
    "lost_allocs",
    "lost_alloc_bytes",
    "lost_frees",
    "left_in_ring",
    "unread_allocs",
    "unread_alloc_bytes",
    "results_unknown",
    "results_unknown_bytes",
    "results_unread",
    "results_unread_bytes",
    "sites_unverified",
    "sites_unprobed",
    "calls_map_full",
    "frees_not_undone",
    "unknown_frees",
    "unknown_frees_at_entry",
    "not_registered",
    "no_thread",
    "truncated",
    "stacks_over_limit",
    "handler_errors",
)
PID_RESCAN_SECONDS = 0.25  # --pid: the watched processes loading the driver
# at stop, once the probes are off: the most seconds spent reading what the ring still holds (a full 16 MiB
# ring of frees is about 300,000 records, 0.3-0.5 s to book); what is left unread is counted by its headers
# (past COUNT_AT_STOP_S, estimated) and said: 3 s on the ring in all (docs/agent.md)
DRAIN_AT_STOP_S = 2.5
COUNT_AT_STOP_S = 0.5  # then the most seconds spent counting what is left by its headers (else estimated)
BEFORE_AGENT = (Frame("<allocated before the agent started>", kind=SYNTHETIC),)

NO_CUDA_PROCESS = "gpuflame agent: no CUDA process was seen: no process loaded libcuda.so while the agent watched"
OUTPUT_MODE = 0o600  # the agent's profiles hold every process's stacks and pods: for their owner only


class Agent(Probing, Registry, Booking, Holding):
    """Probes, the ring reader thread, and what they have recorded.

    The attributes its parts share are declared, with their types, in :class:`~gpuflame.agent.state.AgentState`.
    """

    def __init__(
        self,
        pids: Iterable[int] = (),
        libcuda: Iterable[str] = (),
        native: bool = False,
        max_blocks: int = LIVE_BLOCKS,
        labels_for: Callable[[int], dict[str, str]] | None = None,
        probes: str = "auto",
        alive_file: str | None = None,
        nvml_library: str | None = nvml.LIBRARY,
        hold: bool = False,
    ) -> None:
        self.pids = sorted(set(pids))
        self.libcuda = list(libcuda)
        self.native = native
        self.max_blocks = max_blocks
        self.labels_for = labels_for
        self.probes_asked = probes
        self.alive_file = alive_file  # touched by the reader thread (alive.py)
        self.nvml_library = nvml_library  # None: do not ask NVML for what the probes did not see
        self.hold = hold  # stop a process that opens a driver file not probed yet until it is (holding.py)
        self._beat_ns = 0
        self._resumer = None
        self._resumer_pipe = -1
        self.nvml: nvml.Nvml | None = None
        self.cuda_seen = False
        self.watch_loads = self.watch_opens = False
        self.probed_on_open = 0
        self._code_free_probes = set()
        self.unwatched_code_frees = set()
        self._skip = ()
        self.late_loads = {}
        self.late_frees = {}
        self.probes = ""
        self.probes_why = ""
        self.pending = PendingResults()
        self.return_sites = {}
        self._verifier = Verifier()
        self._site_checks = {}
        self.ledger = Ledger()
        self.processes = {}
        self.attached = {}
        self.missing_functions = set()
        self.single_stepped = set()
        self.unsupported = set()
        self.unverified = {}
        self._never_ready = set()
        self.skipped = []
        self.skipped_total = 0
        self._unprobeable = set()
        self.counts = {
            "not_registered": 0,
            "no_thread": 0,
            "truncated": 0,
            "untracked": 0,
            "handler_errors": 0,
            "results_next_entry": 0,
            "results_unknown": 0,
            "results_unread": 0,
            "results_unknown_bytes": 0,
            "unread_allocs": 0,
            "held": 0,  # processes held at a driver file's open until its probes were in
            "held_past_bound": 0,  # of those, let go by the resumer at the bound, before the probes
            "held_ms_max": 0,  # the longest of the others' holds
            "unread_alloc_bytes": 0,
            "sites_unprobed": 0,
            "sites_unverified": 0,
            "stacks_over_limit": 0,
            "left_in_ring": 0,
            "left_in_ring_estimated": 0,
        }
        self.stop_steps: dict[str, tuple[float, float]] = {}
        self.started_ns = 0
        self.first_event_ns = 0
        self._stacks = []
        self._stack_ids = {}
        self._raw_stacks = {}
        self._raw_bytes = 0
        self.max_stacks = MAX_STACKS
        self._labels = {}
        self._waiting = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._obj = None
        self._ring = None
        self._multi = True
        self.final_stats: dict[str, int] = {}
        self._scanned = {}
        self._exited = set()

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
        if self.nvml_library:
            self.nvml = nvml.Nvml(self.nvml_library)
        self.started_ns = time.time_ns()
        if thread:
            self._thread = threading.Thread(target=self._loop, name="gpuflame-agent", daemon=True)
            self._thread.start()

    def watching(self) -> str:
        """What the one 'watching' line says."""
        who = f"pid {', '.join(map(str, self.pids))}" if self.pids else "every process that loads the CUDA driver"
        files = ", ".join(sorted({procs.as_seen(path) for path in self.attached.values()}))
        py = sum(1 for p in self.processes.values() if p.python)
        if self.attached:
            through = f"through {len(self.attached)} libcuda file(s): {files}"
        elif self.pids:
            through = (
                "(libcuda.so is not loaded yet: probed when it is; a driver file named otherwise is "
                "not found: give it with --libcuda PATH)"
            )
        else:
            through = "(no libcuda.so loaded yet: waiting for CUDA processes; each driver file is probed as it appears)"
        line = f"gpuflame agent: watching {who} ({len(self.processes)} now, {py} Python) {through}"
        line += f"; {self.probes_said()}"
        if self.single_stepped:
            line += (
                f"; note: {', '.join(sorted(self.single_stepped))} do not start with push %rbp, "
                "so the kernel single-steps their probes (slower calls)"
            )
        if self.hold:
            line += (
                "; a process that opens a driver file not probed yet is held until it is "
                f"(at most {HOLD_BOUND_MS / 1000:g} s; none with a terminal or a tracer)"
            )
        return line

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
        self._ring.wait(timeout_ms)  # not holding the lock: a snapshot may be taken meanwhile
        self._beat()  # (--hold-late-drivers) the kernel side holds a process only while the reader reads
        with self._lock:
            self._ring.drain(0)
            if self._waiting:
                self._retry_waiting()

    def stats(self) -> dict[str, int]:
        """The BPF side's counters, summed over CPUs, and the reader's."""
        if self._obj is None:
            return dict(self.final_stats or self.counts)
        out = dict(self.counts)
        names = {
            STAT_LOST_EVENTS: "lost_events",
            STAT_LIVE_FULL: "live_map_full",
            STAT_UNKNOWN_FREES: "unknown_frees",
            STAT_CALLS_FULL: "calls_map_full",
            STAT_RING_REFUSED: "ring_refused",
            STAT_LOST_ALLOCS: "lost_allocs",
            STAT_LOST_ALLOC_BYTES: "lost_alloc_bytes",
            STAT_LOST_FREES: "lost_frees",
            STAT_FRAME_READS: "frame_reads",
        }
        for i in range(N_STATS):
            raw = self._stats.lookup(i.to_bytes(4, "little"))
            out[names[i]] = sum(int.from_bytes(raw[k : k + 8], "little") for k in range(0, len(raw), 8)) if raw else 0
        out["frees_not_undone"] = self.ledger.undo_missed
        out["results_unread_bytes"] = self.pending.dropped_bytes
        if self._ring is None:  # stopped: what is still pending was never read (counted in results_unread)
            out["results_unread_bytes"] += self.pending.held_bytes()
        if self.probes == "entry":  # every free reaches user space at its entry, before the driver says no
            out["unknown_frees_at_entry"] = self.ledger.unmatched_frees
        else:  # after a live-map overflow the kernel sends the frees it does not know: matched here
            out["unknown_frees"] += self.ledger.unmatched_frees
        return out

    def snapshot(self) -> Profile:
        """Everything booked so far, as a profile (peak, in use, allocated)."""
        used = self.nvml.used() if self.nvml is not None else {}  # asked outside the lock: the reader goes on
        with self._lock:
            profile = Profile(sample_types=memory_sample_types(), default_type="peak_space")
            seen: dict[int, int] = {}  # pid -> GPU memory in use that the probes saw allocated
            for (pid, device), stack, values in self.ledger.rows():
                if device.startswith("cuda"):
                    seen[pid] = seen.get(pid, 0) + values[2]
                if not any(values):
                    continue
                labels = dict(self._labels.get(pid, {"pid": str(pid)}), device=device)
                profile.add(self._stacks[stack], values, labels)
            for pid in sorted(set(used) & (set(self.processes) | set(seen))):
                unseen = used[pid] - seen.get(pid, 0)
                if unseen > 0:  # held all along as far as the agent knows: at the peak and in use, never allocated
                    labels = dict(self._labels.get(pid, {"pid": str(pid)}), device="cuda")
                    profile.add(BEFORE_AGENT, (unseen, 0, unseen, 0, 0, 0), labels)
            stats = self.stats()
        profile.time_nanos = self.started_ns
        profile.duration_nanos = max(0, time.time_ns() - self.started_ns) if self.started_ns else 0
        profile.comments += loss_notes(stats, self.probes_said(), self.nvml)
        if not self.cuda_seen:
            profile.comments.append(NO_CUDA_PROCESS)
        if self.late_loads:
            profile.comments += self._late_notes()
        profile.comments += self._skipped_notes()
        for path in sorted(self.unwatched_code_frees):
            profile.comments.append(
                f"gpuflame agent: code objects freed in {path} are not seen (no code_dealloc "
                "found): code made again at a freed one's address keeps the old name"
            )
        for pid, why in sorted(self.unverified.items()):
            profile.comments.append(f"gpuflame agent: pid {pid}'s Python was not walked ({why}): native stacks")
        for version in sorted(self.unsupported):
            profile.comments.append(
                f"gpuflame agent: Python {version} is not supported "
                f"({procs.supported_said()} are): its processes' allocations have native stacks"
            )
        return profile

    def _stop_ring(self, began: float, drain_s: float) -> None:
        """Book what the (detached) ring holds for *drain_s* at most, count what is left, close it."""
        assert self._ring is not None
        at = time.monotonic()
        self._drain(at + drain_s)
        self.stop_steps["drain"] = (at - began, time.monotonic() - began)
        at = time.monotonic()
        left, exact = self._ring.left(at + COUNT_AT_STOP_S)
        self.stop_steps["count"] = (at - began, time.monotonic() - began)
        self.counts["left_in_ring"] += left
        self.counts["left_in_ring_estimated"] = int(not exact)
        self.counts["results_unread"] += len(self.pending.calls)
        self._ring.close()
        self._ring = None

    def _drain(self, deadline: float) -> None:
        """Book what the ring holds, a bounded chunk at a time, until it is empty or *deadline* (monotonic)."""
        assert self._ring is not None
        while time.monotonic() < deadline:
            self.poll(0)
            if not self._ring.more:
                return

    def _skipped_notes(self) -> list[str]:
        """Driver files found but not probed (a file named libcuda.so* need not be the driver): a few, then a count."""
        notes = [f"gpuflame agent: {why}: processes calling it are not seen" for why in self.skipped]
        more = self.skipped_total - len(self.skipped)
        if more:
            notes.append(f"gpuflame agent: {more} more driver files could not be probed")
        return notes

    def _rescan_every(self) -> float:
        return PID_RESCAN_SECONDS if self.pids else RESCAN_SECONDS  # a few watched processes are cheap to look at

    def losses(self) -> dict[str, object]:
        """What the profile's notes say it does not hold, as numbers (--json): each counter of LOSSES above 0,
        and per process that loaded a driver file before its probes, the window (None: found by a rescan) and
        the allocations made in it counted missing."""
        stats = self.stats()
        out: dict[str, object] = {key: stats[key] for key in LOSSES if stats.get(key)}
        if self.late_loads:
            out["late_driver"] = {
                str(pid): {"probed_ms_after_load": ms, "allocations_missing": self.late_frees.get(pid, 0)}
                for pid, ms in sorted(self.late_loads.items())
            }
        return out

    def _late_notes(self) -> list[str]:
        """What a driver file loaded after the agent started cost, per process (the first LATE_SAID, then the
        rest summed): the window before its probes, and the allocations made in it, counted by their frees
        (the kernel side sends a late process's frees of blocks it never saw)."""
        pids = sorted(self.late_loads)
        notes = []
        for pid in pids[:LATE_SAID]:
            notes.append(
                f"gpuflame agent: pid {pid} loaded a driver file the agent had not probed yet "
                f"({self._window([pid])}): {self.late_frees.get(pid, 0)} allocations made before its probes "
                "were in are missing, counted by their frees since (a block still held is not counted)"
            )
        rest = pids[LATE_SAID:]
        if rest:
            missed = sum(self.late_frees.get(pid, 0) for pid in rest)
            notes.append(
                f"gpuflame agent: {len(rest)} more processes loaded a driver file the agent had not probed yet "
                f"({self._window(rest)}): {missed} allocations made before its probes were in are missing, "
                "counted by their frees since (a block still held is not counted)"
            )
        return notes

    def _window(self, pids: list[int]) -> str:
        """How long after their load the probes of *pids*' driver files came (at most)."""
        known = [ms for pid in pids if (ms := self.late_loads.get(pid)) is not None]
        if len(known) == len(pids):
            return f"probed {max(known)} ms after the load{' at most' if len(pids) > 1 else ''}"
        return f"probed at a rescan, up to {self._rescan_every():g} s after the load"

    def stop(self, drain_s: float = DRAIN_AT_STOP_S) -> None:
        """Stop the reader, detach the probes, book what the ring holds for *drain_s* at most, count the rest.

        Detached first: a watched process that floods the driver fills the ring as fast as it is read, so a
        drain before the detach would last as long as the flood. After it, the ring holds what it holds
        (16 MiB at most), read until empty or until *drain_s* has passed; what is left is counted by its
        headers (``left_in_ring``, said in the profile). :attr:`stop_steps` says when each step began and
        ended (seconds since the stop began)."""
        began = time.monotonic()
        self._stop.set()
        self._stop_hold()  # before all: no process is left held
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
        if self._obj is not None:
            at = time.monotonic() - began
            self._obj.detach()
            self._let_all_go()  # none can be held from now on
            self.stop_steps["detach"] = (at, time.monotonic() - began)
        if self._ring is not None:
            self._stop_ring(began, drain_s)
        if self._obj is not None:
            self.final_stats = self.stats()
            self._obj.close()
            self._obj = None
        for proc in self.processes.values():
            proc.close()
        if self.nvml is not None:
            self.nvml.close()


def lost_events_note(stats: dict[str, int]) -> list[str]:
    """The events the ring did not take, by cause and by what they were (allocations and their bytes, frees)."""
    lost = stats.get("lost_events", 0)
    if not lost:
        return []
    refused = stats.get("ring_refused", 0)
    causes = [f"{lost - refused} to a full ring buffer (the reader was behind)"] if lost > refused else []
    if refused:
        causes.append(f"{refused} refused by the ring buffer while it had room (each tried {OUTPUT_TRIES} times)")
    allocs, frees = stats.get("lost_allocs", 0), stats.get("lost_frees", 0)
    what = (
        f"{allocs} allocations ({stats.get('lost_alloc_bytes', 0)} bytes), {frees} frees, "
        f"{max(0, lost - allocs - frees)} other records"
    )
    return [f"gpuflame agent: {lost} events were lost, {'; '.join(causes)}: {what}; the totals are short"]


def loss_notes(stats: dict[str, int], probes: str = "", gpu: nvml.Nvml | None = None) -> list[str]:
    """What the profile does not hold, in words (a profile lost silently is a bug); the first note is always there."""
    said_probes = probes + "; " if probes else ""
    if gpu is not None and gpu.ready:
        first = (
            f"gpuflame agent: {said_probes}GPU memory a process held that the probes did not see allocated "
            "is under <allocated before the agent started>, from NVML's per-process figure (which also counts "
            "the driver's own memory for the process, its CUDA context); frees of blocks allocated before the "
            "agent started are ignored"
        )
    else:
        why = f" ({gpu.missing}: how much they hold is not known)" if gpu is not None else ""
        first = (
            f"gpuflame agent: {said_probes}blocks allocated before the agent started are not known{why}; their "
            "frees are ignored, so in-use counts only blocks allocated since"
        )
    notes = [first, *lost_events_note(stats)]
    said = {
        "live_map_full": "blocks were not tracked in the kernel (live-block map full, raise --max-blocks): "
        "their frees were matched in user space instead (each free one more event)",
        "calls_map_full": "driver calls were missed (too many threads inside the driver at once)",
        "unknown_frees": "frees of blocks allocated before the agent started were ignored",
        "unknown_frees_at_entry": "frees of addresses not known here were ignored (blocks allocated before the "
        "agent started, or frees the driver refused: entry-only probes see them all)",
        "frees_not_undone": "frees the driver refused stayed booked (each is booked at its call's entry; the "
        "record to undo it was lost): their blocks are missing from in use",
        "not_registered": "allocations came before the agent knew the process: no Python stack for them",
        "no_thread": "allocations came from threads with no Python thread state",
        "truncated": "stacks were deeper than the frames recorded",
        "handler_errors": "events could not be booked (internal error)",
        "results_unknown": f"allocations ({stats.get('results_unknown_bytes', 0)} bytes) were not counted: "
        "entry-only probes, made before their call site's return probe was placed, and their result was in "
        "memory the caller may have reused",
        "results_unread": f"allocations ({stats.get('results_unread_bytes', 0)} bytes) were not counted: "
        "entry-only probes, their result was never read (the process ended or the agent stopped before a "
        "return probe saw it)",
        "unread_allocs": f"allocations ({stats.get('unread_alloc_bytes', 0)} bytes) are missing: their process "
        "could not be read (it had ended, or /proc refused it) when its first stack came",
        "sites_unprobed": "return sites could not be probed (entry-only probes): results read at the next call",
        "stacks_over_limit": "allocations were booked under <stacks beyond the agent's limit> (too many distinct "
        "stacks)",
        "left_in_ring": f"events left in the ring at stop were not read (read for {DRAIN_AT_STOP_S:g} s at most "
        "once the probes were off): the totals are short",
        "sites_unverified": "return addresses were not probed: not verified as right after a call into the driver "
        "in the file mapped there (entry-only probes); results read at the next call",
    }
    for key, text in said.items():
        if stats.get(key):
            about = "about " if key == "left_in_ring" and stats.get("left_in_ring_estimated") else ""
            notes.append(f"gpuflame agent: {about}{stats[key]} {text}")
    return notes
