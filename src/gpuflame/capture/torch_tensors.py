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
import weakref
from collections import deque
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any

from gpuflame.capture import categories
from gpuflame.capture.base import Recorder, empty_profile
from gpuflame.capture.code_frames import CodeFrames
from gpuflame.capture.recorder_categories import LedgerCategories
from gpuflame.model.profile import Frame, Profile

# ops that may grow the storage of a tensor they write to
_RESIZING = frozenset({"aten::resize_", "aten::resize_as_", "aten::_resize_output_", "aten::set_"})


# =============================================================================
# the ledger: live storages, peak, totals per site
# =============================================================================


class _StorageRef(weakref.ref):
    """A weak reference to one storage's Python object, carrying its record.

    The same object is both events of a storage's life: it is queued once
    when the storage is made, and its callback (the ledger's
    ``events.append``, a C function) queues it again when the storage dies.
    ``seq`` says which: 0 = made, not yet counted; > 0 = live, counted as
    allocation number ``seq``; < 0 = gone.
    """

    __slots__ = ("cdata", "site", "nbytes", "seq", "tag")  # tag: capture/categories.py, set only when known

    cdata: int
    site: int
    nbytes: int
    seq: int


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
    """

    BATCH = 4096  # events queued before the recording thread replays them

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.events: deque[_StorageRef] = deque()
        self.on_event = self.events.append
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

    def new_site(self) -> int:
        self.alloc_bytes.append(0)
        self.alloc_count.append(0)
        return len(self.alloc_bytes) - 1

    def alloc(self, storage: Any, cdata: int, nbytes: int, site: int) -> None:
        """Queue a new storage (safe from any thread: appends are atomic)."""
        ref = _StorageRef(storage, self.on_event)
        ref.cdata = cdata
        ref.site = site
        ref.nbytes = nbytes
        ref.seq = 0
        self.tracked[cdata] = ref
        self.on_event(ref)
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
            seq = ref.seq
            if seq == 0:
                seq = self.seq = self.seq + 1
                ref.seq = seq
                site = ref.site
                self.alloc_bytes[site] += ref.nbytes
                self.alloc_count[site] += 1
                self.total += ref.nbytes
                if self.total > self.peak:
                    self.peak = self.total
                    self.peak_seq = seq
                    if self.peak_gone:
                        self.peak_gone.clear()
            elif seq > 0:
                self._gone(ref, tracked)

    def _gone(self, ref: _StorageRef, tracked: dict[int, _StorageRef]) -> None:
        seq = ref.seq
        ref.seq = -seq
        if tracked.get(ref.cdata) is ref:
            del tracked[ref.cdata]
        self.total -= ref.nbytes
        if seq <= self.peak_seq:
            gone = self.peak_gone.get(ref.site)
            if gone is None:
                self.peak_gone[ref.site] = [ref.nbytes, 1]
            else:
                gone[0] += ref.nbytes
                gone[1] += 1
            tag = getattr(ref, "tag", 0)
            if tag:
                self._gone_tagged(ref.site, tag, ref.nbytes)

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
                self._gone(ref, self.tracked)

    def freeze(self) -> None:
        """End of the window: replay what is queued, then ignore any later event."""
        with self.lock:
            self._process()
            self.frozen = True

    def rows(self) -> dict[int, list[int]]:
        """Site -> [peak bytes, peak count, inuse bytes, inuse count, alloc bytes, alloc count]."""
        with self.lock:
            self._process()
            # copy first: building the rows allocates, which may run the garbage
            # collector, whose finalizers may record
            peak_seq = self.peak_seq
            live = [ref for ref in list(self.tracked.values()) if ref.seq > 0]
            gone = [(site, list(v)) for site, v in self.peak_gone.items()]
            alloc = list(zip(self.alloc_bytes, self.alloc_count, strict=True))
        rows: dict[int, list[int]] = {}
        for site, (nbytes, count) in gone:
            rows[site] = [nbytes, count, 0, 0, 0, 0]
        for ref in live:
            row = rows.get(ref.site)
            if row is None:
                row = rows[ref.site] = [0, 0, 0, 0, 0, 0]
            row[2] += ref.nbytes
            row[3] += 1
            if ref.seq <= peak_seq:
                row[0] += ref.nbytes
                row[1] += 1
        for site, (nbytes, count) in enumerate(alloc):
            if nbytes or count:
                row = rows.get(site)
                if row is None:
                    row = rows[site] = [0, 0, 0, 0, 0, 0]
                row[4] = nbytes
                row[5] = count
        return rows


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
        self.skipped = 0
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
        ledger = Ledger()
        ledger.alloc_bytes = [0] * len(old.alloc_bytes)
        ledger.alloc_count = [0] * len(old.alloc_count)
        ledger.frozen = old.frozen
        self.ledger = ledger
        mode = self._mode
        if mode is not None:
            mode.ledger = ledger
            mode.tracked = ledger.tracked
            mode.events = ledger.events
            mode.on_event = ledger.on_event

    # -- Recorder -------------------------------------------------------------

    def _start(self) -> None:
        import torch  # noqa: F401 - the backend needs torch; ImportError is reported by start()

        self.ledger = Ledger()
        self.sites = {}
        self.site_keys = []
        self._mode = _make_mode(self)
        self._mode.__enter__()
        if self.follow_threads:
            self._previous_thread_profile = threading.getprofile()
            threading.setprofile(self._thread_hook)
            self._thread_hook_installed = True
        self._kinds.start()

    def _stop(self) -> None:
        mode, self._mode = self._mode, None
        self._kinds.stop()
        self._unhook_threads()
        if mode is not None:
            mode.on = False
            _pop_if_top(mode)
        self.ledger.freeze()

    def _degrade(self) -> None:
        if self._mode is not None:
            self._mode.on = False
        self._kinds.stop()
        self._unhook_threads()

    def _snapshot(self) -> Profile:
        rows = self._kinds.rows()
        profile = empty_profile()
        pid = str(os.getpid())
        for (site, category), values in rows.items():
            sid, device = self.site_keys[site]
            profile.add(self.stacks.frames(sid), values, {"device": device, "pid": pid, categories.LABEL: category})
        out = profile.compact()
        out.default_type = profile.default_type
        out.comments = self._comments()
        return out

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
                    site = self.ledger.new_site()
                    self.site_keys.append((node, str(device)))
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
            "per Python stack; bytes are untyped_storage().nbytes(), one storage is one object",
            "peak: what was live at the highest total of those storages; storages that existed "
            "before start() are not counted",
        ]
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
            self.ledger = recorder.ledger
            self.tracked = recorder.ledger.tracked
            self.events = recorder.ledger.events
            self.on_event = recorder.ledger.on_event
            self.sites = recorder.sites
            self.Tag = recorder.stacks.Tag

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
            ref = StorageRef(st, self.on_event)
            ref.cdata = cdata
            ref.site = site
            ref.nbytes = nbytes
            ref.seq = 0
            tracked[cdata] = ref
            events = self.events
            events.append(ref)
            if len(events) > BATCH:
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
