"""Backend ``torch`` on the CPU: every allocation of PyTorch's CPU allocator, with its Python stack.

The fast way to record CPU tensors. A small C++ hook
(``native/cpu_hook.cpp``, compiled on first use against the running torch)
wraps the CPU allocator: each allocation books its size under the Python
stack that asked for it, each free finds its booking. Nothing runs per
operation, so a workload pays for its allocations only, not for its
operations (a dispatch mode pays a trip through Python for every one).

What it sees, by construction: real allocations. A view, a transpose, an
in-place op allocate nothing and book nothing; a tensor made before
``start()`` was not booked, so touching or freeing it books nothing;
``resize_`` that grows a storage books the new block at its caller and frees
the old one; temporaries a kernel allocates and frees inside one operation
count towards the peak (they were really there). Allocations from threads
with no Python stack (PyTorch's own worker threads) go to
``<no Python stack>``.

Blind spots: memory that does not come from PyTorch's CPU allocator
(numpy arrays shared with ``from_numpy``, memory-mapped ``torch.load``,
oneDNN's own caches, libraries with their own allocators); another
allocator installed after ours. To get the stack, a thread that released
the GIL around an operation takes it back for a moment, as PyTorch's own
CUDA memory history does; with several Python threads busy at once this
can slow them.
"""

from __future__ import annotations

import os
import threading
import time
from types import ModuleType

from gpuflame.boundary.backends import TORCH
from gpuflame.capture.base import Recorder, empty_profile
from gpuflame.capture.books import categories, joint_peak, phase_table, phases, site_row
from gpuflame.capture.code_frames import CodeFrames
from gpuflame.capture.exit_hooks import HOOKS
from gpuflame.capture.recorders.allocator.block_categories import HookCategories
from gpuflame.capture.recorders.allocator.native import elf_symbols
from gpuflame.model import history as event_history
from gpuflame.model import phases as phase_model
from gpuflame.model.history import History, Track, of_track
from gpuflame.model.peak import PeakUnit
from gpuflame.model.profile import NATIVE, SYNTHETIC, Frame, Profile
from gpuflame.model.sample_types import JOINT_PEAK_OBJECTS, JOINT_PEAK_SPACE
from gpuflame.model.timeline import Timeline
from gpuflame.symbols.names import native_address_name, short_cpp_name

NO_PYTHON_FRAME = Frame("<no Python stack>", kind=SYNTHETIC)
HISTORY_LOST = (
    "the event history was lost (gpuflame ran out of memory keeping it): --at and --between "
    "are not available for this profile"
)

_busy_lock = threading.Lock()
_busy: TorchAllocatorRecorder | None = None  # the hook is one per process: one recorder at a time


def _ending_at(points: list[tuple[int, int]], end: int) -> list[tuple[int, int]]:
    """The hook's timeline with its last point (the present when read) at the window's *end*.

    Read after stop() and the categories' walk, the present ran past the window: the strip went on
    flat where the history, which ends at stop(), knew nothing (``--at`` there said 0 B).
    """
    if len(points) > 0 and points[-1][0] > end:
        earliest = points[-2][0] + 1 if len(points) > 1 else end
        points[-1] = (max(end, earliest), points[-1][1])
    return points


class HookBusy(RuntimeError):
    """Another recorder of this process holds the CPU allocator hook."""


