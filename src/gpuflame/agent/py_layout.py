"""A process's CPython layout: read from the process itself (3.13+) or the table checked against it (3.10-3.12).

The agent reads CPython's structures from outside the process; a vendor's patch,
a free-threaded (``python3.13t``) or debug (``Py_DEBUG``) build moves fields, and
walked blindly such a process would give garbage names or cut stacks. So:

- 3.13+: CPython publishes its own offsets at the start of ``_PyRuntime``
  (``_Py_DebugOffsets``, cookie ``xdebugpy``, for out-of-process tools). The
  agent reads them there (where each sits: py_offsets.DEBUG_POSITIONS), after
  checking the cookie, that the version it publishes is the one the files say,
  and that its ``free_threaded`` word is 0. The table gives only what CPython
  does not publish. A debug build is read like any other.
- 3.10-3.12: the table for the version, refused for free-threaded or debug
  builds (abiflags ``t``/``d``: from the file's name or the functions only
  such a build exports, :func:`gpuflame.agent.procs.build_flags`).

Either way the thread list must then read back right: from ``_PyRuntime``
through the first interpreter to its thread states, one of which carries the
id of one of the process's own threads. Anything refused gets native stacks
and one line. A process caught before its interpreter made its first thread
(just exec'd) cannot be checked yet (:class:`NotReady`): the offsets are used
for the moment and the check run again while the agent looks at new processes.
"""

from __future__ import annotations

import os
import struct

from gpuflame.agent.py_offsets import DEBUG_POSITIONS, OFFSETS
from gpuflame.agent.pyremote import Memory

DEBUG_COOKIE = b"xdebugpy"
DEBUG_VERSION = 8  # _Py_DebugOffsets.version: PY_VERSION_HEX of the process
DEBUG_FREE_THREADED = 16  # _Py_DebugOffsets.free_threaded (3.13+): after the cookie and the version
THREADS_CHECKED = 4096  # thread states followed looking for one of the process's threads
FREE_THREADED = "a free-threaded build (its objects and frames are laid out apart): not supported"


class NotReady(Exception):
    """The interpreter has no thread yet: nothing to check against."""


def publishes_offsets(version: str) -> bool:
    """Whether this CPython publishes its own layout (``_Py_DebugOffsets``: 3.13+)."""
    return version in DEBUG_POSITIONS


def build_refused(abiflags: str, version: str) -> str | None:
    """Why a build the file's name marks (``python3.13t``, ``libpython3.12d.so``) is not walked.

    A debug build publishes its own offsets on 3.13+ and is read like any other; before that it is refused.
    """
    if "t" in abiflags:
        return FREE_THREADED
    if "d" in abiflags and not publishes_offsets(version):
        return "a debug build of Python before 3.13 (Py_DEBUG moves the object header): not supported"
    return None


def offsets_for(version: str, runtime: int, memory: Memory) -> dict[str, int] | str:
    """The offsets to walk this process with; else why there are none, in words."""
    if not publishes_offsets(version):
        return OFFSETS[version]
    try:
        return _read_debug_offsets(version, runtime, memory)
    except (OSError, ValueError, struct.error):
        return "its _PyRuntime could not be read"


def _read_debug_offsets(version: str, runtime: int, memory: Memory) -> dict[str, int] | str:
    positions = DEBUG_POSITIONS[version]
    raw = memory.read(runtime, max(positions.values()) + 8)
    if raw[:8] != DEBUG_COOKIE:
        return "its _PyRuntime does not start with CPython's debug offsets"
    hexversion = struct.unpack_from("<Q", raw, DEBUG_VERSION)[0]
    published = f"{hexversion >> 24}.{(hexversion >> 16) & 0xFF}"
    if published != version:
        return f"its debug offsets are Python {published}'s, its files say {version}"
    if struct.unpack_from("<Q", raw, DEBUG_FREE_THREADED)[0]:
        return FREE_THREADED
    table = OFFSETS[version]
    out = dict(table)
    for name, at in positions.items():
        value = struct.unpack_from("<Q", raw, at)[0]
        if value >= 1 << 16:
            return f"its debug offsets put {name} at {value}, beyond any CPython structure"
        out[name] = value
    # not published: the compact str's data follows the ASCII header by as much as in the table
    header = table["unicode_compact_data"] - table["unicode_ascii_data"]
    out["unicode_compact_data"] = out["unicode_ascii_data"] + header
    return out


def check(pid: int, offsets: dict[str, int], runtime: int, memory: Memory) -> str | None:
    """None when the process's thread list reads back with *offsets*; else why not, in words (NotReady: too early)."""
    try:
        return _check_threads(pid, runtime, offsets, memory)
    except (OSError, ValueError, struct.error):
        return "its interpreter state could not be read back"


def _check_threads(pid: int, runtime: int, offsets: dict[str, int], memory: Memory) -> str | None:
    interp = memory.u64(runtime + offsets["runtime_interp_head"])
    tstate = memory.u64(interp + offsets["interp_threads_head"]) if interp else 0
    if not interp or not tstate:
        raise NotReady
    native = offsets["tstate_native_thread_id"] >= 0
    want = _thread_ids(pid) if native else set()
    for _ in range(THREADS_CHECKED):
        if not tstate:
            break
        if native:
            if memory.u64(tstate + offsets["tstate_native_thread_id"]) & 0xFFFFFFFF in want:
                return None
        elif memory.u64(tstate + offsets["tstate_thread_id"]):  # 3.10: pthread_self(), never 0
            return None
        tstate = memory.u64(tstate + offsets["tstate_next"])
    return "none of its thread states reads back with one of its threads' ids"


def _thread_ids(pid: int) -> set[int]:
    """The process's thread ids as it sees them (its innermost pid namespace: what CPython stores)."""
    out: set[int] = set()
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                out.update(int(line.split()[-1]) for line in f if line.startswith("NSpid:"))
        except (OSError, ValueError):
            continue
    return out
