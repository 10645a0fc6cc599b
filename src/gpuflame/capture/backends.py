"""The capture backends by name, imported only when a workload needs one."""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuflame.capture.session import Recorder, Session


def create(name: str, session: Session) -> Recorder:
    """A new, not yet started recorder for backend *name*."""
    if name == "torch":
        return torch_recorder(session.settings.torch_hook, say, native=session.settings.native)
    if name == "torch-cuda":
        from gpuflame.capture.torch_cuda import TorchCudaRecorder

        return TorchCudaRecorder(on_oom=session.write, native=session.settings.native)
    if name == "jax":
        from gpuflame.capture.jax_memory import JaxMemoryRecorder

        return JaxMemoryRecorder(keep_framework=session.settings.keep_framework)
    raise ValueError(f"unknown backend {name!r}")


def torch_recorder(hook: str, report: Callable[[str], None], native: bool = False) -> Recorder:
    """The ``torch`` backend's recorder: the CPU allocator hook where it can, else the dispatch mode.

    The allocator hook is much faster but sees CPU memory only, so ``auto``
    takes it only when torch has no accelerator here; ``dispatch`` sees
    tensors on every device. A hook that cannot be built (no compiler) falls
    back to the dispatch mode, said once. *native* (``--native``) adds the C++
    frames below each Python caller; only the allocator hook has them.
    """
    torch = sys.modules.get("torch")
    if hook == "dispatch" or (hook == "auto" and torch is not None and accelerator(torch)):
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
