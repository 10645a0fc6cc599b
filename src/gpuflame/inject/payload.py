"""``gpuflame-payload-install DEST``: what the webhook's init container runs.

It copies into DEST (the pod's shared ``emptyDir``, mounted at ``/gpuflame``):

- ``DEST/lib/gpuflame``: the package. The start-up path (bootstrap ->
  ``capture`` -> ``ship``) imports only the standard library, so the payload
  needs nothing from the workload image except a Python >= 3.10 and the
  framework it profiles (torch, jax). numpy and rich are used only by the
  analysis and terminal commands, which never run inside the workload.
- ``DEST/bootstrap/sitecustomize.py``: starts the profiler from PYTHONPATH.
- ``DEST/sessions/``: world-writable (sticky, like /tmp) because the
  workload may run as any user; each container writes below it.

Running it again replaces the copy (an init container restarts after a
failure), so it is idempotent.
"""

from __future__ import annotations

import compileall
import os
import shutil
import stat
import sys
from collections.abc import Sequence
from pathlib import Path

import gpuflame
from gpuflame.errors import GpuflameError

PACKAGE_DIR = Path(gpuflame.__file__).resolve().parent
BOOTSTRAP_SOURCE = PACKAGE_DIR / "inject" / "bootstrap"
_SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo")
_READABLE = stat.S_IRUSR | stat.S_IWUSR | stat.S_IRGRP | stat.S_IROTH
_DIR_MODE = 0o755
_SESSIONS_MODE = 0o1777


def install(dest: str | os.PathLike[str]) -> Path:
    """Copy the payload into ``dest``; returns ``dest``. Raises GpuflameError if it cannot write."""
    root = Path(dest)
    try:
        root.mkdir(parents=True, exist_ok=True)
        (root / "lib").mkdir(exist_ok=True)
        _replace_tree(PACKAGE_DIR, root / "lib" / "gpuflame")
        _replace_tree(BOOTSTRAP_SOURCE, root / "bootstrap")
        _sessions(root / "sessions")
    except OSError as exc:
        where = exc.filename or root
        raise GpuflameError(f"cannot install the gpuflame payload into {root}: {where}: {exc.strerror}") from None
    _precompile(root / "lib")
    return root


def _replace_tree(source: Path, target: Path) -> None:
    """Copy beside, then swap: a rerun never leaves a half old, half new package."""
    staging = target.with_name(target.name + ".new")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(source, staging, ignore=_SKIP)
    _make_readable(staging)
    if target.exists():
        shutil.rmtree(target)
    staging.rename(target)


def _make_readable(tree: Path) -> None:
    """Readable by every user: the workload container rarely runs as the init container's uid."""
    tree.chmod(_DIR_MODE)
    for folder, dirs, files in os.walk(tree):
        for name in dirs:
            os.chmod(os.path.join(folder, name), _DIR_MODE)
        for name in files:
            os.chmod(os.path.join(folder, name), _READABLE)


def _sessions(path: Path) -> None:
    path.mkdir(exist_ok=True)
    path.chmod(_SESSIONS_MODE)


def _precompile(lib: Path) -> None:
    """Byte-compile for this Python: a workload on the same version starts faster. Optional."""
    try:
        compileall.compile_dir(str(lib), quiet=2)
        _make_readable(lib / "gpuflame")
    except Exception:  # noqa: BLE001 - the sources alone are a complete payload
        pass


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1 or args[0].startswith("-"):
        sys.stderr.write("usage: gpuflame-payload-install DEST   (copies gpuflame and its bootstrap into DEST)\n")
        return 2
    try:
        root = install(args[0])
    except GpuflameError as exc:
        sys.stderr.write(f"gpuflame-payload-install: error: {exc}\n")
        return 1
    print(
        f"gpuflame-payload-install: gpuflame {gpuflame.__version__} in {root} "
        f"(PYTHONPATH={root / 'bootstrap'}:{root / 'lib'})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
