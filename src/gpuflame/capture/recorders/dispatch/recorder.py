"""The dispatch recorder: sites, tables, threads and the profile of the ``torch`` backend's dispatch mode.

Standard library only until :meth:`TorchTensorRecorder.start`, which imports
torch and then the mode (mode.py). The books are the ledger's (ledger.py),
the stacks the interned tree of stacks.py.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from types import FrameType
from typing import Any

from gpuflame.boundary.backends import TORCH
from gpuflame.capture.base import Recorder, empty_profile
from gpuflame.capture.books import categories, joint_peak, phase_table, phases, site_row
from gpuflame.capture.exit_hooks import HOOKS
from gpuflame.capture.recorders.dispatch.block_categories import LedgerCategories
from gpuflame.capture.recorders.dispatch.ledger import Ledger
from gpuflame.capture.recorders.dispatch.stacks import Stacks
from gpuflame.model import phases as phase_model
from gpuflame.model.history import History, of_track
from gpuflame.model.peak import PeakUnit
from gpuflame.model.profile import Profile
from gpuflame.model.sample_types import JOINT_PEAK_OBJECTS, JOINT_PEAK_SPACE
from gpuflame.model.timeline import Timeline

OWN_THREAD_PREFIX = "gpuflame-"


class TorchTensorRecorder(Recorder):
    """Tensor storages made by torch operations after ``start()``, per Python stack and device."""

    marks_known_phases = True
    name = f"{TORCH} (dispatch)"  # in errors: which of the two torch recorders failed
    backend = TORCH

    def __init__(self, follow_threads: bool = True) -> None:
        super().__init__()
        self.follow_threads = follow_threads
        self.ledger = Ledger()
        self.stacks = Stacks()
        # (node above the frame, id(code), f_lasti, torch.device) -> site: one
        # dict lookup per allocation finds both the stack and the device
        self.sites: dict[tuple[int, int, int, Any], int] = {}
        self.site_keys: list[tuple[int, str]] = []  # site -> (stack node, device name)
        self.site_phase: list[int] = []  # site -> phase id (capture/books/phases.py) its allocations were made in
        self.phased: dict[tuple[int, int], int] = {}  # (site of phase 0, phase id) -> site
        self.skipped = 0
        self._hook: Any = None  # the compiled hook module, for the run's shared peak tables
        self._tables: dict[str, int] = {}  # device -> table handle (-1: none)
        self._generations: dict[str, str] = {}  # device -> the table generation joined (model/peak.py)
        self._table_problem = ""
        self._mode: Any = None
        self._previous_thread_profile: Any = None
        self._thread_hook_installed = False
        self._kinds = LedgerCategories(self)
        _LIVE_RECORDERS.add(self)

    def after_fork(self) -> None:
        """In a forked child: new locks, and a new window.

        Locks are remade because another thread may have held one at the
        fork. The child's window starts at the fork: what the parent made
        before it is the parent's (in the parent's profile), so the child
        starts an empty ledger over the same sites; the parent's storages
        report their deaths to the old ledger, which nobody reads.
        """
        self.stacks.lock = threading.Lock()
        self._error_lock = threading.Lock()
        old = self.ledger
        old.publishing = False  # the parent's storages dying here are not this process's events
        ledger = Ledger(self._hook)
        ledger.alloc_bytes = [0] * len(old.alloc_bytes)
        ledger.alloc_count = [0] * len(old.alloc_count)
        ledger.site_device[:] = old.site_device
        ledger.site_table[:] = old.site_table
        ledger.frozen = old.frozen
        ledger.site_for = self.site_in_phase
        self.ledger = ledger
        if phases.current():
            ledger.append((None, phases.current(), time.time_ns()))
        if not ledger.frozen:
            for device, handle in self._tables.items():
                if handle >= 0:
                    self._join(device, handle)  # a slot of its own in the run's table
        if self._mode is not None:
            self._mode.follow(ledger)

    # -- Recorder -------------------------------------------------------------

    def _start(self) -> None:
        import torch  # noqa: F401 - the backend needs torch; ImportError is reported by start()

        self._hook = self._table_hook()
        self._tables = {}
        self._generations = {}
        self.ledger = Ledger(self._hook)
        self.ledger.site_for = self.site_in_phase
        self.sites = {}
        self.site_keys = []
        self.site_phase = []
        self.phased = {}
        self._listen_to_phases()  # started inside a phase: it runs from here
        self._mode = _make_mode(self)
        self._mode.__enter__()
        if self.follow_threads:
            self._previous_thread_profile = threading.getprofile()
            threading.setprofile(self._thread_hook)
            self._thread_hook_installed = True
            self._say_threads_not_followed()
        self._kinds.start()

    def _stop(self) -> None:
        mode, self._mode = self._mode, None
        self._stop_listening()
        self._kinds.stop()
        self._unhook_threads()
        if mode is not None:
            mode.on = False
            from gpuflame.capture.recorders.dispatch.mode import pop_if_top

            pop_if_top(mode)
        self._leave_tables()
        self.ledger.freeze()

    def _on_phase(self, phase_id: int, now: int) -> None:
        self.ledger.append((None, phase_id, now))  # replayed in order with the allocations

    def site_in_phase(self, site: int, phase_id: int) -> int:
        """The site booking *site*'s allocations made in *phase_id* (made on first use, under the ledger's lock)."""
        found = self.phased.get((site, phase_id))
        if found is None:
            with self.stacks.lock:
                device = self.ledger.site_device[site]
                found = self.ledger.new_site(device, self.ledger.site_table[site])
                self.site_keys.append(self.site_keys[site])
                self.site_phase.append(phase_id)
                self.phased[(site, phase_id)] = found
        return found

    def _table_hook(self) -> Any:
        """The compiled module that holds the run's shared peak tables; None outside a run or without it."""
        self._table_problem = ""
        if not joint_peak.table_path("cpu"):
            return None
        from gpuflame.capture.recorders.allocator.native import NativeUnavailable, load_cpu_hook

        try:
            return load_cpu_hook()
        except NativeUnavailable as exc:
            self._table_problem = (
                f"this process did not publish to the run's shared peak table ({exc}): "
                "its peak merges with other processes' as a bound"
            )
            return None

    def _table_for(self, device: str) -> int:
        """The run's table of *device* for this process, joined on first use; -1 for none."""
        handle = self._tables.get(device)
        if handle is None:
            handle, problem = joint_peak.claim(self._hook, device) if self._hook is not None else (-1, "")
            if handle >= 0 and not self._join(device, handle):
                joint_peak.release(device, handle)
                handle, problem = -1, f"the run's shared peak table of {device} is full or unusable"
            self._table_problem = self._table_problem or problem
            if problem:
                self.lose(problem)
            self._tables[device] = handle
        return handle

    def _join(self, device: str, handle: int) -> bool:
        if not self._hook.table_join(handle):
            return False
        self._generations[device] = self._hook.table_info(handle)
        return True

    def _leave_tables(self) -> None:
        """This process's bytes stop counting in the run's tables (a last mark is queued first)."""
        for device, handle in list(self._tables.items()):
            if handle >= 0:
                try:
                    self._hook.table_leave(handle, device, self.ledger.append)
                finally:
                    joint_peak.release(device, handle)
        self._tables = {}

    def _degrade(self) -> None:
        if self._mode is not None:
            self._mode.on = False
        self._stop_listening()
        self._kinds.stop()
        self._unhook_threads()

    def _snapshot(self) -> Profile:
        ledger = self.ledger
        rows = self._kinds.rows()
        phase_rows = ledger.phase_rows()
        joint = dict(ledger.joint_at)
        profile = empty_profile()
        if joint:
            profile.sample_types += [JOINT_PEAK_SPACE, JOINT_PEAK_OBJECTS]
        pid = str(os.getpid())
        devices = set()
        for (site, category), values in rows.items():
            sid, device = self.site_keys[site]
            devices.add(device)
            labels = {"device": device, "pid": pid, categories.LABEL: category}
            if phase_rows:  # a recording that saw a phase: every sample says its phase
                labels[phase_model.LABEL] = phases.name_of(self.site_phase[site])
            profile.add(self.stacks.frames(sid), site_row.sample_values(values, bool(joint)), labels)
        out = profile.compact()
        out.default_type = profile.default_type
        out.comments = self._comments()
        out.peaks = [self._peak_unit(d, joint.get(d)) for d in sorted(devices)]
        out.phases = self._phase_table(phase_rows, devices)
        out.history = self._history()
        if out.history is not None:  # the strip, from the history's log: this backend keeps no other
            out.timeline = self._timeline(out.history.tracks[0].end)
        return out

    def _phase_table(self, raw: list[Any], devices: set[str]) -> list[Any]:
        """The phase table; the ledger's totals span devices, so it is labelled with the one device, or ''."""
        device = next(iter(devices)) if len(devices) == 1 else ""
        window = (self.started_ns, self.stopped_ns or time.time_ns())
        return phase_table.stats(raw, device, str(os.getpid()), window, self._leaf_name)

    def _leaf_name(self, site: int) -> str:
        frames = self.stacks.frames(self.site_keys[site][0])
        return frames[0].name if frames else ""

    def _timeline(self, end: int) -> Timeline:
        with self.ledger.lock:
            lines = self.ledger.log.lines()
        timeline = Timeline()
        for device, points in lines.items():
            if end > points[-1][0]:
                points.append((end, points[-1][1]))
            timeline.add_series((("device", device), ("pid", str(os.getpid()))), points)
        return timeline

    def _history(self) -> History | None:
        """The event history so far (model/history.py); None when nothing was recorded."""
        ledger = self.ledger
        with ledger.lock:
            ledger._process()
            log = ledger.log
            if not len(log.times) and not log.folded:
                return None
            track = log.track(self.stopped_ns or time.time_ns(), (("pid", str(os.getpid())),))
        track.start = min(track.start, self.started_ns or track.start)
        if not track.folded:
            track.fold = track.start
        site_keys = self.site_keys  # the log's sites are keys: site and category tag (categories.history_key)
        frames = self.stacks.frames
        return of_track(track, lambda k: frames(site_keys[categories.history_site(k)][0]), self._kinds.history_labels)

    def _peak_unit(self, device: str, mark: tuple[int, int] | None) -> PeakUnit:
        """This process's own peak on *device*, and where it stood in the run's table (if any)."""
        end = self.stopped_ns or time.time_ns()
        table = self._generations.get(device, "") if mark is not None else ""
        epoch, table_max = mark if mark is not None and table else (0, 0)
        return PeakUnit(
            device, start=self.started_ns, end=end, pid=str(os.getpid()), table=table, epoch=epoch, table_max=table_max
        )

    # -- recording (called from the dispatch mode) ----------------------------

    def new_site(self, key: tuple[int, int, int, Any], f: FrameType) -> int:
        """The site of ``(node above f, id(code), f_lasti, device)``; -1 for meta tensors (no memory)."""
        with self.stacks.lock:
            site = self.sites.get(key)
            if site is not None:
                return site
        above, code_id, lasti, device = key
        node = self.stacks.node((above, code_id, lasti), f.f_code)
        with self.stacks.lock:
            site = self.sites.get(key)
            if site is None:
                if device.type == "meta":
                    site = -1
                else:
                    name = str(device)
                    site = self.ledger.new_site(name, self._table_for(name))
                    self.site_keys.append((node, name))
                    self.site_phase.append(0)
                self.sites[key] = site
            return site

    def site_of_stack(self, depth: int, device: Any) -> int:
        """The site of the code *depth* frames above this function's caller (slow paths only)."""
        f = sys._getframe(depth + 1)
        tag = f.f_trace
        above = tag if type(tag) is self.stacks.Tag else self.stacks.above(f)
        key = (above, id(f.f_code), f.f_lasti, device)
        site = self.sites.get(key)
        return site if site is not None else self.new_site(key, f)

    # -- threads --------------------------------------------------------------

    def _thread_hook(self, frame: FrameType, event: str, arg: Any) -> Any:
        """First profile event of a new thread: enter the mode there, then get out of the way."""
        previous = self._previous_thread_profile
        sys.setprofile(previous)
        mode = self._mode
        # gpuflame's own threads (snapshots, pushing) make no tensors; a mode
        # left in their thread-local state is torn down by torch after the
        # interpreter is gone when they outlive it, which aborts the process
        ours = threading.current_thread().name.startswith(OWN_THREAD_PREFIX)
        if mode is not None and mode.on and not ours:
            try:
                from gpuflame.capture.recorders.dispatch.mode import push_in_this_thread

                push_in_this_thread(mode)
            except Exception as exc:  # noqa: BLE001
                self.fail("could not follow a new thread", "that thread's tensors are not recorded", exc, False)
        if previous is not None:
            return previous(frame, event, arg)
        return None

    def _say_threads_not_followed(self) -> None:
        """Name the threads already running, whose tensors this mode never sees (it is entered per thread).

        A pool started before torch was imported, or torch imported first in a worker thread (recording
        starts there), left the pool's or the main thread's tensors out without a word: 1 MiB shown of
        13 MiB held. Daemon threads (a notebook kernel's, a server's) are left unnamed: they rarely make
        tensors, and naming them at every recording would be noise.
        """
        here, main = threading.current_thread(), threading.main_thread()
        unseen = [
            t.name
            for t in threading.enumerate()
            if t is not here and not t.name.startswith(OWN_THREAD_PREFIX) and (t is main or not t.daemon)
        ]
        if unseen:
            names = ", ".join(unseen[:4]) + (f" and {len(unseen) - 4} more" if len(unseen) > 4 else "")
            self.lose(
                f"tensors made in the {len(unseen)} thread(s) already running when recording started ({names}) "
                "are not recorded: a dispatch mode is entered per thread (--torch-hook allocator records every thread)"
            )

    def _unhook_threads(self) -> None:
        if self._thread_hook_installed:
            self._thread_hook_installed = False
            if threading.getprofile() == self._thread_hook:
                threading.setprofile(self._previous_thread_profile)

    def _comments(self) -> list[str]:
        notes = [
            "gpuflame torch backend: tensor storages made by torch operations after start(), "
            "per Python stack; bytes are untyped_storage().nbytes(), one storage is one object; "
            "storages that existed before start() are not counted",
        ]
        if self._table_problem:
            notes.append(self._table_problem)
        if self.skipped:
            notes.append(f"{self.skipped} outputs had no readable storage (sparse, nested or subclass tensors)")
        if _compiled_graphs():
            notes.append(
                "torch.compile compiled code in this process: what its generated code allocates (gradients "
                "and outputs of compiled training steps included) is not seen by the dispatch recorder; "
                "--torch-hook allocator (CPU) or torch-cuda (GPU) sees it"
            )
        return notes


def _compiled_graphs() -> int:
    """How many graphs torch.compile made in this process (its own count; 0 when it never ran or cannot say)."""
    utils = sys.modules.get("torch._dynamo.utils")
    try:
        return int(utils.counters["stats"]["unique_graphs"]) if utils is not None else 0
    except Exception:  # noqa: BLE001 - a private counter: its absence only loses the note
        return 0


_LIVE_RECORDERS: weakref.WeakSet[TorchTensorRecorder] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for recorder in list(_LIVE_RECORDERS):
        recorder.after_fork()


HOOKS.at_fork_child(_after_fork_in_child)


def _make_mode(recorder: TorchTensorRecorder) -> Any:
    """A dispatch mode bound to *recorder*; imports the mode's module, so only once torch is imported."""
    from gpuflame.capture.recorders.dispatch.mode import RecordingMode

    return RecordingMode(recorder)
