"""Where a source file recorded on another machine is on this one.

A PyTorch snapshot names each Python frame by ``co_name`` only (``step``),
and its file paths are the recording machine's. To name the class
(``AdamW > step``) the source must be read, so a recorded path is looked for:

* under ``--source-root OLD=NEW``: the recording machine's ``OLD`` prefix
  replaced by ``NEW`` here (a checkout of the same code);
* for installed packages and the standard library, the same path relative to
  ``site-packages``/``dist-packages``/``lib/pythonX.Y`` under this machine's
  own (``torch/optim/adamw.py``). The version here may differ, so such a file
  is trusted only where a ``def`` of that very name holds that very line.
"""

from __future__ import annotations

import os
import re
import site
import sys
import sysconfig
from collections.abc import Iterable, Sequence
from typing import NamedTuple

# Where an installed file's path within its library folder starts, tried in order:
# site-packages, the standard library on POSIX, the standard library on Windows.
_INSTALLED = (
    re.compile(r"^.*/(?:site-packages|dist-packages)/"),
    re.compile(r"^.*/lib/python3\.\d+/"),
    re.compile(r"^.*/[Ll]ib/"),
)


class Candidate(NamedTuple):
    path: str
    exact: bool  # the same source (a --source-root mapping), not only the same package path


def parse_root(text: str) -> tuple[str, str]:
    """``OLD=NEW`` -> (OLD, NEW); ValueError with a plain message otherwise."""
    old, sep, new = text.partition("=")
    if not sep or not old or not new:
        raise ValueError(f"expected OLD=NEW (the recording machine's path prefix = this machine's), got {text!r}")
    return old.rstrip("/") or "/", new.rstrip("/") or "/"


def local_library_dirs() -> list[str]:
    """This interpreter's site-packages (its own and those on ``sys.path``) and standard library."""
    paths = sysconfig.get_paths()
    dirs = [paths.get("purelib"), paths.get("platlib"), paths.get("stdlib")]
    try:
        dirs += site.getsitepackages()
    except AttributeError:  # some virtualenvs' site module
        pass
    dirs += [p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages")]
    out: list[str] = []
    for d in dirs:
        if d and d not in out and os.path.isdir(d):
            out.append(d)
    return out


class SourceMap:
    """Recorded path -> paths to try here, in order."""

    def __init__(self, roots: Iterable[tuple[str, str]] = (), library_dirs: Sequence[str] | None = None) -> None:
        self.roots = list(roots)
        self._library_dirs = list(library_dirs) if library_dirs is not None else None

    @property
    def library_dirs(self) -> list[str]:
        if self._library_dirs is None:
            self._library_dirs = local_library_dirs()
        return self._library_dirs

    def candidates(self, path: str) -> list[Candidate]:
        """Paths to try here; a path recorded on Windows (``C:\\...\\site-packages\\torch\\...``) too."""
        path = path.replace("\\", "/")
        out = []
        for old, new in self.roots:
            old = old.replace("\\", "/")
            if path == old or path.startswith(old + "/") or old == "/":
                rest = path[len(old) :] if old != "/" else path
                out.append(Candidate(new + rest if rest.startswith("/") else os.path.join(new, rest), True))
        m = next((m for m in (p.match(path) for p in _INSTALLED) if m), None)
        if m:
            rel = path[m.end() :]
            out += [Candidate(os.path.join(d, rel), False) for d in self.library_dirs]
        return out
