"""Source-file indexes kept on disk between runs, so that a fresh process does not parse them again.

Naming a snapshot's Python frames parses each source file on its stacks
with :mod:`ast` (:mod:`gpuflame.symbols.qualnames`): 10-60 ms a file, most
of ``gpuflame convert``'s time on a small snapshot. The spans found are
stored here, one JSON file per source *content*: the file's name is a hash
of the source bytes, this Python's version and :data:`FORMAT`, so an edited
file, another Python (whose ``ast`` may differ) or another layout of this
module never meets a stale entry, whatever the file's modification time.

The folder is the caller's (``$GPUFLAME_CACHE_DIR/source-index``, see
:func:`gpuflame.defaults.cache_dir`). What is read back is checked as
untrusted input (someone else may write there): a file larger than
:data:`MAX_ENTRY_BYTES`, not JSON, or whose spans are out of order, out of
the source's lines or malformed is ignored and the source parsed anew; at
worst a crafted entry names frames wrongly, it cannot run code or make the
reader allocate or paint more than :data:`MAX_COVER` times the source's lines. The folder holds at most
:data:`MAX_ENTRIES` files: past that it is emptied before the next write.
Nothing here raises: a folder that cannot be read or written is a miss.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
import tempfile
from pathlib import Path
from typing import Any

from gpuflame.symbols.source_index import FileIndex, Span

FORMAT = 1  # bump when Span or the way spans are found changes
MAX_ENTRY_BYTES = 16 << 20
MAX_ENTRIES = 4096
# an entry's spans may cover this many lines per source line, together (painting them costs that):
# real nesting stays far below; a deeper file is parsed each time
MAX_COVER = 100
_SUFFIX = ".json"


def key_of(source: bytes) -> str:
    """The entry's name for *source* under this Python and this format."""
    tag = f"gpuflame-source-index {FORMAT} {sys.version_info[0]}.{sys.version_info[1]}\0".encode()
    return hashlib.blake2b(tag + source, digest_size=20).hexdigest()


def load(folder: Path, source: bytes) -> FileIndex | None:
    """The index stored for *source*, or None (absent, unreadable, or not a valid entry)."""
    path = folder / (key_of(source) + _SUFFIX)
    try:  # non-blocking, and a regular file only: a FIFO or device put there must not hang the reader
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except (OSError, ValueError):
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            raw = f.read(MAX_ENTRY_BYTES + 1)
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    if len(raw) > MAX_ENTRY_BYTES:
        return None
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    # at least the lines ast counts (it ends lines at \n, \r\n and a lone \r)
    spans = _checked(doc, max(source.count(b"\n"), source.count(b"\r")) + 1)
    return FileIndex(spans) if spans is not None else None


def _checked(doc: Any, lines: int) -> list[Span] | None:
    """The spans of an entry, if it is one this module could have written for a source of *lines* lines."""
    if type(doc) is not dict or doc.get("format") != FORMAT or type(doc.get("spans")) is not list:
        return None
    spans: list[Span] = []
    cover = 0
    for i, item in enumerate(doc["spans"]):
        if type(item) is not list or len(item) != 6:
            return None
        start, end, depth, name, qualname, parent = item
        if not (type(start) is int and type(end) is int and type(depth) is int and type(parent) is int):
            return None
        if type(name) is not str or type(qualname) is not str:
            return None
        # parents come first (no loops to follow); lines within the source (bounds the line table)
        if not (1 <= start <= end <= lines and 1 <= depth <= len(spans) + 1 and -1 <= parent < i):
            return None
        cover += end - start + 1
        if cover > MAX_COVER * lines:
            return None
        spans.append(Span(start, end, depth, name, qualname, parent))
    return spans


def save(folder: Path, source: bytes, index: FileIndex) -> None:
    """Store *index* for *source*; any failure (read-only home, full disk) is ignored."""
    doc = {"format": FORMAT, "spans": [list(s) for s in index.spans]}
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        _bound(folder)
        fd, tmp = tempfile.mkstemp(prefix=".", suffix=".tmp", dir=folder)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump(doc, out, separators=(",", ":"))
            os.replace(tmp, folder / (key_of(source) + _SUFFIX))
        except BaseException:
            _remove(tmp)
            raise
    except (OSError, ValueError):
        return


def _bound(folder: Path) -> None:
    """Empty the folder of entries once it holds :data:`MAX_ENTRIES` (a cache: all can be rebuilt)."""
    with os.scandir(folder) as entries:
        names = [e.name for e in entries if e.name.endswith(_SUFFIX)]
    if len(names) >= MAX_ENTRIES:
        for name in names:
            _remove(os.path.join(folder, name))


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
