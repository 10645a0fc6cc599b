"""The recorders: one module or package per backend and hook, each built by its module's ``create(session)``.

- ``torch_cuda/``: backend ``torch-cuda``, PyTorch's caching-allocator history
  (``history.py``: totals over a bounded trace).
- ``torch_hook.py``: backend ``torch``, which of its two hooks records:
  ``allocator/`` (the C++ CPU allocator hook, built by ``allocator/native/``)
  or ``dispatch/`` (a ``TorchDispatchMode``, any device).
- ``jax_memory.py``: backend ``jax``, JAX's live buffers, sampled.

Which module records which backend is written in one place,
``boundary/backends.py``'s registry; :func:`create` imports it by that name,
only when the workload's framework is there.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from gpuflame.boundary.backends import REGISTRY

if TYPE_CHECKING:
    from gpuflame.capture.base import Recorder
    from gpuflame.capture.session import Session


def create(name: str, session: Session) -> Recorder:
    """A new, not yet started recorder for backend *name*."""
    if name not in REGISTRY:
        raise ValueError(f"unknown backend {name!r}")
    recorder: Recorder = importlib.import_module(REGISTRY[name].recorder).create(session)
    return recorder
