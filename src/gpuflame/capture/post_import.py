"""Run a callback right after a module is imported, without importing it ourselves.

The profiler starts before the workload imports torch or jax, and must not
import them itself (that would slow down and change programs that never use
them). A finder on ``sys.meta_path`` wraps the real loader of the watched
module and calls back once its module body has run.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TypeGuard

Callback = Callable[[ModuleType], None]

_lock = threading.Lock()
_callbacks: dict[str, list[Callback]] = {}
_finder: _PostImportFinder | None = None


def when_imported(name: str, callback: Callback) -> None:
    """Call *callback(module)* once *name* is imported (now, if it already is)."""
    module = sys.modules.get(name)
    if _imported(module):
        callback(module)
        return
    with _lock:
        _callbacks.setdefault(name, []).append(callback)
        _install()


def rearm() -> None:
    """Keep every watch waiting: the finder back on ``sys.meta_path``, the watches of modules imported without it run.

    A module imported while something had taken the finder off (see
    :func:`_install`) was never reported; a recording's start calls this so
    its watches still fire, late but once.
    """
    with _lock:
        ready = [name for name in _callbacks if _imported(sys.modules.get(name))]
        if _callbacks:
            _install()
    for name in ready:
        _fire(name, sys.modules[name])


def _imported(module: ModuleType | None) -> TypeGuard[ModuleType]:
    """True for a module whose body has run (not one still being imported)."""
    return module is not None and getattr(getattr(module, "__spec__", None), "_initializing", False) is False


def _install() -> None:
    """Put the finder first on ``sys.meta_path``, again if something took it off.

    Code that saves and restores ``sys.meta_path`` (pytest's ``pytester``,
    sandboxes) drops it; a watch set afterwards would then never fire.
    """
    global _finder
    if _finder is None:
        _finder = _PostImportFinder()
    if not any(finder is _finder for finder in sys.meta_path):
        sys.meta_path.insert(0, _finder)


def _fire(name: str, module: ModuleType) -> None:
    with _lock:
        callbacks = _callbacks.pop(name, [])
    for callback in callbacks:
        try:
            callback(module)
        except Exception as exc:  # the workload's import must go on
            sys.stderr.write(f"gpuflame: could not start after importing {name}: {exc}\n")


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself; wraps the loader that the other finders return."""

    def __init__(self) -> None:
        self._busy: set[str] = set()

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _callbacks or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._busy.discard(fullname)
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _NotifyingLoader(spec.loader, fullname)
        return spec


class _NotifyingLoader(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader, name: str) -> None:
        self._loader = loader
        self._name = name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        _fire(self._name, module)

    def __getattr__(self, name: str) -> object:
        # get_resource_reader, is_package, get_source ... of the real loader
        return getattr(self._loader, name)
