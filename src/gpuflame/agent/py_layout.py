"""Whether a process's CPython is laid out as py_offsets.py says, checked before the BPF side walks it.

The offsets are chosen by major.minor, but a vendor's patch, a free-threaded
(``python3.13t``) or debug (``Py_DEBUG``) build moves fields: walked blindly,
such a process would give garbage names or cut stacks. So before a process
gets Python stacks its layout is checked against the process itself:

- 3.13+: CPython publishes its own offsets at the start of ``_PyRuntime``
  (``_Py_DebugOffsets``, cookie ``xdebugpy``, for out-of-process tools);
  every field it publishes that the agent uses must equal the table's, and
  its ``free_threaded`` word must be 0.
- 3.10-3.12: the thread list must read back right: from ``_PyRuntime``
  through the first interpreter to its thread states, one of which carries
  the id of one of the process's own threads.

A build the file names as free-threaded or debug (abiflags ``t``/``d``) is
refused at once. Anything refused gets native stacks and one line. A process
caught before its interpreter made its first thread (just exec'd) cannot be
checked yet (:class:`NotReady`): the table is trusted for the moment and the
check run again while the agent looks at new processes.
"""

from __future__ import annotations

import os
import struct

from gpuflame.agent.pyremote import Memory

DEBUG_COOKIE = b"xdebugpy"
DEBUG_FREE_THREADED = 16  # _Py_DebugOffsets.free_threaded (3.13+): after the cookie and the version
# where 3.13's _Py_DebugOffsets publishes each offset the agent uses (the table's name -> its position)
DEBUG_OFFSETS_313 = {
    "runtime_interp_head": 40, "interp_threads_head": 72, "tstate_next": 168, "tstate_frame": 184,
    "tstate_thread_id": 192, "tstate_native_thread_id": 200, "frame_previous": 232, "frame_code": 240,
    "frame_instr": 248, "frame_owner": 264, "code_filename": 280, "code_name": 288, "code_qualname": 296,
    "code_linetable": 304, "code_firstlineno": 312, "code_adaptive": 344, "object_type": 360, "type_name": 376,
}
THREADS_CHECKED = 4096  # thread states followed looking for one of the process's threads


class NotReady(Exception):
    """The interpreter has no thread yet: nothing to check against."""


def build_refused(abiflags: str) -> str | None:
    """Why a build the file's name marks (``python3.13t``, ``libpython3.12d.so``) is not walked."""
    if "t" in abiflags:
        return "a free-threaded build (its objects and frames are laid out apart): not supported"
    if "d" in abiflags:
        return "a debug build (Py_DEBUG moves the object header): not supported"
    return None


def check(pid: int, version: str, runtime: int, offsets: dict[str, int], memory: Memory) -> str | None:
    """None when the process reads back as the table says; else why not, in words (NotReady: too early)."""
    try:
        if tuple(map(int, version.split("."))) >= (3, 13):
            return _check_debug_offsets(runtime, offsets, memory)
        return _check_threads(pid, runtime, offsets, memory)
    except (OSError, ValueError, struct.error):
        return "its interpreter state could not be read back"


def _check_debug_offsets(runtime: int, offsets: dict[str, int], memory: Memory) -> str | None:
    raw = memory.read(runtime, max(DEBUG_OFFSETS_313.values()) + 8)
    if raw[:8] != DEBUG_COOKIE:
        return "its _PyRuntime does not start with CPython's debug offsets"
    if struct.unpack_from("<Q", raw, DEBUG_FREE_THREADED)[0]:
        return build_refused("t")
    for name, at in DEBUG_OFFSETS_313.items():
        published = struct.unpack_from("<Q", raw, at)[0]
        if published != offsets[name]:
            return f"its own debug offsets put {name} at {published}, the agent's table at {offsets[name]}"
    return None


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
