"""A meta-path block on numpy and rich for a fresh interpreter, installed before gpuflame: recording needs neither.

gpuflame's own modules are refused the protobuf runtime too (``google``): the profiled process writes pprof
with the standard library.
"""

from __future__ import annotations

# Installed before gpuflame is imported, after the frameworks (JAX needs numpy; torch loads it when
# it is there): a new import of numpy or rich fails for anyone, as a missing package does
# (ModuleNotFoundError), and any import of them by a gpuflame module fails even when the framework
# has loaded them already, so nothing is subtracted.
BLOCK = """
import builtins, importlib.abc, sys
BLOCKED = ("numpy", "rich")
# and the protobuf runtime (the pprof reader's), refused to gpuflame only: a framework may load it
REFUSED_TO_GPUFLAME = BLOCKED + ("google",)
attempts = []


class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            attempts.append(name)
            raise ModuleNotFoundError(f"{name} is blocked: the in-process side imports only the standard library")
        return None


_real_import = builtins.__import__


def _guarded(name, globals=None, locals=None, fromlist=(), level=0):
    caller = (globals or {}).get("__name__") or ""
    if caller.split(".")[0] == "gpuflame" and name.split(".")[0] in REFUSED_TO_GPUFLAME:
        attempts.append(f"{caller} -> {name}")
        raise ModuleNotFoundError(f"{name} is blocked for {caller}")
    return _real_import(name, globals, locals, fromlist, level)


sys.meta_path.insert(0, Blocked())
builtins.__import__ = _guarded
"""
