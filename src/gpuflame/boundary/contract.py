"""What ``gpuflame run`` (or the webhook) and a profiled process agree on, in one place.

The launcher hands every process of a run one session folder (its path in
``GPUFLAME_SESSION_DIR``, with the other settings: ``boundary/settings.py``)
and puts :data:`BOOTSTRAP_DIR` in front of ``PYTHONPATH``, so that Python's
``sitecustomize`` starts the profiler in the program and its children. Each
process writes into that folder the files named here; the launcher reads
them back by the pid in their names.

Standard library only: the profiled process imports this module.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from gpuflame.boundary.session_folder import own_files
from gpuflame.boundary.settings import Settings, env_name

# -- the session folder ----------------------------------------------------------------

PROCESS_FILE = "proc-{pid}.pb.gz"  # the process's profile (its last --interval snapshot until the final one)
LOST_FILE = "lost-{pid}.txt"  # one line per thing the process could not record
IDLE_FILE = "idle-{pid}.txt"  # why a process that ran under the profiler recorded nothing
STARTED_FILE = "started-{pid}"  # recording, final profile not written yet (roll_call.py)
TABLE_FILE = "peak-{device}.table"  # the run's shared peak table of one device (capture/books/joint_peak.py)
PER_PROCESS = (PROCESS_FILE, LOST_FILE, IDLE_FILE, STARTED_FILE)
_PID = re.compile(r"^[a-z]+-(\d+)(?:\.|$)")


def pid_of(path: str | os.PathLike[str]) -> int | None:
    """The pid in a per-process file's name (``proc-123.pb.gz`` -> 123); None for any other name."""
    m = _PID.match(os.path.basename(path))
    return int(m.group(1)) if m else None


def process_files(folder: int, pattern: str) -> dict[int, str]:
    """pid -> name of the file of *folder* (a descriptor) named by *pattern*, in pid order.

    Only regular files of this user count (``session_folder.own_files``): a
    link, a FIFO or another user's file under such a name is no process.
    """
    found = {}
    for name in own_files(folder):
        pid = pid_of(name)
        if pid is not None and name == pattern.format(pid=pid):
            found[pid] = name
    return dict(sorted(found.items()))


# -- the child's environment ---------------------------------------------------------------

HOME_ENV = "GPUFLAME_HOME"  # where the bootstrap finds the gpuflame package (a pod has no site-packages copy)
PACKAGE_HOME = str(Path(__file__).resolve().parents[2])  # the folder holding the gpuflame package
BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "inject", "bootstrap")


def child_env(settings: Settings, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment that starts gpuflame in the program and its children: *base* (ours) plus the bootstrap."""
    env = dict(os.environ if base is None else base)
    paths = [BOOTSTRAP_DIR] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env[HOME_ENV] = PACKAGE_HOME
    env.update(settings.to_env())
    return env


_PYTHON = re.compile(r"python[0-9.]*$")  # the name of an interpreter gpuflame can start in
# flags that keep the bootstrap from running: what each skips
_SKIPS_PATH = {"I": "ignores PYTHONPATH", "E": "ignores PYTHONPATH", "S": "skips site (so sitecustomize)"}
_TAKES_VALUE = "WX"  # -W arg, -X opt
_ENDS_OPTIONS = "cm"  # -c cmd, -m mod: what follows is the program's


def unprofiled_reason(argv: Sequence[str], env: Mapping[str, str], bootstrap: str = BOOTSTRAP_DIR) -> str:
    """Why gpuflame cannot start in a Python started with *argv* and *env*, and the fix; '' when it can.

    The bootstrap (the folder *bootstrap*: a pod's is the payload's, not
    this package's; '' when unknown, then only the flags are checked) runs
    only from ``PYTHONPATH``: a child started with it cleared, or an
    interpreter told to ignore it, runs unprofiled. A program that is not
    Python (a shell, a launcher) is taken on trust ('').
    """
    if not argv or not _PYTHON.match(os.path.basename(str(argv[0]))):
        return ""
    name = os.path.basename(str(argv[0]))
    flag = _path_skipping_flag([str(w) for w in argv[1:]])
    if flag:
        return f"{name} {flag} {_SKIPS_PATH[flag[1]]}, where gpuflame starts: start it without {flag}"
    entries = [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if bootstrap and os.path.abspath(bootstrap) not in entries:
        return (
            f"{name} was started with a PYTHONPATH that lost gpuflame's bootstrap: pass the environment on "
            "(env={**os.environ, ...})"
        )
    return ""


def _path_skipping_flag(words: list[str]) -> str:
    """``-I``, ``-E`` or ``-S`` among the interpreter's own options (``-IS`` too); ''."""
    skip_next = False
    for word in words:
        if skip_next:
            skip_next = False
            continue
        if word in ("-", "--") or not word.startswith("-"):
            return ""  # the script (or stdin): the program's arguments follow
        if word.startswith("--"):
            skip_next = word == "--check-hash-based-pycs"
            continue
        for i, letter in enumerate(word[1:]):
            if letter in _SKIPS_PATH:
                return f"-{letter}"
            if letter in _ENDS_OPTIONS:
                return ""
            if letter in _TAKES_VALUE:
                skip_next = i == len(word) - 2  # its value is the next word
                break
    return ""


def stop_following() -> None:
    """Children of this process start without the profiler (``--no-follow``): undo :func:`child_env` here."""
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != BOOTSTRAP_DIR]
    if parts:
        os.environ["PYTHONPATH"] = os.pathsep.join(parts)
    else:
        os.environ.pop("PYTHONPATH", None)
    os.environ.pop(env_name("session_dir"), None)
    os.environ.pop(env_name("enabled"), None)
