"""What a served folder holds, and the one gate between a request's id and a file.

An id is a profile's path relative to the served folder, ``/``-separated
(``20261129-174102-train.py/profile.pb.gz``, ``old/run.pb.gz``). Ids come
from the network, so :func:`resolve_id` refuses anything malformed before it
touches the disk, then resolves symlinks and refuses whatever lands outside
the folder: the server never reads a file it did not check here.
"""

from __future__ import annotations

import json
import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuflame.errors import GpuflameError
from gpuflame.files import open_regular
from gpuflame.launch.store import META_NAME, PROFILE_NAME
from gpuflame.printable import encodable

# Names of files worth listing and serving: pprof (JAX's save_device_memory_profile writes memory.prof), folded
# stacks, PyTorch snapshots.
PROFILE_SUFFIXES = (".pb.gz", ".pb", ".pprof", ".prof", ".folded", ".collapsed", ".pickle", ".pickle.gz")

# The order in which a run's totals answer "how much did it hold" (as `gpuflame run` says it).
PEAK_TYPES = ("peak_space", "inuse_space", "alloc_space")

MAX_DEPTH = 4  # folders below the root that are searched
MAX_ENTRIES = 5000  # beyond this, a page is no longer useful to a person
MAX_META_BYTES = 1 << 20  # a meta.json gpuflame writes is a few hundred bytes; a bigger one is not read
LATEST_TIME = 253402300799  # 9999-12-31 23:59:59 UTC: the last second a page can print
MAX_BYTES = 1 << 63  # a byte count past this is not one a machine holds


class BadId(ValueError):
    """An id that no listed entry could have: malformed, answered with 400."""


class NotServed(LookupError):
    """An id that names nothing servable inside the folder: answered with 404."""


@dataclass(frozen=True)
class Entry:
    """One line of the index: a run of the store, or a plain profile file."""

    id: str
    kind: str  # "run" or "file"
    time: float  # the run's start, or the file's modification time
    size: int | None  # profile bytes; None when the run left no profile
    meta: dict[str, Any] | None = None  # meta.json as written, for runs
    problem: str | None = None  # why meta.json could not be read

    @property
    def label(self) -> str:
        """A short human name: the run's folder, or the file's path."""
        return self.id.rsplit("/", 1)[0] if self.kind == "run" else self.id

    def peak(self) -> tuple[str, int] | None:
        """(sample type, bytes) of the run's highest total, from meta.json."""
        totals = (self.meta or {}).get("totals")
        if not isinstance(totals, dict):
            return None
        for name in PEAK_TYPES:
            value = totals.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_BYTES:
                return name, value
        return None

    def to_json(self) -> dict[str, Any]:
        """The entry for ``/api/runs``: exact numbers, meta.json unchanged."""
        peak = self.peak()
        return {
            "id": self.id,
            "kind": self.kind,
            "label": self.label,
            "time": self.time,
            "size": self.size,
            "peak_type": peak[0] if peak else None,
            "peak_bytes": peak[1] if peak else None,
            "meta": self.meta,
            "problem": self.problem,
        }


def check_root(path: str | os.PathLike[str]) -> Path:
    """The served folder, resolved once; a missing one is the user's error, said in one line."""
    p = Path(path).expanduser()
    if not p.exists():
        raise GpuflameError(f"{p}: no such folder")
    if not p.is_dir():
        raise GpuflameError(f"{p}: not a folder (give a folder of profiles, or the run store)")
    if not os.access(p, os.R_OK | os.X_OK):
        raise GpuflameError(f"{p}: permission denied")
    return p.resolve()


def is_profile_name(name: str) -> bool:
    return name.lower().endswith(PROFILE_SUFFIXES)


def resolve_id(root: Path, ident: str) -> Path:
    """The file an id names, or :class:`BadId` / :class:`NotServed`; *root* is resolved."""
    if not ident or "\x00" in ident or "\\" in ident:
        raise BadId("malformed profile id")
    if ident.startswith("/") or any(part in ("", ".", "..") for part in ident.split("/")):
        raise BadId("a profile id is a path inside the served folder, without '..'")
    if not is_profile_name(ident):
        raise NotServed(f"{ident}: not a profile file")
    try:
        path = (root / ident).resolve(strict=True)
    except (OSError, RuntimeError):  # missing, unreadable, or a symlink loop
        raise NotServed(f"{ident}: no such profile") from None
    if not path.is_relative_to(root) or not path.is_file():
        raise NotServed(f"{ident}: no such profile")
    return path


