"""The run's shared peak tables, seen from Python: where they are, and who in a process publishes.

``gpuflame run`` hands every process one session folder. In it, one small
file per device, mapped by every process that records the device, lets the
processes find their *joint* peak: the highest total they held together at
one moment, with each one's share then (the mechanism is described in
``native/cpu_hook.cpp``, which implements it for both torch recorders). A
process outside a run (the Python API) has no table: its windows are merged
by time instead (:mod:`gpuflame.model.merge`).

Within one process only the first recorder of a device publishes to its
table (a ``gpuflame.profile()`` block inside ``gpuflame run`` records the
same bytes as the run's own recorder: publishing them twice would double them).
"""

from __future__ import annotations

import os
import re
import threading
from types import ModuleType

from gpuflame.boundary import session_folder
from gpuflame.boundary.contract import TABLE_FILE
from gpuflame.boundary.settings import env_name
from gpuflame.capture.exit_hooks import HOOKS

SESSION_ENV = env_name("session_dir")  # set by gpuflame run for every process

_lock = threading.Lock()
_claimed: dict[str, int] = {}  # device -> table handle held by a recorder of this process


def table_path(device: str) -> str:
    """The table file of *device* in this run's session folder; '' outside a run."""
    folder = os.environ.get(SESSION_ENV, "")
    if not folder:
        return ""
    return os.path.join(folder, TABLE_FILE.format(device=re.sub(r"[^A-Za-z0-9_.-]", "_", device)))


def claim(hook: ModuleType, device: str) -> tuple[int, str]:
    """(table handle, '') for this process's recorder of *device*; (-1, why) when it gets none.

    The reason is '' when there is simply no run (the Python API) or another
    recorder of this process already publishes the device.
    """
    path = table_path(device)
    if not path:
        return -1, ""
    with _lock:
        if device in _claimed:
            return -1, ""
        try:
            with session_folder.opened(os.path.dirname(path)):
                pass  # the run's own private folder (the table file itself is checked as it is opened)
            handle = int(hook.table_open(path))
        except Exception as exc:  # noqa: BLE001 - the profile says what it means; recording goes on
            return -1, (
                f"no joint peak: the run's shared peak table could not be used ({exc}); this process's "
                "peak joins the run's as a bound, not one moment"
            )
        _claimed[device] = handle
        return handle, ""


def release(device: str, handle: int) -> None:
    """The recorder of *device* stopped publishing (it left the table)."""
    with _lock:
        if _claimed.get(device) == handle:
            del _claimed[device]


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # another thread may have held it at the fork


HOOKS.at_fork_child(_after_fork_in_child)
