"""Phases gpuflame marks by itself in frameworks it knows: no change to the program.

When a recording starts, the functions below are wrapped where they are
defined (now, or when their module is imported: capture/post_import.py).
A wrapped call runs as ``with gpuflame.phase(name)`` — only when no phase
is running: a phase the program marked itself wins, and a wrapped function
called inside another (a subclass's ``from_pretrained`` calling its
parent's) marks nothing more. A few are *nested*: they also mark inside
named phases that a wrapper set (Lightning's epochs inside ``fit``,
Accelerate's ``backward`` inside ``accumulate``), never inside the
program's own, and the outer phase runs again when they return. A context manager (Accelerate's ``accumulate``)
marks from its ``__enter__`` to its ``__exit__``. The wrappers stay after
the recording ends and then cost one attribute read per call.

vLLM is not installed where gpuflame's tests run: its entries are tested
with a stand-in module of the same names (tests/unit/capture/test_phases.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any, NamedTuple

from gpuflame.capture import post_import
from gpuflame.capture.books import phases

# Lightning under both of its package names (lightning.pytorch and the standalone pytorch_lightning)
_LIGHTNING = ("lightning.pytorch", "pytorch_lightning")
_IN_FIT = ("fit", "train_epoch")  # the validation loop runs from the training epoch's loop, and alone (sanity check)

# (module, class, function, phase); the README's list of auto-marked phases
TARGETS: tuple[tuple[str, str, str, str], ...] = (
    ("transformers.modeling_utils", "PreTrainedModel", "from_pretrained", "load_model"),
    ("transformers.models.auto.auto_factory", "_BaseAutoModelClass", "from_pretrained", "load_model"),
    ("transformers.generation.utils", "GenerationMixin", "generate", "generate"),
    ("vllm.worker.model_runner", "GPUModelRunnerBase", "load_model", "load_model"),
    ("vllm.worker.model_runner", "GPUModelRunnerBase", "capture_model", "cuda_graph_capture"),
    ("vllm.worker.cache_engine", "CacheEngine", "_allocate_kv_cache", "kv_cache_allocation"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "load_model", "load_model"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "initialize_kv_cache", "kv_cache_allocation"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "capture_model", "cuda_graph_capture"),
    *(
        (f"{pl}.trainer.trainer", "Trainer", fn, fn)
        for pl in _LIGHTNING
        for fn in ("fit", "validate", "test", "predict")
    ),
)

# (module, class, function, phase, the wrappers' phases it also marks within: when one of those runs, set by a wrapper)
NESTED: tuple[tuple[str, str, str, str, tuple[str, ...]], ...] = (
    *((f"{pl}.loops.training_epoch_loop", "_TrainingEpochLoop", "run", "train_epoch", ("fit",)) for pl in _LIGHTNING),
    *((f"{pl}.loops.evaluation_loop", "_EvaluationLoop", "run", "val_epoch", _IN_FIT) for pl in _LIGHTNING),
    ("accelerate.accelerator", "Accelerator", "backward", "backward", ("accumulate",)),
)

# context managers (module, class, function, phase): the phase runs between the manager's enter and exit
CONTEXTS: tuple[tuple[str, str, str, str], ...] = (
    ("accelerate.accelerator", "Accelerator", "accumulate", "accumulate"),
)

_MARK = "__gpuflame_phase__"
_installed = False
_auto = 0  # the phase a wrapper set and that still runs (0: none): nested targets may mark inside it


class _Target(NamedTuple):
    cls: str
    func: str
    phase: str
    within: tuple[str, ...] = ()  # empty: marks only when no phase runs
    context: bool = False  # a context manager: its phase runs from enter to exit


def install() -> None:
    """Wrap every target, now or at its module's import (the watches set once per process, re-armed after)."""
    global _installed
    if _installed:
        post_import.rearm()  # a framework imported while the finder was off sys.meta_path is wrapped now
        return
    _installed = True
    modules: dict[str, list[_Target]] = {}
    for module, cls, func, name in TARGETS:
        modules.setdefault(module, []).append(_Target(cls, func, name))
    for module, cls, func, name, within in NESTED:
        modules.setdefault(module, []).append(_Target(cls, func, name, within))
    for module, cls, func, name in CONTEXTS:
        modules.setdefault(module, []).append(_Target(cls, func, name, context=True))
    for module, entries in modules.items():
        post_import.when_imported(module, functools.partial(_wrap_module, entries=entries))


def _wrap_module(module: ModuleType, entries: list[_Target]) -> None:
    for target in entries:
        cls = getattr(module, target.cls, None)
        raw = vars(cls).get(target.func) if isinstance(cls, type) else None
        if raw is None:
            continue  # another version of the framework: nothing to mark
        within = frozenset(phases.intern(n) for n in target.within)
        wrapped = _wrapped(raw, phases.intern(target.phase), within, target.context)
        if wrapped is not None:
            setattr(cls, target.func, wrapped)


def _enter(phase_id: int, within: frozenset[int]) -> tuple[int, int] | None:
    """Switch to *phase_id* if it may mark now: (the phase before, the wrapper's phase before); None if not."""
    global _auto
    current = phases.current()
    # a phase runs: the program's own, an outer wrapper's, or one this nested target marks within
    if current and not (current == _auto and current in within):
        return None
    before = (phases.switch(phase_id), _auto)
    _auto = phase_id
    return before


def _leave(before: tuple[int, int] | None) -> None:
    global _auto
    if before is not None:
        previous, _auto = before
        phases.switch(previous)


def _wrapped(raw: Any, phase_id: int, within: frozenset[int] = frozenset(), context: bool = False) -> Any:
    """The function (or classmethod/staticmethod) *raw*, marking *phase_id* while it runs; None if already done.

    With *context*, *raw* returns a context manager: the phase runs from its enter to its exit.
    """
    kind = type(raw) if isinstance(raw, (classmethod, staticmethod)) else None
    func: Callable[..., Any] = raw.__func__ if kind is not None else raw
    if not callable(func) or getattr(func, _MARK, None) is not None:
        return None

    @functools.wraps(func)
    def run(*args: Any, **kwargs: Any) -> Any:
        if context:
            return _PhaseContext(func(*args, **kwargs), phase_id, within)
        before = _enter(phase_id, within)
        try:
            return func(*args, **kwargs)
        finally:
            _leave(before)

    setattr(run, _MARK, phase_id)
    return kind(run) if kind is not None else run


class _PhaseContext:
    """A context manager of the framework's, marking a phase from its enter to its exit."""

    def __init__(self, inner: Any, phase_id: int, within: frozenset[int]) -> None:
        self.inner, self.phase_id, self.within = inner, phase_id, within
        self.before: tuple[int, int] | None = None

    def __enter__(self) -> Any:
        self.before = _enter(self.phase_id, self.within)
        try:
            return self.inner.__enter__()
        except BaseException:
            _leave(self.before)
            raise

    def __exit__(self, *exc: Any) -> Any:
        try:
            return self.inner.__exit__(*exc)
        finally:
            _leave(self.before)
