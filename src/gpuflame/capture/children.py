"""Say when the program starts a Python child that gpuflame cannot follow.

gpuflame follows children through ``PYTHONPATH`` (``boundary/contract.py``).
A child started with an environment that lost it, or with ``-I``/``-E``/``-S``,
runs unprofiled and leaves no file: the run would only see its absence. So
``subprocess.Popen`` is wrapped (once, when the program imports
``subprocess``) to check each child's command line and environment with
:func:`~gpuflame.boundary.contract.unprofiled_reason` before it starts; the
session says it once per reason, on stderr and to the launcher. A wrapper
costs a few microseconds per Popen (a fork costs milliseconds); an audit
hook would see every exec too, but it also runs on every ``sys._getframe``
(measured 57 -> 575 ns a call). ``os.exec*`` and ``os.posix_spawn`` are not
checked.

Standard library only: this runs inside the profiled process.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from gpuflame.boundary.contract import unprofiled_reason

# Popen's parameters after ``args``, in order (a caller may pass them by position)
_POSITIONAL = ("bufsize", "executable", "stdin", "stdout", "stderr", "preexec_fn", "close_fds", "shell", "cwd", "env")
_MARK = "_gpuflame_checks_children"


def watch(subprocess: ModuleType, say: Callable[[str], None]) -> None:
    """Check every child the program starts through *subprocess*; *say* hears each reason (it says it once)."""
    popen = subprocess.Popen
    real = popen.__init__
    if getattr(real, _MARK, False):
        return
    bootstrap = _bootstrap_folder()

    @functools.wraps(real)
    def __init__(self: Any, args: Any, *rest: Any, **kwargs: Any) -> None:
        try:
            reason = _reason(args, dict(zip(_POSITIONAL, rest, strict=False)) | kwargs, bootstrap)
            if reason:
                say(f"a child process goes unprofiled: {reason}")
        except Exception:  # noqa: BLE001 - the child must start regardless
            pass
        real(self, args, *rest, **kwargs)

    setattr(__init__, _MARK, True)
    popen.__init__ = __init__


def _bootstrap_folder() -> str:
    """The folder of the ``sitecustomize`` that started gpuflame here ('' when it was not one): in a pod, the
    payload's, which is not this package's own."""
    module = sys.modules.get("sitecustomize")
    path = getattr(module, "__file__", None)
    if not path or not hasattr(module, "_gpuflame_start"):
        return ""
    return os.path.dirname(os.path.abspath(path))


def _reason(args: Any, options: dict[str, Any], bootstrap: str) -> str:
    if isinstance(args, (str, bytes, os.PathLike)):
        text = os.fsdecode(args)
        argv = [text]
        if options.get("shell"):
            import shlex  # only for a shell command line: the process need not import it at start

            argv = shlex.split(text)
    else:
        argv = [os.fsdecode(a) for a in args]
    if options.get("executable") and not options.get("shell"):
        argv = [os.fsdecode(options["executable"]), *argv[1:]]
    env = options.get("env")
    env = os.environ if env is None else {os.fsdecode(k): os.fsdecode(v) for k, v in env.items()}
    return unprofiled_reason(argv, env, bootstrap)
