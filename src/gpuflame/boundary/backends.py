"""The capture backends: one registry of what each is called, which import starts it, and which module records it.

Every question about backends is answered here, on both sides of the process
boundary: the names ``--backend`` accepts (:data:`BACKENDS`), the framework
whose import starts each one and its packages (:data:`REGISTRY`), and the
"auto" decisions (:func:`for_framework`: which backend records a framework
just imported; :func:`torch_hook_for`: which torch hook records). A backend
is one module under ``capture/recorders/`` (its ``create(session)`` builds
the recorder) and one line of :data:`REGISTRY`; its name is written nowhere
else (``tests/unit/test_architecture.py`` greps). Standard library only, and
nothing of ``capture/`` is imported here: ``capture/recorders/__init__.py``
imports a backend's module by the name written in its line, when the
workload needs it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from types import ModuleType


@dataclass(frozen=True)
class Backend:
    """One backend: its ``--backend`` name, the framework it records, and the module that records it."""

    name: str
    framework: str  # the module whose import starts it
    recorder: str  # the module whose create(session) builds its recorder (capture/recorders/)
    packages: tuple[str, ...]  # the framework's packages: frames the profile calls framework, not the user's
    summary: str  # what it records, for --help


AUTO = "auto"  # the name that lets the rules below decide (for_framework, torch_hook_for)
TORCH_CUDA, TORCH, JAX = "torch-cuda", "torch", "jax"  # each backend's name, written once
_RECORDERS = "gpuflame.capture.recorders."
REGISTRY = {
    b.name: b
    for b in (
        Backend(
            TORCH_CUDA,
            "torch",
            _RECORDERS + "torch_cuda",
            ("torch",),
            "PyTorch's caching-allocator history: peak, in use, allocated, cached free blocks",
        ),
        Backend(TORCH, "torch", _RECORDERS + "torch_hook", ("torch",), "torch memory on any device, CPU included"),
        Backend(JAX, "jax", _RECORDERS + "jax_memory", ("jax", "jaxlib"), "JAX's live buffers"),
    )
}
BACKENDS = (AUTO, *REGISTRY)  # what --backend and GPUFLAME_BACKEND accept
AUTO_RULE = f"{AUTO} picks {TORCH_CUDA} when CUDA is available, else {TORCH}, plus {JAX} when the program imports it"
ALLOCATOR, DISPATCH = "allocator", "dispatch"  # the torch backend's two hooks (torch_hook_for)
TORCH_HOOKS = (AUTO, ALLOCATOR, DISPATCH)  # what --torch-hook accepts


def framework_packages() -> tuple[str, ...]:
    """Every backend's framework packages, once each: what ``prune_framework`` cuts by default."""
    return tuple(dict.fromkeys(p for b in REGISTRY.values() for p in b.packages))


def spoken(names: tuple[str, ...] = BACKENDS, last: str = "or") -> str:
    """The names as a sentence lists them: ``auto, torch-cuda, torch or jax``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} {last} {names[-1]}"


def frameworks(backend: str) -> tuple[str, ...]:
    """The frameworks whose import starts *backend* (``auto``: every one), in registry order."""
    chosen = REGISTRY.values() if backend == AUTO else [REGISTRY[backend]] if backend in REGISTRY else []
    return tuple(dict.fromkeys(b.framework for b in chosen))


def for_framework(backend: str, framework: ModuleType) -> str:
    """The backend that records *framework* (just imported) when *backend* was asked for.

    The "auto" rule: PyTorch's caching-allocator history where CUDA is
    there (``torch-cuda``), else ``torch`` (any device, CPU included);
    ``jax`` for JAX.
    """
    if backend != AUTO:
        return backend
    if framework.__name__ == REGISTRY[TORCH].framework:
        return TORCH_CUDA if cuda_available(framework) else TORCH
    return next(b.name for b in REGISTRY.values() if b.framework == framework.__name__)


def torch_hook_for(hook: str, torch: ModuleType | None) -> str:
    """Which hook the ``torch`` backend tries first: :data:`ALLOCATOR` or :data:`DISPATCH`.

    The allocator hook is much faster but sees CPU memory only, so ``auto``
    takes it only when torch has no accelerator here; ``dispatch`` sees
    tensors on every device (the recorder falls back to it when the hook
    cannot be built).
    """
    if hook == DISPATCH or (hook == AUTO and torch is not None and accelerator(torch)):
        return DISPATCH
    return ALLOCATOR


def say(message: str) -> None:
    """A note on stderr (a choice made for the user, not a loss: the launcher does not repeat it)."""
    try:
        print(f"gpuflame: {message}", file=sys.stderr, flush=True)
    except Exception:
        pass


def accelerator(torch: ModuleType) -> str:
    """The accelerator torch can use here ('' for none), without raising."""
    if cuda_available(torch):
        return "cuda"
    for name, module in (("mps", getattr(torch.backends, "mps", None)), ("xpu", getattr(torch, "xpu", None))):
        try:
            if module is not None and module.is_available():
                return name
        except Exception:
            continue
    return ""


def cuda_available(torch: ModuleType) -> bool:
    """Whether the workload's torch can use CUDA; False rather than an error."""
    try:
        return bool(torch.cuda.is_available())
    except Exception:
        return False
