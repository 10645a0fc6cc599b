"""Backend ``torch``: tensor storages made by torch operations on any device, with the Python stack.

Works wherever torch runs (CPU, MPS, XPU, CUDA): a ``TorchDispatchMode``
sees every aten operation after autograd, so it sees what the user's Python
asked for, what autograd's backward computes, and factory calls. For each
operation it decides whether an output's storage is *new*:

- Ops whose schema says an output aliases an input (views such as ``view``,
  ``transpose``, ``expand``, ``detach``, slicing; in-place ops such as
  ``add_``, ``copy_``, ``zero_``) allocate nothing.
- Other outputs are new unless their storage is already known (``reshape``
  of a non-contiguous tensor is ``clone`` + ``_unsafe_view``, and the view
  shares the clone's storage) or, for ops whose names say they may alias
  without saying so in the schema (``_unsafe_view``, ``*alias*``), belongs
  to an input.
- ``resize_``, ``resize_as_`` and ``out=`` variants may grow a storage: its
  size is compared before and after; growth is a new allocation at this
  stack, and the old bytes are freed.
- ``torch.tensor(...)`` / ``as_tensor`` build the tensor below the dispatcher
  and hand it to ``lift_fresh``: its storage counts as new when torch owns it
  (``resizable()``; ``from_numpy`` memory is numpy's and is not counted).

A storage's size is ``untyped_storage().nbytes()``, one storage is one
object. Frees come from a weak reference on the storage's Python object,
which torch keeps alive exactly as long as the C++ storage (views, autograd's
saved tensors and ``.grad`` hold it, and so hold the bytes). Storages that
existed before ``start()`` are never counted, so touching an old tensor
(in-place ops, views) is not mistaken for allocating it.

Threads: dispatch modes are thread-local. The mode is entered in the thread
that calls ``start()`` and, through ``threading.setprofile``, in every
``threading.Thread`` started afterwards. Threads that were already running,
and threads started by C/C++ code outside ``threading``, are not seen
(autograd's own worker threads inherit the mode from the caller).

Blind spots (for the README): memory a kernel allocates and frees inside
one operation (workspaces, intermediate temporaries of fused or composite
C++ kernels) is invisible, so the true peak can be a little higher; storages
made without a dispatcher call (``torch.UntypedStorage(n)``, tensors
unpickled by ``torch.load`` into fresh storages, memory of C++ extensions
that bypass the dispatcher) are not seen; wrapper tensor subclasses are
seen only as their outputs; ``torch.compile`` still compiles and runs
compiled code as usual, but what Inductor's generated code allocates (it
calls the allocator directly) is not seen; the caching allocator's
reserved-but-free memory is not tensors and is not shown (the
``torch-cuda`` backend shows it).

Overhead: a dispatch mode costs a trip through Python for every operation,
so tiny, fast operations slow down most (see bench/bench_capture_torch.py).
Stacks cost O(1) per operation in the common case: see :class:`Stacks`.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any

from gpuflame.capture import auto_phases, categories, joint_peak, phase_table, phases
from gpuflame.capture.base import Recorder, empty_profile
from gpuflame.capture.code_frames import CodeFrames
from gpuflame.capture.ledger_phases import LedgerPhases
from gpuflame.capture.recorder_categories import LedgerCategories
from gpuflame.model import phases as phase_model
from gpuflame.model.history import EventLog, History, of_track
from gpuflame.model.peak import PeakUnit
from gpuflame.model.profile import Frame, Profile
from gpuflame.model.sample_types import JOINT_PEAK_OBJECTS, JOINT_PEAK_SPACE
from gpuflame.model.timeline import Timeline

# ops that may grow the storage of a tensor they write to
_RESIZING = frozenset({"aten::resize_", "aten::resize_as_", "aten::_resize_output_", "aten::set_"})


# =============================================================================
# the ledger: live storages, peak, totals per site
# =============================================================================


class _StorageRef(weakref.ref):
    """A weak reference to one storage's Python object, carrying its record.

    The same object is both events of a storage's life: it is queued once
    when the storage is made, and its callback (the ledger's ``on_free``)
    queues it again when the storage dies. ``seq`` says which: 0 = made, not
    yet counted; > 0 = live, counted as allocation number ``seq``; < 0 = gone.
    ``table`` is the run's shared peak table its bytes were published to
    (-1: none), so that its free is published there too.
    """

    __slots__ = ("cdata", "site", "nbytes", "seq", "table", "tag", "t0", "t1")  # tag: capture/categories.py
    # t0, t1: when it was made and when it died (epoch ns), for the event history

    cdata: int
    site: int
    nbytes: int
    seq: int
    table: int


class Ledger:
    """Peak / in-use / allocated bytes and counts per site.

    A site is one (stack, device). Recording an allocation only queues an
    event (no lock, no arithmetic); frees queue themselves from the weak
    reference's callback, into the same queue, so the queue holds the true
    order of events across threads. :meth:`_process` replays it — when a
    profile is built, and in batches while recording.

    The peak is the moment (allocation number) of the highest total; a
    storage freed after that moment but allocated before it was live at the
    peak, and its bytes go to ``peak_gone`` for its site. A new peak empties
    ``peak_gone``. So the peak's breakdown is exact without keeping freed
    storages around.

    In a run (``gpuflame run``), each device's events are also published to
    the run's shared peak table (capture/joint_peak.py) at the moment they
    happen, and the table queues *marks* ``(device, epoch, highest total)``
    among them where this process's share at the run's joint peak is to be
    taken; replaying a mark is the same trick as the peak's, per device
    (``joint_seq``, ``joint_gone``).
    """

    BATCH = 4096  # events queued before the recording thread replays them

    def __init__(self, hook: Any = None) -> None:
        self.lock = threading.Lock()
        self.events: deque[Any] = deque()  # _StorageRef events and (device, epoch, max) marks
        self.append = self.events.append
        self.tracked: dict[int, _StorageRef] = {}  # storage address -> its reference
        self.alloc_bytes: list[int] = []
        self.alloc_count: list[int] = []
        self.peak_gone: dict[int, list[int]] = {}
        # (site, category tag) -> [peak it belongs to, bytes, count]: tagged storages in peak_gone
        self.gone_tagged: dict[tuple[int, int], list[int]] = {}
        self.total = 0
        self.peak = 0
        self.peak_seq = 0
        self.seq = 0
        self.frozen = False
        # the joint peak: the hook module's table functions, when in a run
        self.table_event = hook.table_event if hook is not None else None
        self.site_table: list[int] = []  # site -> table handle of its device, -1 for none
        self.site_device: list[str] = []
        self.publishing = True  # False once this ledger is not the process's (a fork child's old one)
        self.joint_seq: dict[str, int] = {}  # device -> allocation number at its latest mark
        self.joint_at: dict[str, tuple[int, int]] = {}  # device -> (epoch, highest total) of that mark
        self.joint_gone: dict[int, list[int]] = {}
        self.log = EventLog(time.time_ns(), key_of=self.site_device.__getitem__)  # model/history.py
        self.on_free = self._free_callback() if hook is not None else self._stamped_free()
        # phases (capture/ledger_phases.py): from the first (None, id, ns) event on
        self.phases: LedgerPhases | None = None
        self.site_for: Callable[[int, int], int] = lambda site, phase_id: site

    def _stamped_free(self) -> Callable[[_StorageRef], None]:
        """Outside a run a death only notes its time and queues itself."""
        append, now = self.append, time.time_ns

        def on_free(ref: _StorageRef) -> None:
            ref.t1 = now()
            append(ref)

        return on_free

    def _free_callback(self) -> Callable[[_StorageRef], None]:
        """The weak references' callback: queue the free, published to the table where it goes."""
        append = self.append
        site_device = self.site_device

        def on_free(ref: _StorageRef) -> None:
            ref.t1 = time.time_ns()
            table = ref.table
            if table < 0 or not self.publishing:
                append(ref)
                return
            try:
                self.table_event(table, -ref.nbytes, append, ref, site_device[ref.site])
            except Exception:  # noqa: BLE001 - never into the workload: the bound says the rest
                append(ref)

        return on_free

    def new_site(self, device: str = "", table: int = -1) -> int:
        self.alloc_bytes.append(0)
        self.alloc_count.append(0)
        self.site_device.append(device)
        self.site_table.append(table)
        return len(self.alloc_bytes) - 1

    def alloc(self, storage: Any, cdata: int, nbytes: int, site: int) -> None:
        """Queue a new storage (safe from any thread: appends are atomic)."""
        ref = _StorageRef(storage, self.on_free)
        ref.cdata = cdata
        ref.site = site
        ref.nbytes = nbytes
        ref.seq = 0
        ref.t0 = time.time_ns()
        table = ref.table = self.site_table[site]
        self.tracked[cdata] = ref
        if table >= 0 and self.publishing:
            self.table_event(table, nbytes, self.append, ref, self.site_device[site])
        else:
            self.append(ref)
        if len(self.events) > self.BATCH:
            self.replay_some()

    def replay_some(self) -> None:
        """Replay the queue unless another thread (or this one, re-entered) is at it."""
        if self.lock.acquire(False):
            try:
                self._process()
            finally:
                self.lock.release()

    def _process(self) -> None:
        events = self.events
        if self.frozen:
            events.clear()
            return
        tracked = self.tracked
        while events:
            ref = events.popleft()
            if type(ref) is tuple:
                self._mark(*ref)
                continue
            seq = ref.seq
            if seq == 0:
                seq = self.seq = self.seq + 1
                ref.seq = seq
                site = ref.site
                phased = self.phases
                if phased is not None and phased.current:
                    site = ref.site = self.site_for(site, phased.current)
                self.alloc_bytes[site] += ref.nbytes
                self.alloc_count[site] += 1
                self.total += ref.nbytes
                self.log.add(ref.t0, site, ref.nbytes)
                if self.total > self.peak:
                    self.peak = self.total
                    self.peak_seq = seq
                    if self.peak_gone:
                        self.peak_gone.clear()
                if phased is not None:
                    phased.books[phased.current].raise_to(self.total, seq)
            elif seq > 0:
                self._gone(ref, tracked)

    def _mark(self, device: str | None, epoch: int, table_max: int) -> None:
        """This process's share of *device* at the run's joint peak is its books as they are now.

        ``(None, phase id, epoch ns)``: a phase begins (capture/ledger_phases.py).
        """
        if device is None:
            if self.phases is None:
                self.phases = LedgerPhases(self, table_max)
            self.phases.enter(epoch, table_max, self.total, self.seq)
            return
        self.joint_seq[device] = self.seq
        self.joint_at[device] = (epoch, table_max)
        if self.joint_gone:
            site_device = self.site_device
            for site in [k for k in self.joint_gone if site_device[k] == device]:
                del self.joint_gone[site]

    def _gone(self, ref: _StorageRef, tracked: dict[int, _StorageRef]) -> None:
        seq = ref.seq
        ref.seq = -seq
        if tracked.get(ref.cdata) is ref:
            del tracked[ref.cdata]
        self.total -= ref.nbytes
        if self.phases is not None:
            self.phases.on_free(ref.site, ref.nbytes, seq)
        self.log.add(ref.t1, ref.site, -ref.nbytes)
        if seq <= self.peak_seq:
            _add(self.peak_gone, ref.site, ref.nbytes)
            tag = getattr(ref, "tag", 0)
            if tag:
                self._gone_tagged(ref.site, tag, ref.nbytes)
        if self.joint_seq and seq <= self.joint_seq.get(self.site_device[ref.site], 0):
            _add(self.joint_gone, ref.site, ref.nbytes)

    def _gone_tagged(self, site: int, tag: int, nbytes: int) -> None:
        entry = self.gone_tagged.get((site, tag))
        if entry is None or entry[0] != self.peak_seq:
            entry = self.gone_tagged[(site, tag)] = [self.peak_seq, 0, 0]
        entry[1] += nbytes
        entry[2] += 1

    def forget(self, storage: Any, cdata: int) -> None:
        """Count a live storage as freed now, though it lives on (its bytes were replaced by a resize)."""
        with self.lock:
            self._process()
            ref = self.tracked.get(cdata)
            if ref is not None and ref.seq > 0 and ref() is storage and not self.frozen:
                self.on_free(ref)  # published and queued as a free now ...
                ref.table = -1  # ... and not again when the storage really dies
                self._process()

    def look(self) -> None:
        """Queue a mark for each table whose epoch moved since this process last looked (a snapshot)."""
        if self.table_event is None or not self.publishing:
            return
        for table, device in {(t, d) for t, d in zip(self.site_table, self.site_device, strict=True) if t >= 0}:
            self.table_event(table, 0, self.append, None, device)

    def freeze(self) -> None:
        """End of the window: replay what is queued, then ignore any later event."""
        with self.lock:
            self._process()
            self.frozen = True

    def phase_rows(self) -> list[Any]:
        """Each phase's books (capture/phase_table.py); [] before the first phase mark."""
        with self.lock:
            self._process()
            if self.phases is None:
                return []
            live = [ref for ref in list(self.tracked.values()) if ref.seq > 0]
            return self.phases.rows(live, self.total)

    def rows(self) -> dict[int, list[int]]:
        """Site -> [peak bytes, peak count, inuse bytes, inuse count, alloc bytes, alloc count,
        joint bytes, joint count]."""
        with self.lock:
            if not self.frozen:
                self.look()
            self._process()
            # copy first: building the rows allocates, which may run the garbage
            # collector, whose finalizers may record
            peak_seq = self.peak_seq
            live = [ref for ref in list(self.tracked.values()) if ref.seq > 0]
            gone = [(site, list(v)) for site, v in self.peak_gone.items()]
            joint_gone = [(site, list(v)) for site, v in self.joint_gone.items()]
            joint_seq = dict(self.joint_seq)
            alloc = list(zip(self.alloc_bytes, self.alloc_count, strict=True))
            site_device = list(self.site_device)
        rows: dict[int, list[int]] = {}

        def row(site: int) -> list[int]:
            found = rows.get(site)
            if found is None:
                found = rows[site] = [0] * 8
            return found

        for site, (nbytes, count) in gone:
            row(site)[0:2] = [nbytes, count]
        for site, (nbytes, count) in joint_gone:
            row(site)[6:8] = [nbytes, count]
        for ref in live:
            r = row(ref.site)
            r[2] += ref.nbytes
            r[3] += 1
            if ref.seq <= peak_seq:
                r[0] += ref.nbytes
                r[1] += 1
            if ref.seq <= joint_seq.get(site_device[ref.site], 0):
                r[6] += ref.nbytes
                r[7] += 1
        for site, (nbytes, count) in enumerate(alloc):
            if nbytes or count:
                row(site)[4:6] = [nbytes, count]
        return rows


def _add(gone: dict[int, list[int]], site: int, nbytes: int) -> None:
    """One more storage of *site* that was live at a mark and is gone since."""
    found = gone.get(site)
    if found is None:
        gone[site] = [nbytes, 1]
    else:
        found[0] += nbytes
        found[1] += 1


# =============================================================================
# stacks: cheap keys while recording, frames when a profile is built
# =============================================================================


class _Tag(int):
    """Marks a running frame with the node of the stack above it (see :class:`Stacks`).

    Stored in ``frame.f_trace``, which CPython only calls while a tracer
    (``sys.settrace``) is active; tags are written only when none is, and a
    tag that does get called (a tracer installed later) does nothing. An int
    subclass: made without running Python code, and usable as the node.
    """

    __slots__ = ()

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        return None


_GENERATOR_FLAGS = 0x20 | 0x80 | 0x100 | 0x200  # generator, coroutine, iterable coroutine, async generator


class Stacks:
    """Python stacks as a tree of nodes ``(parent node, id(code), f_lasti)``; a stack is its leaf node.

    Walking a deep stack for every allocation would cost more than the
    allocation. But a running frame's callers never change while it runs, so
    the first walk through a frame leaves a tag on it (``f_trace``) holding
    the node of everything above it; later walks stop at the first tagged
    frame, which is usually the leaf itself. Generator and coroutine frames
    change callers between resumptions and are never tagged.

    Code objects of every node are kept alive so their ids stay unique.
    Names (``co_qualname``) and lines (``co_lines()``) are resolved only when
    a profile is built, once per distinct (code, offset).
    """

    def __init__(self) -> None:
        self.nodes: list[tuple[int, int, int]] = []
        self.node_of: dict[tuple[int, int, int], int] = {}
        self.codes: dict[int, CodeType] = {}
        self.lock = threading.Lock()
        self._frames = CodeFrames()

        class Tag(_Tag):
            __slots__ = ()

        self.Tag = Tag  # one class per instance: tags of an earlier recorder are not ours

    def above(self, f: FrameType) -> int:
        """The node of *f*'s callers, tagging the untagged frames on the way.

        Called for every frame's first allocation, so written flat.
        """
        chain: list[FrameType] = []
        g: FrameType | None = f
        node = -1
        Tag = self.Tag
        while g is not None:
            tag = g.f_trace
            if type(tag) is Tag:  # g's callers are known; add g itself
                node = self.node((tag, id(g.f_code), g.f_lasti), g.f_code)
                break
            chain.append(g)
            g = g.f_back
        may_tag = sys.gettrace() is None
        node_of = self.node_of
        for g in reversed(chain):
            code = g.f_code
            # generators and coroutines change callers between resumptions: never tagged
            if may_tag and not code.co_flags & _GENERATOR_FLAGS:
                old = g.f_trace
                if old is None or isinstance(old, _Tag):
                    g.f_trace = Tag(node)
            if g is f:
                break
            key = (node, id(code), g.f_lasti)
            found = node_of.get(key)
            node = found if found is not None else self.node(key, code)
        return node

    def node(self, key: tuple[int, int, int], code: CodeType) -> int:
        """The node ``(parent, id(code), f_lasti)``, made on first sight."""
        found = self.node_of.get(key)
        if found is not None:
            return found
        with self.lock:
            node = self.node_of.get(key)
            if node is None:
                self.codes.setdefault(key[1], code)
                node = self.node_of[key] = len(self.nodes)
                self.nodes.append(key)
            return node

    def frames(self, node: int) -> list[Frame]:
        """The stack's frames, leaf first, without gpuflame's own frames or leaf plumbing."""
        out: list[Frame] = []
        nodes = self.nodes
        codes = self.codes
        while node >= 0:
            parent, code_id, lasti = nodes[node]
            frame = self._frames.frame(codes.get(code_id), lasti)
            if frame is not None:
                out.append(frame)
            node = parent
        return self._frames.strip_plumbing(out)


# =============================================================================
# plans: what each operator can do to memory, decided once per operator
# =============================================================================

PASS = "pass"  # returns nothing new: views, in-place ops, scalars
FRESH = "fresh"  # returns new storages
FRESH_CHECK = "fresh-check"  # returns storages that may belong to an input
LIFT = "lift"  # lift_fresh: a tensor made below the dispatcher
HOP = "hop"  # a higher-order operator


class Resize:
    """An op that writes to tensors and may grow their storage (``resize_``, ``out=``)."""

    __slots__ = ("writes", "fresh")

    def __init__(self, writes: list[tuple[int, str]], fresh: str) -> None:
        self.writes = writes  # (position, name) of written arguments
        self.fresh = fresh  # PASS, FRESH or FRESH_CHECK for its returns

    def written(self, args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> list[Any]:
        out: list[Any] = []
        for pos, name in self.writes:
            if pos < len(args):
                value = args[pos]
            elif kwargs and name in kwargs:
                value = kwargs[name]
            else:
                continue
            if isinstance(value, (list, tuple)):
                out.extend(value)
            else:
                out.append(value)
        return out


# id(op) -> plan. By id: OpOverload.__hash__ is Python code, too slow to run
# per op. The ops are kept alive in _OPS, so their ids stay theirs.
_PLANS: dict[int, Any] = {}
_OPS: list[Any] = []


def plan_for(func: Any) -> Any:
    """The plan of one operator overload, from its schema's alias annotations."""
    plan = _PLANS.get(id(func))
    if plan is None:
        plan = _make_plan(func)
        _OPS.append(func)
        _PLANS[id(func)] = plan
    return plan


def _make_plan(func: Any) -> Any:
    schema = getattr(func, "_schema", None)
    if schema is None or not hasattr(func, "_op"):
        return HOP
    name = schema.name
    if name == "aten::lift_fresh":
        return LIFT
    if name == "aten::lift":
        return FRESH_CHECK
    returns_new = any(r.alias_info is None and "Tensor" in str(r.type) for r in schema.returns)
    short = name.split("::")[-1]
    fresh = PASS
    if returns_new:
        fresh = FRESH_CHECK if ("view" in short or "alias" in short) else FRESH
    writes = [
        (i, a.name)
        for i, a in enumerate(schema.arguments)
        if a.alias_info is not None and a.alias_info.is_write and "Tensor" in str(a.type)
    ]
    if writes and (name in _RESIZING or any(schema.arguments[i].kwarg_only for i, _ in writes)):
        return Resize(writes, fresh)
    return fresh


# =============================================================================
# the recorder
# =============================================================================


OWN_THREAD_PREFIX = "gpuflame-"


class TorchTensorRecorder(Recorder):
    """Tensor storages made by torch operations after ``start()``, per Python stack and device."""

    name = "torch"

    def __init__(self, follow_threads: bool = True) -> None:
        super().__init__()
        self.follow_threads = follow_threads
        self.ledger = Ledger()
        self.stacks = Stacks()
        # (node above the frame, id(code), f_lasti, torch.device) -> site: one
        # dict lookup per allocation finds both the stack and the device
        self.sites: dict[tuple[int, int, int, Any], int] = {}
        self.site_keys: list[tuple[int, str]] = []  # site -> (stack node, device name)
        self.site_phase: list[int] = []  # site -> phase id (capture/phases.py) its allocations were made in
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
        auto_phases.install()  # transformers' and vLLM's known phases (README)
        phases.listen(self._on_phase)
        if phases.current():  # started inside a phase: it runs from here
            self._on_phase(phases.current(), time.time_ns())
        self._mode = _make_mode(self)
        self._mode.__enter__()
        if self.follow_threads:
            self._previous_thread_profile = threading.getprofile()
            threading.setprofile(self._thread_hook)
            self._thread_hook_installed = True
        self._kinds.start()

    def _stop(self) -> None:
        mode, self._mode = self._mode, None
        phases.unlisten(self._on_phase)
        self._kinds.stop()
        self._unhook_threads()
        if mode is not None:
            mode.on = False
            _pop_if_top(mode)
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
        from gpuflame.capture.native import NativeUnavailable, load_cpu_hook

        try:
            return load_cpu_hook()
        except NativeUnavailable as exc:
            self._table_problem = (f"this process did not publish to the run's shared peak table ({exc}): "
                                   "its peak merges with other processes' as a bound")
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
        phases.unlisten(self._on_phase)
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
            profile.add(self.stacks.frames(sid), values if joint else values[:6], labels)
        out = profile.compact()
        out.default_type = profile.default_type
        out.comments = self._comments()
        if joint and any(m != ledger.peak_seq for m in ledger.joint_seq.values()):
            out.comments.append(categories.JOINT_NOTE)
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
        site_keys = self.site_keys
        return of_track(track, lambda s: self.stacks.frames(site_keys[s][0]), lambda s: (("device", site_keys[s][1]),))

    def _peak_unit(self, device: str, mark: tuple[int, int] | None) -> PeakUnit:
        """This process's own peak on *device*, and where it stood in the run's table (if any)."""
        end = self.stopped_ns or time.time_ns()
        table = self._generations.get(device, "") if mark is not None else ""
        epoch, table_max = mark if mark is not None and table else (0, 0)
        return PeakUnit(device, start=self.started_ns, end=end, pid=str(os.getpid()), table=table, epoch=epoch,
                        table_max=table_max)

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
                _push_in_this_thread(mode)
            except Exception as exc:  # noqa: BLE001
                self.fail(
                    "could not follow a new thread", "that thread's tensors are not recorded", exc, False
                )
        if previous is not None:
            return previous(frame, event, arg)
        return None

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
            notes.append(
                f"{self.skipped} outputs had no readable storage (sparse, nested or subclass tensors)"
            )
        return notes


_LIVE_RECORDERS: weakref.WeakSet[TorchTensorRecorder] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for recorder in list(_LIVE_RECORDERS):
        recorder.after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


# =============================================================================
# the dispatch mode: the hot path
# =============================================================================


def _make_mode(recorder: TorchTensorRecorder) -> Any:
    """A dispatch mode bound to *recorder* (built lazily: importing torch is the caller's choice)."""
    return _mode_class()(recorder)


_MODE_CLASS: Any = None


def _mode_class() -> Any:
    global _MODE_CLASS
    if _MODE_CLASS is None:
        _MODE_CLASS = _define_mode_class()
    return _MODE_CLASS


def _define_mode_class() -> Any:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    Tensor = torch.Tensor
    getframe = sys._getframe
    now = time.time_ns
    StorageRef = _StorageRef
    BATCH = Ledger.BATCH

    class _RecordingMode(TorchDispatchMode):
        """Calls each op, then records the storages it created.

        The common case (an op returning one new tensor) runs in
        :meth:`__torch_dispatch__` and :meth:`record_new` only: at a few
        microseconds per op, every Python function call shows.
        """

        supports_higher_order_operators = True

        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            # the default wraps __torch_dispatch__ in a dynamo-disabling shim that
            # costs more than the bookkeeping; our code objects are marked
            # "skip" for dynamo instead (_skip_dynamo below)
            return False

        @classmethod
        def ignore_compile_internals(cls) -> bool:
            # torch.compile compiles with the mode switched off and runs what it
            # made with the mode on. Without this, dynamo does not compile while
            # any dispatch mode is active, and a function first called then
            # stays uncompiled afterwards: the workload would run differently.
            return True

        def __init__(self, recorder: TorchTensorRecorder) -> None:
            super().__init__()
            self.on = True
            self.recorder = recorder
            self.follow(recorder.ledger)
            self.sites = recorder.sites
            self.Tag = recorder.stacks.Tag

        def follow(self, ledger: Ledger) -> None:
            """Record into *ledger* (a fork child's new one)."""
            self.ledger = ledger
            self.tracked = ledger.tracked
            self.events = ledger.events
            self.append = ledger.append
            self.on_free = ledger.on_free
            self.site_table = ledger.site_table
            self.site_device = ledger.site_device

        def __torch_dispatch__(
            self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
        ) -> Any:
            plan = _PLANS.get(id(func))
            if plan is None:
                plan = plan_for(func)
            if plan is PASS or not self.on:
                if plan is HOP:
                    return func(*args, **(kwargs or {}))
                return func._op(*args, **kwargs) if kwargs else func._op(*args)
            if plan is FRESH:
                out = func._op(*args, **kwargs) if kwargs else func._op(*args)
                try:
                    if type(out) is Tensor:
                        self.record_new(out)
                    elif type(out) is tuple or type(out) is list:
                        for t in out:
                            if isinstance(t, Tensor):
                                self.record_one(t, None, False, 2)
                except Exception as exc:  # noqa: BLE001
                    self.failed(exc)
                return out
            return self.special(plan, func, args, kwargs)

        def record_new(self, t: Any) -> None:
            """:meth:`record_one` for an op's single new output, with :meth:`Ledger.alloc` inlined.

            The one path nearly every allocation takes; each Python call saved shows.
            """
            try:
                st = t.untyped_storage()
            except (RuntimeError, NotImplementedError, TypeError):
                self.recorder.skipped += 1
                return
            cdata = st._cdata
            tracked = self.tracked
            ref = tracked.get(cdata)
            if ref is not None and ref() is st:
                return
            nbytes = st.nbytes()
            if not nbytes:
                return
            f = getframe(2)  # 0: here, 1: __torch_dispatch__, 2: the op's caller
            tag = f.f_trace
            above = tag if type(tag) is self.Tag else self.recorder.stacks.above(f)
            key = (above, id(f.f_code), f.f_lasti, st.device)
            site = self.sites.get(key)
            if site is None:
                site = self.recorder.new_site(key, f)
            if site < 0:
                return
            ref = StorageRef(st, self.on_free)
            ref.cdata = cdata
            ref.site = site
            ref.nbytes = nbytes
            ref.seq = 0
            ref.t0 = now()
            table = ref.table = self.site_table[site]
            tracked[cdata] = ref
            if table < 0:
                self.append(ref)
            else:  # published to the run's table at this moment, queued with its marks
                self.ledger.table_event(table, nbytes, self.append, ref, self.site_device[site])
            if len(self.events) > BATCH:
                self.ledger.replay_some()

        def record_one(self, t: Any, inputs: set[int] | None, lifted: bool, depth: int) -> None:
            """Track *t*'s storage if it is new; *depth* frames up is the op's caller."""
            try:
                st = t.untyped_storage()
            except (RuntimeError, NotImplementedError, TypeError):
                self.recorder.skipped += 1  # sparse, nested, wrapper subclasses
                return
            cdata = st._cdata
            ref = self.tracked.get(cdata)
            if ref is not None and ref() is st:
                return  # ours already: a view made by an op that does not say so
            if inputs is not None and cdata in inputs:
                return
            if lifted and not st.resizable():
                return  # memory torch does not own (from_numpy, frombuffer)
            nbytes = st.nbytes()
            if not nbytes:
                return
            device = st.device
            f = getframe(depth)
            tag = f.f_trace
            above = tag if type(tag) is self.Tag else self.recorder.stacks.above(f)
            key = (above, id(f.f_code), f.f_lasti, device)
            site = self.sites.get(key)
            if site is None:
                site = self.recorder.new_site(key, f)
            if site >= 0:
                self.ledger.alloc(st, cdata, nbytes, site)

        def special(self, plan: Any, func: Any, args: tuple[Any, ...], kwargs: Any) -> Any:
            """Resize / out= / lift_fresh / alias-suspect / higher-order ops (rare)."""
            before: list[tuple[Any, int]] = []
            if type(plan) is Resize:
                try:
                    before = _sizes(plan.written(args, kwargs))
                except Exception as exc:  # noqa: BLE001
                    self.failed(exc)
            if plan is HOP:
                out = func(*args, **(kwargs or {}))
            else:
                out = func._op(*args, **kwargs) if kwargs else func._op(*args)
            if not self.on:
                return out
            try:
                fresh = plan
                if type(plan) is Resize:
                    self.grown(before)
                    fresh = plan.fresh
                if fresh is PASS:
                    return out
                inputs = _input_storages(args, kwargs) if (fresh is FRESH_CHECK or fresh is HOP) else None
                for t in out if isinstance(out, (tuple, list)) else (out,):
                    if isinstance(t, Tensor):
                        self.record_one(t, inputs, fresh is LIFT, 3)
            except Exception as exc:  # noqa: BLE001
                self.failed(exc)
            return out

        def grown(self, before: list[tuple[Any, int]]) -> None:
            """Storages a resize or out= op made bigger: old bytes freed, new bytes allocated here."""
            for st, old in before:
                nbytes = st.nbytes()
                if nbytes <= old:
                    continue
                self.ledger.forget(st, st._cdata)
                site = self.recorder.site_of_stack(3, st.device)
                if site >= 0:
                    self.ledger.alloc(st, st._cdata, nbytes, site)

        def failed(self, exc: BaseException) -> None:
            self.on = False
            self.recorder.fail("the torch recorder failed inside an operation", "recording stopped here", exc)

    _skip_dynamo(_RecordingMode)
    return _RecordingMode


def _sizes(tensors: list[Any]) -> list[tuple[Any, int]]:
    out = []
    for t in tensors:
        try:
            st = t.untyped_storage()
        except (AttributeError, RuntimeError, NotImplementedError, TypeError):
            continue
        out.append((st, st.nbytes()))
    return out


def _input_storages(args: tuple[Any, ...], kwargs: Any) -> set[int]:
    """Storage addresses of the tensors among an op's arguments (one level of lists)."""
    import torch

    found: set[int] = set()
    values: list[Any] = list(args) + (list(kwargs.values()) if kwargs else [])
    for v in values:
        items = v if isinstance(v, (list, tuple)) else (v,)
        for t in items:
            if isinstance(t, torch.Tensor):
                try:
                    found.add(t.untyped_storage()._cdata)
                except (RuntimeError, NotImplementedError, TypeError):
                    pass
    return found


def _push_in_this_thread(mode: Any) -> None:
    import torch

    torch._C._push_on_torch_dispatch_stack(mode)


def _pop_if_top(mode: Any) -> None:
    """Leave the mode in this thread if it is on top; otherwise it stays, switched off."""
    import torch

    n = torch._C._len_torch_dispatch_stack()
    if n and torch._C._get_dispatch_stack_at(n - 1) is mode:
        mode.__exit__(None, None, None)


def _skip_dynamo(cls: type) -> None:
    """Tell torch.compile never to trace our hot code (cheaply, without importing torch._dynamo)."""
    try:
        from torch._C._dynamo import eval_frame

        strategy = eval_frame._FrameExecStrategy(eval_frame._FrameAction.SKIP, eval_frame._FrameAction.SKIP)
        functions: list[Callable[..., Any]] = [
            f for f in vars(cls).values() if callable(f) and hasattr(f, "__code__")
        ]
        functions += [
            TorchTensorRecorder.new_site,
            TorchTensorRecorder.site_of_stack,
            Ledger.alloc,
            Ledger.replay_some,
            Ledger.forget,
            Ledger._process,
            Ledger._gone,
            Stacks.above,
            Stacks.node,
            _sizes,
            _input_storages,
        ]
        for f in functions:
            eval_frame.set_code_exec_strategy(f.__code__, strategy)
    except Exception:  # noqa: BLE001 - older/newer torch: dynamo may then trace us, which is only slower
        pass
