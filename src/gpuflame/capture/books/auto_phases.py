"""Phases gpuflame marks by itself in frameworks it knows: no change to the program.

When a recording starts, the functions below are wrapped where they are
defined (now, or when their module is imported: capture/post_import.py).
A wrapped call runs as ``with gpuflame.phase(name)`` — only when no phase
is running: a phase the program marked itself wins, and a wrapped function
called inside another (a subclass's ``from_pretrained`` calling its
parent's) marks nothing more. The wrappers stay after the recording ends
and then cost one attribute read per call.

vLLM is not installed where gpuflame's tests run: its entries are tested
with a stand-in module of the same names (tests/unit/capture/test_phases.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any

from gpuflame.capture.books import phases
from gpuflame.capture.post_import import when_imported

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
)

_MARK = "__gpuflame_phase__"
_installed = False


def install() -> None:
    """Wrap every target, now or at its module's import (once per process)."""
    global _installed
    if _installed:
        return
    _installed = True
    modules: dict[str, list[tuple[str, str, str]]] = {}
    for module, cls, func, name in TARGETS:
        modules.setdefault(module, []).append((cls, func, name))
    for module, entries in modules.items():
        when_imported(module, functools.partial(_wrap_module, entries=entries))


def _wrap_module(module: ModuleType, entries: list[tuple[str, str, str]]) -> None:
    for cls_name, func_name, phase_name in entries:
        cls = getattr(module, cls_name, None)
        raw = vars(cls).get(func_name) if isinstance(cls, type) else None
        if raw is None:
            continue  # another version of the framework: nothing to mark
        wrapped = _wrapped(raw, phases.intern(phase_name))
        if wrapped is not None:
            setattr(cls, func_name, wrapped)


def _wrapped(raw: Any, phase_id: int) -> Any:
    """The function (or classmethod/staticmethod) *raw*, marking *phase_id* while it runs; None if already done."""
    kind = type(raw) if isinstance(raw, (classmethod, staticmethod)) else None
    func: Callable[..., Any] = raw.__func__ if kind is not None else raw
    if not callable(func) or getattr(func, _MARK, None) is not None:
        return None

    @functools.wraps(func)
    def run(*args: Any, **kwargs: Any) -> Any:
        if phases.current():  # a phase is running (the program's own, or an outer wrapped call)
            return func(*args, **kwargs)
        previous = phases.switch(phase_id)
        try:
            return func(*args, **kwargs)
        finally:
            phases.switch(previous)

    setattr(run, _MARK, phase_id)
    return kind(run) if kind is not None else run