class TorchAllocatorRecorder(Recorder):
    """CPU allocations through PyTorch's allocator after ``start()``, per Python stack."""

    marks_known_phases = True
    name = f"{TORCH} (allocator hook)"  # in errors: which of the two torch recorders failed
    backend = TORCH
    final_after_stop = True  # stop() keeps the books (self._final): the history is handed over, not copied

    def __init__(self, hook: ModuleType | None = None, native: bool = False) -> None:
        super().__init__()
        self._hook = hook
        self.native = native  # also the C++ frames between the allocator and the Python caller
        self._native_frames: dict[int, Frame] = {}
        self._frames = CodeFrames()
        self._stacks: list[list[Frame]] = []  # site -> frames, leaf first, as fetched from the hook
        self._site_phase: list[int] = []  # site -> the phase id its stack's marker frame says (0: none)
        # the hook's books are one per process and the next window resets them, so the
        # books of a stopped window are copied out at stop(): (rows, totals, timeline)
        self._final: tuple[list[tuple[int, ...]], dict[str, int], list[tuple[int, int]], list] | None = None
        self._table = -1  # the run's shared peak table for the CPU (capture/books/joint_peak.py), -1 for none
        self._table_problem = ""
        self._kinds = HookCategories(self)
        self._final_history: tuple | None = None  # the hook's history() at stop()
        self._history_dropped = False

    # -- Recorder -------------------------------------------------------------

    def _start(self) -> None:
        global _busy
        if self._hook is None:
            from gpuflame.capture.recorders.allocator.native import load_cpu_hook

            self._hook = load_cpu_hook()
        if hasattr(self._hook, "ints_text"):
            event_history.use_ints_text(self._hook.ints_text)  # the history's columns written in C
        with _busy_lock:
            if _busy is not None and _busy is not self:
                raise HookBusy("another gpuflame recording holds the CPU allocator hook")
            _busy = self
        self._table, self._table_problem = joint_peak.claim(self._hook, "cpu")
        if self._table_problem:
            self.lose(self._table_problem)
        self._final_history = None
        try:
            self._hook.history_limit(event_history.MAX_EVENTS)
            self._hook.start(self.native, self._table)
        except Exception:
            self._release()
            raise
        self._final = None
        self._kinds.start()
        self._listen_to_phases()

    def _entered_phase(self, phase_id: int) -> None:
        assert self._hook is not None  # called by _start, which loaded it
        self._hook.set_phase(phase_id)  # started inside a phase (or none): it runs from here

    def _on_phase(self, phase_id: int, _now: int) -> None:
        hook = self._hook
        if hook is not None and _busy is self:
            hook.set_phase(phase_id)

    def _stop(self) -> None:
        try:
            if self._hook is not None and _busy is self:
                self._hook.stop()
                self._stop_listening()
                self._kinds.stop()
                hook = self._hook
                self._final = (
                    hook.rows(),
                    hook.totals(),
                    _ending_at(hook.timeline(), self.stopped_ns),
                    hook.phase_rows(),
                )
                self._final_history = hook.history(True)  # handed over, not copied: the window is over
        finally:
            self._release()

    def peak_now(self) -> tuple[int, int] | None:
        """The window's peak and in-use bytes from the hook's totals: what the profile's would sum to."""
        hook = self._hook
        if hook is None or not self.running or _busy is not self:
            return None
        totals = hook.totals()
        return int(totals["peak"]), int(totals["inuse"])

    def _degrade(self) -> None:
        try:
            self._stop()
        except Exception:  # noqa: BLE001 - degrading must not raise
            pass

    def _snapshot(self) -> Profile:
        profile = empty_profile()
        hook = self._hook
        if hook is None or not self.started_ns:  # never started: nothing of this recorder's
            return profile
        if self._final is not None:
            rows, totals, points, phase_rows = self._final
        else:
            rows, totals, points, phase_rows = hook.rows(), hook.totals(), hook.timeline(), hook.phase_rows()
        self._fetch_stacks(hook)  # after the books: every site they name has its stack
        labels = {"device": "cpu", "pid": str(os.getpid())}
        joint = bool(totals.get("joint_table"))
        if joint:
            profile.sample_types += [JOINT_PEAK_SPACE, JOINT_PEAK_OBJECTS]
        for (site, category), values in self._kinds.rows(rows).items():  # tags the live blocks, in the history too
            extra = {categories.LABEL: category}
            if phase_rows:  # a recording that saw a phase: every sample says its phase
                extra[phase_model.LABEL] = phases.name_of(self._site_phase[site])
            profile.add(self._stacks[site], site_row.sample_values(values, joint), labels | extra)
        out = profile.compact()
        out.default_type = profile.default_type
        out.comments = self._comments(totals)
        out.peaks = [self._peak_unit(totals)]
        window = (self.started_ns, self.stopped_ns or time.time_ns())
        out.phases = phase_table.stats(phase_rows, "cpu", labels["pid"], window, self._leaf_name)
        if points:  # labelled as the samples are, so the viewer's label selector picks both
            out.timeline = Timeline()
            out.timeline.add_series(tuple(sorted(labels.items())), points)
        raw_history = self._final_history if self._final is not None else hook.history()  # after the tags
        self._fetch_stacks(hook)  # sites made since the books were read
        out.history = self._history(raw_history) if raw_history is not None else None
        if out.history is None and self._history_dropped:
            out.comments.append(HISTORY_LOST)
        return out

    def _history(self, raw: tuple) -> History | None:
        """The hook's event history as the model's (model/history.py); None when it has none to give.

        The columns stay the bytes the hook made (read through memoryviews, no copy), its sites
        already numbered by their rank among those used, as of_track would number them. The hook's
        keys are its sites and its blocks' category tags: each becomes a site whose labels say the
        category (block_categories.py).
        """
        fold, folded, dropped, base, times, sites, sizes, used = raw
        self._history_dropped = bool(dropped)
        if dropped or not (times or folded):
            return None
        start = self.started_ns
        track = Track(
            (("pid", str(os.getpid())),),
            start,
            self.stopped_ns or time.time_ns(),
            fold if folded else start,
            folded,
            {s: (b, c) for s, b, c in base},
            memoryview(times).cast("q"),
            memoryview(sites).cast("I"),
            memoryview(sizes).cast("q"),
        )
        kinds = self._kinds
        return of_track(track, lambda key: self._stacks[categories.history_site(key)], kinds.history_labels, used=used)

    # -- helpers --------------------------------------------------------------

    def after_fork(self) -> None:
        """A forked child's window starts at the fork: the parent's blocks are the parent's."""
        if self.running and self._hook is not None:
            self._hook.new_window()
            self._hook.set_phase(phases.current())  # the child's books start in the phase running at the fork

    def _release(self) -> None:
        global _busy
        joint_peak.release("cpu", self._table)
        with _busy_lock:
            if _busy is self:
                _busy = None

    def _fetch_stacks(self, hook: ModuleType) -> None:
        frames = self._frames
        for stack in hook.stacks(len(self._stacks)):
            marker = stack[-1] if stack else (0, 0)
            self._site_phase.append(-marker[1] if marker[0] is None and marker[1] < 0 else 0)
            native = [self._native_frame(hook, address) for code, address in stack if code is None and address >= 0]
            python = frames.python_frames(stack)
            out = native + frames.strip_plumbing(python) if python else native
            self._stacks.append(out or [NO_PYTHON_FRAME])

    def _leaf_name(self, site: int) -> str:
        return self._stacks[site][0].name

    def _native_frame(self, hook: ModuleType, address: int) -> Frame:
        """A C++ frame: its function (demangled, without arguments or template arguments) and its library."""
        frame = self._native_frames.get(address)
        if frame is None:
            name, file = hook.symbol(address)
            name = name or elf_symbols.name_of(address, file) or ""  # not exported: the full symbol table
            frame = Frame(short_cpp_name(name) if name else native_address_name(address), file, 0, NATIVE)
            self._native_frames[address] = frame
        return frame

    def _peak_unit(self, totals: dict[str, int]) -> PeakUnit:
        """This process's own peak, and where it stood in the run's table (if any)."""
        end = self.stopped_ns or time.time_ns()
        return PeakUnit(
            "cpu",
            start=self.started_ns,
            end=end,
            pid=str(os.getpid()),
            table=str(totals.get("joint_table") or ""),
            epoch=int(totals.get("joint_epoch", 0)),
            table_max=int(totals.get("joint_max", 0)),
        )

    def _comments(self, totals: dict[str, int]) -> list[str]:
        notes = [
            "gpuflame torch backend (CPU allocator hook): every allocation of PyTorch's CPU allocator "
            "after start(), per Python stack; bytes as requested from the allocator; blocks allocated "
            "before start() are not counted",
        ]
        if self._table_problem:
            notes.append(self._table_problem)
        if totals.get("lost"):
            notes.append(
                f"{totals['lost']} allocations could not be booked (gpuflame ran out of memory) "
                "and are missing from this profile"
            )
        if totals.get("unhooked"):
            notes.append(
                f"{totals['unhooked']} allocations came back from the allocator in a form "
                "the hook cannot follow and are not counted"
            )
        return notes


def hook_busy() -> bool:
    """Whether a recorder of this process holds the CPU allocator hook now."""
    return _busy is not None


def _after_fork_in_child() -> None:
    global _busy_lock
    _busy_lock = threading.Lock()  # another thread may have held it at the fork
    recorder = _busy
    if recorder is not None:
        recorder.after_fork()


HOOKS.at_fork_child(_after_fork_in_child)
