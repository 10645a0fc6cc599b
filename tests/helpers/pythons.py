"""The CPython versions gpuflame supports, and where this machine keeps an interpreter of each."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

VERSIONS = ("3.10", "3.11", "3.12", "3.13", "3.14")
# a CPython not in pyenv here, where docs/agent-python.md puts it (3.14: built from source, or Debian's unpacked)
OPT_PYTHONS = {"3.14": "/opt/cpython-3.14/bin/python3.14"}


def python_for(version: str) -> str | None:
    """An interpreter of *version* (pyenv's, /opt/cpython-X.Y's, or pythonX.Y on PATH)."""
    root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    for exe in sorted(Path(root, "versions").glob(f"{version}.*/bin/python{version}"), reverse=True):
        return str(exe)
    if os.access(OPT_PYTHONS.get(version, "/nonexistent"), os.X_OK):
        return OPT_PYTHONS[version]
    return shutil.which(f"python{version}")
