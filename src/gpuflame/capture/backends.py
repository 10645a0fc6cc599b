"""The capture backends by name, imported only when a workload needs one."""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuflame.capture.session import Recorder, Session


def create(name: str, session: Session) -> Recorder:
    """A new, not yet started recorder for backend *name*."""
    if name == "torch":
        from gpuflame.capture.torch_tensors import TorchTensorRecorder

        return TorchTensorRecorder()
    if name == "torch-cuda":
        from gpuflame.capture.torch_cuda import TorchCudaRecorder

        return TorchCudaRecorder(on_oom=session.write, native=session.settings.native)
    if name == "jax":
        from gpuflame.capture.jax_memory import JaxMemoryRecorder

        return JaxMemoryRecorder(keep_framework=session.settings.keep_framework)
    raise ValueError(f"unknown backend {name!r}")


def cuda_available(torch: ModuleType) -> bool:
    """Whether the workload's torch can use CUDA; False rather than an error."""
    try:
        return bool(torch.cuda.is_available())
    except Exception:
        return False
