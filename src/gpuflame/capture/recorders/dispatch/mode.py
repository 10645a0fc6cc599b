"""The dispatch mode of the ``torch`` backend's dispatch recorder: the hot path.

Imported only once torch is (by :func:`recorder._make_mode`, when a
recording starts): it subclasses torch's ``TorchDispatchMode`` at the top
level, so importing the package stays standard library only (the rule of
ARCHITECTURE.md for the in-process side). For each operator it looks up the
plan (plans.py) and books the new storages in the recorder's ledger
(ledger.py) at the stack's site (stacks.py).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from gpuflame.capture.recorders.dispatch.ledger import Ledger, StorageRef
from gpuflame.capture.recorders.dispatch.plans import FRESH, FRESH_CHECK, HOP, LIFT, PASS, PLANS, Resize, plan_for
from gpuflame.capture.recorders.dispatch.stacks import Stacks

# the hot path's names, bound once
Tensor = torch.Tensor
getframe = sys._getframe
now = time.time_ns
BATCH = Ledger.BATCH


class Books(Protocol):
    """What the mode books into: the recorder that makes it (recorder.py), which this module never imports."""

    ledger: Ledger
    sites: Any
    stacks: Stacks
    skipped: int

    def new_site(self, key: Any, frame: Any) -> int: ...
    def site_of_stack(self, skip: int, device: Any) -> int: ...
    def fail(self, what: str, consequence: str, exc: BaseException) -> None: ...


class RecordingMode(TorchDispatchMode):
    """Calls each op, then records the storages it created.

    The common case (an op returning one new tensor) runs in
    :meth:`__torch_dispatch__` alone: at a few microseconds per op, every
    Python function call shows.
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

    def __init__(self, recorder: Books) -> None:
        super().__init__()
        _skip_dynamo_in(type(recorder))
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

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        plan = PLANS.get(id(func))
        if plan is None:
            plan = plan_for(func)
        if plan is not FRESH or not self.on:
            if plan is PASS or not self.on:
                if plan is HOP:
                    return func(*args, **(kwargs or {}))
                return func._op(*args, **kwargs) if kwargs else func._op(*args)
            return self.special(plan, func, args, kwargs)
        out = func._op(*args, **kwargs) if kwargs else func._op(*args)
        if type(out) is not Tensor:
            if type(out) is tuple or type(out) is list:
                try:
                    for t in out:
                        if isinstance(t, Tensor):
                            self.record_one(t, None, False, 2)
                except Exception as exc:  # noqa: BLE001
                    self.failed(exc)
            return out
        # one new tensor, the path nearly every allocation takes: record_one
        # and Ledger.alloc written out here, as each Python call saved shows
        try:
            st = out.untyped_storage()
        except (RuntimeError, NotImplementedError, TypeError):
            self.recorder.skipped += 1
            return out
        try:
            cdata = st._cdata
            tracked = self.tracked
            ref = tracked.get(cdata)
            if ref is not None and ref() is st:
                return out
            nbytes = st.nbytes()
            if not nbytes:
                return out
            f = getframe(1)  # 0: here, 1: the op's caller
            tag = f.f_trace
            above = tag if type(tag) is self.Tag else self.recorder.stacks.above(f)
            key = (above, id(f.f_code), f.f_lasti, st.device)
            site = self.sites.get(key)
            if site is None:
                site = self.recorder.new_site(key, f)
            if site < 0:
                return out
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
        except Exception as exc:  # noqa: BLE001
            self.failed(exc)
        return out

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
    found: set[int] = set()
    values: list[Any] = list(args) + (list(kwargs.values()) if kwargs else [])
    for v in values:
        items = v if isinstance(v, (list, tuple)) else (v,)
        for t in items:
            if isinstance(t, Tensor):
                try:
                    found.add(t.untyped_storage()._cdata)
                except (RuntimeError, NotImplementedError, TypeError):
                    pass
    return found


def push_in_this_thread(mode: Any) -> None:
    """Enter *mode* in the calling thread (dispatch modes are thread-local)."""
    torch._C._push_on_torch_dispatch_stack(mode)


def pop_if_top(mode: Any) -> None:
    """Leave the mode in this thread if it is on top; otherwise it stays, switched off."""
    n = torch._C._len_torch_dispatch_stack()
    if n and torch._C._get_dispatch_stack_at(n - 1) is mode:
        mode.__exit__(None, None, None)


def _skip_dynamo(functions: list[Callable[..., Any]]) -> None:
    """Tell torch.compile never to trace our hot code (cheaply, without importing torch._dynamo)."""
    try:
        from torch._C._dynamo import eval_frame

        strategy = eval_frame._FrameExecStrategy(eval_frame._FrameAction.SKIP, eval_frame._FrameAction.SKIP)
        for f in functions:
            eval_frame.set_code_exec_strategy(f.__code__, strategy)
    except Exception:  # noqa: BLE001 - older/newer torch: dynamo may then trace us, which is only slower
        pass


_SKIPPED: set[type[Books]] = set()


def _skip_dynamo_in(books: type[Books]) -> None:
    """The recorder's hot methods too, once per class (known when the first mode is made)."""
    if books not in _SKIPPED:
        _SKIPPED.add(books)
        _skip_dynamo([books.new_site, books.site_of_stack])


_skip_dynamo(
    [
        *(f for f in vars(RecordingMode).values() if callable(f) and hasattr(f, "__code__")),
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
)
