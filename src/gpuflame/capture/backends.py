"""The capture backends: one registry of what each is called, which import starts it, and how it is built.

Every question about backends is answered here: the names ``--backend``
accepts (:data:`BACKENDS`), the framework whose import starts each one
(:data:`REGISTRY`), the two "auto" decisions (:func:`for_framework`: which
backend records a framework just imported; :func:`torch_recorder`: which
torch hook records), and the recorders' factories. A recorder's module is
imported only when a workload needs it (the in-process side imports only
the standard library until the framework is there).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuflame.capture.session import Recorder, Session


@dataclass(frozen=True)
class Backend:
    """One backend: its ``--backend`` name, the framework it records, and its factory."""

    name: str
    framework: str  # the module whose import starts it
    create: Callable[[Session], Recorder]


def _torch_cuda(session: Session) -> Recorder:
    from gpuflame.capture.torch_cuda import TorchCudaRecorder

    return TorchCudaRecorder(on_oom=session.write, native=session.settings.native)


def _torch(session: Session) -> Recorder:
    return torch_recorder(session.settings.torch_hook, say, native=session.settings.native)


def _jax(session: Session) -> Recorder:
    from gpuflame.capture.jax_memory import JaxMemoryRecorder

    return JaxMemoryRecorder(keep_framework=session.settings.keep_framework)


AUTO = "auto"  # the name that lets the rules below decide (for_framework, torch_recorder)
REGISTRY = {b.name: b for b in (Backend("torch-cuda", "torch", _torch_cuda), Backend("torch", "torch", _torch),
                                Backend("jax", "jax", _jax))}
BACKENDS = (AUTO, *REGISTRY)  # what --backend and GPUFLAME_BACKEND accept
TORCH_HOOKS = (AUTO, "allocator", "dispatch")  # how the torch backend records (torch_recorder)


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
    if framework.__name__ == "torch":
        return "torch-cuda" if cuda_available(framework) else "torch"
    return next(b.name for b in REGISTRY.values() if b.framework == framework.__name__)


def create(name: str, session: Session) -> Recorder:
    """A new, not yet started recorder for backend *name*."""
    if name not in REGISTRY:
        raise ValueError(f"unknown backend {name!r}")
    return REGISTRY[name].create(session)


def torch_recorder(hook: str, report: Callable[[str], None], native: bool = False) -> Recorder:
    """The ``torch`` backend's recorder: the CPU allocator hook where it can, else the dispatch mode.

    The allocator hook is much faster but sees CPU memory only, so ``auto``
    takes it only when torch has no accelerator here; ``dispatch`` sees
    tensors on every device. A hook that cannot be built (no compiler) falls
    back to the dispatch mode, said once. *native* (``--native``) adds the C++
    frames below each Python caller; only the allocator hook has them.
    """
    torch = sys.modules.get("torch")
    if hook == "dispatch" or (hook == AUTO and torch is not None and accelerator(torch)):
        return _dispatch_recorder()
    from gpuflame.capture.native import NativeUnavailable, load_cpu_hook
    from gpuflame.capture.torch_allocator import TorchAllocatorRecorder, hook_busy

    if hook_busy():  # a recording inside a recording (the API inside gpuflame run)
        return _dispatch_recorder()
    try:
        return TorchAllocatorRecorder(load_cpu_hook(), native=native)
    except NativeUnavailable as exc:
        if hook == "allocator":
            raise
        report(f"torch backend: the CPU allocator hook is not available ({exc}); "
               "recording through a dispatch mode instead, which is slower")
        return _dispatch_recorder()


def _dispatch_recorder() -> Recorder:
    """The dispatch-mode recorder, imported only when chosen (a large module)."""
    from gpuflame.capture.torch_tensors import TorchTensorRecorder

    return TorchTensorRecorder()


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
