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
import time

from gpuflame.boundary import session_folder
from gpuflame.boundary.contract import STARTED_FILE


def register(folder: str, pid: int) -> str:
    """This process records from now on; never raises: '' or why it could not register.

    The file is written under a fresh name and renamed into place, so that
    nothing already at its name (a planted FIFO, a link) is ever opened; on
    a full disk it is made empty: its name is what the launcher reads.
    """
    name = STARTED_FILE.format(pid=pid)
    try:
        with session_folder.opened(folder) as fd:
            try:
                session_folder.write_file(fd, name, json.dumps({"started": time.time()}).encode())
                return ""
            except OSError:
                session_folder.remove(fd, name)
                session_folder.create_file(fd, name)
                return ""
    except OSError as exc:
        return (
            f"could not register in the run's roll call ({folder}/{name}: {exc.strerror or exc}): if this "
            "process ends without its exit hooks, the run cannot name it"
        )


def unregister(folder: str, pid: int) -> None:
    """This process's exit hooks ran: what it wrote (or the note of what it lost) is final."""
    try:
        with session_folder.opened(folder) as fd:
            session_folder.remove(fd, STARTED_FILE.format(pid=pid))
    except OSError:
        pass
