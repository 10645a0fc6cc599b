"""Defaults that several parts of gpuflame share: one owner each, so that changing one is one edit.

Standard library only (nothing at all): the in-process side reads these too.
A default that only one module uses stays in that module.
"""

from __future__ import annotations

BACKEND = "auto"  # --backend, GPUFLAME_BACKEND, the webhook's gpuflame.io/backend, the API (capture/backends.py)
TORCH_HOOK = "auto"  # --torch-hook, GPUFLAME_TORCH_HOOK
PUSH_INTERVAL_S = 15.0  # seconds between Pyroscope pushes when none is given (run --pyroscope, the webhook)
PUSH_TIMEOUT_S = 5.0  # seconds one push to Pyroscope may take
PUSH_FLUSH_S = 3.0  # seconds a process may spend at exit sending what is still queued
