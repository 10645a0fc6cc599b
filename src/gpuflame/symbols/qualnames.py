"""Qualified names from (file, line, co_name), by indexing the source once.

PyTorch's allocator records only a frame's ``co_name`` (``forward``), but the
AKS guide's names need the class (``LlamaMLP > forward``), complete on the first
run. The source file says which ``def`` holds a line: each file is parsed once
with :mod:`ast` into the line spans of its functions, methods, lambdas,
comprehensions and class bodies, each with its ``__qualname__``; a lookup picks
the innermost span holding the line whose name is ``co_name``.

Nothing here raises: a file that is missing, unreadable, not UTF-8, too large
or not valid Python gives back ``co_name`` itself.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

from gpuflame.symbols import index_cache
from gpuflame.symbols.names import MODULE, display_name
from gpuflame.symbols.source_index import MAX_SOURCE_BYTES, FileIndex, index_source
from gpuflame.symbols.source_paths import SourceMap


class _Cached(NamedTuple):
    mtime_ns: int
    size: int
    index: FileIndex | None  # type: ignore[assignment]  # a field named as tuple.index, which it hides on purpose


_FILES: dict[str, _Cached] = {}


def file_index(path: str, store: Path | None = None) -> FileIndex | None:
    """The index of *path*, parsed once and kept while its mtime and size stay.

    With *store* (a folder), a file parsed in an earlier process is read back from there
    (:mod:`gpuflame.symbols.index_cache`) and one parsed now is left there for the next.
    """
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    cached = _FILES.get(path)
    if cached is not None and cached.mtime_ns == st.st_mtime_ns and cached.size == st.st_size:
        return cached.index
    index = _parse(path, st.st_size, store)
    _FILES[path] = _Cached(st.st_mtime_ns, st.st_size, index)
    return index


def _parse(path: str, size: int, store: Path | None = None) -> FileIndex | None:
    if size > MAX_SOURCE_BYTES or not os.path.isfile(path):
        return None
    try:
        with open(path, "rb") as f:
            source = f.read(MAX_SOURCE_BYTES + 1)
        if len(source) > MAX_SOURCE_BYTES:
            return None
        if store is None:
            return index_source(source)
        index = index_cache.load(store, source)
        if index is None:
            index = index_source(source)
            index_cache.save(store, source, index)
        return index
    except (OSError, SyntaxError, ValueError, UnicodeError, MemoryError, RecursionError):
        return None


class Resolver:
    """Qualnames and definition lines memoized per (file, line, co_name), for one conversion.

    A profile has hundreds of thousands of frames but few distinct (file,
    line) pairs; each file is stat'ed once per resolver and parsed once per
    process (while unchanged); with a *store* folder, once per content and
    Python version across processes (:mod:`gpuflame.symbols.index_cache`).
    """

    def __init__(self, sources: SourceMap | None = None, store: Path | None = None) -> None:
        self.store = store  # a folder keeping files' indexes between runs (index_cache.py), or None
        self._memo: dict[tuple[str, int, str], tuple[str, int]] = {}
        self._indexes: dict[str, FileIndex | None] = {}
        self.sources = sources if sources is not None else SourceMap()
        self.unqualified: set[tuple[str, int, str]] = set()  # frames whose source was not found
        self.other_version: set[str] = set()  # of those, files here in another version whose lines differ

    def qualname(self, file: str, line: int, co_name: str) -> str:
        return self.lookup(file, line, co_name)[0]

    def display(self, file: str, line: int, co_name: str) -> str:
        """The AKS guide's label: ``LlamaMLP > forward``."""
        return display_name(self.qualname(file, line, co_name))

    def def_line(self, file: str, line: int, co_name: str) -> int:
        """Where the function running at *line* is defined (``co_firstlineno``); 0 if unknown.

        Known only when the source file is here and still defines *co_name*
        around that line; ``<module>`` starts at line 1.
        """
        return self.lookup(file, line, co_name)[1]

    def lookup(self, file: str, line: int, co_name: str) -> tuple[str, int]:
        """(qualname, definition line) of *co_name* running at *file*:*line*."""
        key = (file, line, co_name)
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = self._lookup(file, line, co_name)
        return found

    def _lookup(self, file: str, line: int, co_name: str) -> tuple[str, int]:
        if co_name == MODULE:
            return co_name, 1 if file else 0
        if not file or file.startswith("<") or not isinstance(line, int) or line <= 0:
            return co_name, 0
        index = self._index(file)
        if index is None:
            return self._elsewhere(file, line, co_name)
        return _named_span(index, line, co_name)

    def _index(self, file: str) -> FileIndex | None:
        if file in self._indexes:
            return self._indexes[file]
        index = self._indexes[file] = file_index(file, self.store)
        return index

    def _elsewhere(self, file: str, line: int, co_name: str) -> tuple[str, int]:
        """The file is not here: try where :class:`SourceMap` says it may be."""
        for candidate in self.sources.candidates(file):
            index = self._index(candidate.path)
            if index is None:
                continue
            if candidate.exact:
                return _named_span(index, line, co_name)
            # another version of the package: a def of that name holding that line, else the one
            # qualname every def of that name in the file has (`_apply` is Module's wherever its lines moved)
            for span in index.containing(line):
                if span.name == co_name:
                    return span.qualname, span.start
            named = {span.qualname for span in index.named(co_name)}
            if len(named) == 1:
                return named.pop(), 0
            self.other_version.add(file)
        self.unqualified.add((file, line, co_name))
        return co_name, 0


def _named_span(index: FileIndex, line: int, co_name: str) -> tuple[str, int]:
    """(qualname, def line) of *co_name* at *line*; the def line only where the span is that function."""
    span = index.span(line, co_name)
    if span is None:
        return co_name, 0
    return span.qualname, span.start if span.name == co_name else 0


_MEMO: dict[tuple[str, int, str], tuple[FileIndex | None, str]] = {}
_MEMO_LIMIT = 200_000


def qualname(file: str, line: int, co_name: str) -> str:
    """``forward`` at ``modeling_llama.py:123`` -> ``LlamaMLP.forward``; *co_name* if unknown.

    Memoized per (file, line, co_name) for as long as the file is unchanged;
    for bulk use, a :class:`Resolver` saves even the ``stat`` per call.
    """
    if co_name == MODULE or not file or file.startswith("<"):
        return co_name
    index = file_index(file)
    key = (file, line, co_name)
    hit = _MEMO.get(key)
    if hit is not None and hit[0] is index:
        return hit[1]
    if index is None or not isinstance(line, int) or line <= 0:
        found = co_name
    else:
        found = index.qualname(line, co_name)
    if len(_MEMO) >= _MEMO_LIMIT:
        _MEMO.clear()
    _MEMO[key] = (index, found)
    return found


def display(file: str, line: int, co_name: str) -> str:
    """``forward`` at ``modeling_llama.py:123`` -> ``LlamaMLP > forward``."""
    return display_name(qualname(file, line, co_name))
