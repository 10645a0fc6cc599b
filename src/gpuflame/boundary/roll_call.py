"""The registering half of a run's roll call: a profiled process says it records, then that it finished.

A process registers in the session folder (``started-PID``, holding its
start time) when it starts recording, and removes that file once its final
profile is written (or its loss noted). A file still there after the run
names a process that ended without its exit hooks: ``os._exit``, SIGKILL, a
crash. The launcher's half (who is still registered, when each ended) is
``launch/roll_call.py``.

Standard library only: the profiled process imports this module.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from gpuflame.boundary.contract import STARTED_FILE
from gpuflame.files import atomic_write


def register(folder: str, pid: int) -> str:
    """This process records from now on; never raises: '' or why it could not register.

    On a full disk the file is made empty: its name is what the launcher reads.
    """
    path = Path(folder) / STARTED_FILE.format(pid=pid)
    try:
        atomic_write(path, json.dumps({"started": time.time()}))
        return ""
    except Exception:  # noqa: BLE001 - the launcher then just knows less
        pass
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o666))
        return ""
    except OSError as exc:
        return (
            f"could not register in the run's roll call ({path}: {exc.strerror or exc}): if this process "
            "ends without its exit hooks, the run cannot name it"
        )


def unregister(folder: str, pid: int) -> None:
    """This process's exit hooks ran: what it wrote (or the note of what it lost) is final."""
    try:
        os.unlink(Path(folder) / STARTED_FILE.format(pid=pid))
    except OSError:
        pass
