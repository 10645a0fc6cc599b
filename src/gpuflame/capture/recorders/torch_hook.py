"""Backend ``torch``: which of its two hooks records, the CPU allocator hook or the dispatch mode.

The rule is ``boundary/backends.py``'s :func:`~gpuflame.boundary.backends.torch_hook_for`;
this module builds the chosen recorder, and falls back to the dispatch mode
(said once) when the hook cannot be built here.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from gpuflame.boundary.backends import ALLOCATOR, DISPATCH, say, torch_hook_for

if TYPE_CHECKING:
    from gpuflame.capture.base import Recorder
    from gpuflame.capture.session import Session


def create(session: Session) -> Recorder:
    return torch_recorder(session.settings.torch_hook, say, native=session.settings.native)


def torch_recorder(hook: str, report: Callable[[str], None], native: bool = False) -> Recorder:
    """The ``torch`` backend's recorder: the CPU allocator hook where it can, else the dispatch mode.

    A hook that cannot be built (no compiler) falls back to the dispatch
    mode, said once. *native* (``--native``) adds the C++ frames below each
    Python caller; only the allocator hook has them.
    """
    if torch_hook_for(hook, sys.modules.get("torch")) == DISPATCH:
        return _dispatch_recorder()
    from gpuflame.capture.recorders.allocator import TorchAllocatorRecorder, hook_busy
    from gpuflame.capture.recorders.allocator.native import NativeUnavailable, load_cpu_hook

    if hook_busy():  # a recording inside a recording (the API inside gpuflame run)
        return _dispatch_recorder()
    try:
        return TorchAllocatorRecorder(load_cpu_hook(), native=native)
    except NativeUnavailable as exc:
        if hook == ALLOCATOR:
            raise
        report(
            f"torch backend: the CPU allocator hook is not available ({exc}); "
            "recording through a dispatch mode instead, which is slower"
        )
        return _dispatch_recorder()


def _dispatch_recorder() -> Recorder:
    """The dispatch-mode recorder, imported only when chosen (a large module)."""
    from gpuflame.capture.recorders.dispatch import TorchTensorRecorder

    return TorchTensorRecorder()
