"""Reading inputs with plain-worded errors and writing outputs atomically.

A profile that fails half way must never leave a half-written file where the
user expects a good one, so every output goes to a temporary file in the same
folder and is renamed into place only when complete.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from gpuflame.errors import GpuflameError


def read_bytes(path: str | os.PathLike[str]) -> bytes:
    """Read a whole input file, turning OS errors into one readable line."""
    p = Path(path)
    try:
        return p.read_bytes()
    except FileNotFoundError:
        raise GpuflameError(f"{p}: no such file") from None
    except IsADirectoryError:
        raise GpuflameError(f"{p}: is a directory, not a profile file") from None
    except PermissionError:
        raise GpuflameError(f"{p}: permission denied") from None
    except OSError as exc:
        raise GpuflameError(f"{p}: cannot read ({exc.strerror or exc})") from None


def atomic_write(path: str | os.PathLike[str], data: bytes | str) -> None:
    """Write *data* to *path* so that readers see the old file or the new one."""
    p = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    folder = p.parent if str(p.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=folder)
    except FileNotFoundError:
        raise GpuflameError(f"{p}: cannot write (folder {folder} does not exist)") from None
    except PermissionError:
        raise GpuflameError(f"{p}: cannot write (permission denied in {folder})") from None
    except OSError as exc:
        raise GpuflameError(f"{p}: cannot write ({exc.strerror or exc})") from None
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(payload)
        os.chmod(tmp, 0o644)
        os.replace(tmp, p)
    except OSError as exc:
        _remove_quietly(tmp)
        raise GpuflameError(f"{p}: cannot write ({exc.strerror or exc})") from None
    except BaseException:
        _remove_quietly(tmp)
        raise


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
