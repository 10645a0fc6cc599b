"""Defaults that several parts of gpuflame share: one owner each, so that changing one is one edit.

Standard library only (``os`` and ``pathlib``): the in-process side reads these too.
A default that only one module uses stays in that module.
"""

from __future__ import annotations

import os
from pathlib import Path

BACKEND = "auto"  # --backend, GPUFLAME_BACKEND, the webhook's gpuflame.io/backend, the API (boundary/backends.py)
TORCH_HOOK = "auto"  # --torch-hook, GPUFLAME_TORCH_HOOK
PUSH_INTERVAL_S = 15.0  # seconds between Pyroscope pushes when none is given (run --pyroscope, the webhook)
PUSH_TIMEOUT_S = 5.0  # seconds one push to Pyroscope may take
PUSH_FLUSH_S = 3.0  # seconds a process may spend at exit sending what is still queued

# The bounds of an interval between snapshots (--interval, the API's interval, GPUFLAME_INTERVAL, the webhook's
# gpuflame.io/interval; checked by units.interval_seconds). Below MIN_INTERVAL_S the snapshot stops being
# occasional: each one walks the recorder's rows and (torch) the object graph, a few ms on a small program and
# tens of ms on a large one, so 100 ms keeps it to a few percent of a core while still leaving a snapshot before
# a process killed half a second in (the suite's SIGKILL and os._exit tests use 100 ms); 1e-10 s halved the
# program's throughput. Above MAX_INTERVAL_S there is no interval (0 says "only at exit"), and a timer wait past
# threading.TIMEOUT_MAX (inf) raises OverflowError in the snapshot thread.
MIN_INTERVAL_S = 0.1
MAX_INTERVAL_S = 24 * 3600.0


def cache_dir() -> Path:
    """Where gpuflame keeps what it can rebuild between runs (compiled helpers, source indexes):
    ``$GPUFLAME_CACHE_DIR``, else ``$XDG_CACHE_HOME/gpuflame``, else ``~/.cache/gpuflame``."""
    env = os.environ.get("GPUFLAME_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gpuflame"


def source_index_dir() -> Path:
    """Where the readers keep source files' indexes between runs (symbols/index_cache.py)."""
    return cache_dir() / "source-index"