def scan(root: Path) -> list[Entry]:
    """Every run and profile file under *root* (resolved), newest first."""
    entries: list[Entry] = []
    for folder, dirs, files in os.walk(root, followlinks=False):
        here = Path(folder)
        rel = here.relative_to(root)
        if META_NAME in files:
            entries.append(_run_entry(root, here))
            dirs[:] = []
            continue
        dirs[:] = sorted(d for d in dirs if _descend(d, len(rel.parts)) and _addressable(d))
        for name in sorted(files):
            if is_profile_name(name) and not name.startswith(".") and _addressable(name):
                entry = _file_entry(root, (rel / name).as_posix())
                if entry is not None:
                    entries.append(entry)
        if len(entries) >= MAX_ENTRIES:
            break
    entries.sort(key=lambda e: e.time, reverse=True)
    return entries[:MAX_ENTRIES]


def entry_for(root: Path, ident: str) -> Entry:
    """The entry of one id (a run's profile or a plain file), as :func:`scan` would list it."""
    resolve_id(root, ident)
    folder, _, name = ident.rpartition("/")
    if name == PROFILE_NAME and _inside(root, root / folder / META_NAME):
        return _run_entry(root, root / folder)
    entry = _file_entry(root, ident)
    if entry is None:
        raise NotServed(f"{ident}: no such profile")
    return entry


def _addressable(name: str) -> bool:
    """Whether a URL can name *name*: one that is not UTF-8 (read as lone surrogates) cannot, and made
    the whole index page fail to encode (500)."""
    return encodable(name) == name


def _descend(name: str, depth: int) -> bool:
    """Skip hidden folders, per-process folders (their merge is listed) and deep trees."""
    return not name.startswith(".") and not name.endswith(".processes") and depth + 1 < MAX_DEPTH


def _run_entry(root: Path, folder: Path) -> Entry:
    rel = folder.relative_to(root).as_posix()
    ident = PROFILE_NAME if rel == "." else f"{rel}/{PROFILE_NAME}"
    meta_path = _inside(root, folder / META_NAME)
    meta, problem = _read_meta(meta_path) if meta_path else (None, "meta.json is not a regular file inside the folder")
    when = _start_time(meta.get("started")) if meta else None
    if meta and when is None:
        problem = "meta.json: 'started' is not a time (listed by the folder's time)"
    if when is None:
        when = _mtime(folder)
    try:
        size: int | None = resolve_id(root, ident).stat().st_size
    except (BadId, NotServed, OSError):
        size = None
    return Entry(ident, "run", when, size, meta, problem)


def _file_entry(root: Path, ident: str) -> Entry | None:
    """A plain profile file, or None when it is not a servable file (a symlink out, a folder)."""
    try:
        info = resolve_id(root, ident).stat()
    except (BadId, NotServed, OSError):
        return None
    if not stat.S_ISREG(info.st_mode):
        return None
    return Entry(ident, "file", info.st_mtime, info.st_size)


def _inside(root: Path, path: Path) -> Path | None:
    """*path* resolved, when it is a file inside *root*: a symlinked meta.json must not leak a file."""
    try:
        real = path.resolve(strict=True)
    except (OSError, RuntimeError):
        return None
    return real if real.is_relative_to(root) and real.is_file() else None


def _read_meta(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """meta.json as a dict, or why not (a run still going has none yet; a broken one says so).

    Read as a file of this run may be written by anyone who could write the
    folder: a regular file only, at most :data:`MAX_META_BYTES`, and JSON
    without ``NaN`` or ``Infinity`` (no number a page cannot print).
    """
    try:
        with open_regular(path) as f:
            text = f.read(MAX_META_BYTES + 1)
    except (GpuflameError, OSError) as exc:
        return None, f"meta.json unreadable ({type(exc).__name__})"
    if len(text) > MAX_META_BYTES:
        return None, f"meta.json is larger than {MAX_META_BYTES:,} bytes; not read"
    try:
        data = json.loads(text.decode("utf-8"), parse_constant=_no_constant, parse_float=_finite)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        return None, f"meta.json unreadable ({type(exc).__name__})"
    if not isinstance(data, dict):
        return None, "meta.json is not an object"
    return data, None


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number JSON has")


def _finite(text: str) -> float:
    """A JSON number as a float; ``1e999`` (infinity once parsed) is refused like ``Infinity``."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:20]} is too large for a number")
    return value


def _start_time(value: object) -> float | None:
    """A run's start as seconds since the epoch, or None for anything a page cannot print (1e300, a word)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not 0 <= value <= LATEST_TIME:  # compared before float(): 10**400 would overflow it
        return None
    when = float(value)
    return when if math.isfinite(when) else None


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
