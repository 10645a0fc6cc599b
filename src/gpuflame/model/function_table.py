"""The function bars of one or more groups of frames as columns: the viewer's frame table (numpy).

:func:`gpuflame.model.functions.function_frames` says which frames are one
function and what stands for it; this builds the same bars for a million
frames without a ``Frame`` per bar. Apart from ``functions.py`` so that
reading and converting a file imports no numpy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import compress
from operator import itemgetter, ne
from typing import NamedTuple

import numpy as np

from gpuflame.model.profile import PYTHON, Frame
from gpuflame.symbols.def_lines import decorator_lines

_START = itemgetter(4)
_NAME, _FILE, _KIND = itemgetter(0), itemgetter(1), itemgetter(3)


class FunctionTable(NamedTuple):
    """Distinct function bars as columns, in the tuple order of their :func:`function_frames` frames.

    Row ``i`` is the bar ``Frame(names[i], files[file[i]], line[i], kinds[kind[i]], line[i])``;
    ``row[j]`` is the row of input frame ``j``. ``files`` and ``kinds`` are sorted.
    """

    names: list[str]
    files: list[str]
    file: np.ndarray
    line: np.ndarray
    kinds: list[str]
    kind: np.ndarray
    row: np.ndarray


def function_table(groups: Sequence[Sequence[Frame]]) -> FunctionTable:
    """:func:`function_frames` of each group of frames, their distinct bars sorted, without a Frame per bar.

    The same bars as ``sorted(set(function_frames(g) for g in groups))``
    (a function's definition line is settled within its group), with
    numpy doing per frame what a dict and a tuple sort did: a million-frame
    page's table in about 4 s instead of 8-9 s (BENCHMARKS.md).
    """
    frames = [f for group in groups for f in group]
    if not frames:
        none = np.zeros(0, dtype=np.int64)
        return FunctionTable([], [], none, none, [], none, none)
    group = np.repeat(np.arange(len(groups)), [len(g) for g in groups])
    names, name_id = _sorted_intern(list(map(_NAME, frames)))  # names: mostly distinct, so sorted anyway
    files, file_id = _intern(list(map(_FILE, frames)))
    kinds, kind_id = _intern(list(map(_KIND, frames)))
    keys, per_frame = _distinct_columns(np.stack([group, name_id, file_id, kind_id]))
    start = np.full(keys.shape[1], np.iinfo(np.int64).min)
    np.maximum.at(start, per_frame, np.fromiter(map(_START, frames), np.int64, len(frames)))
    fn_name, fn_file, fn_kind = keys[1], keys[2], keys[3]
    line = _def_lines(start, fn_file, fn_kind == kinds.index(PYTHON) if PYTHON in kinds else None, files)
    file_rank, kind_rank = _ranks(files), _ranks(kinds)  # names are numbered in sorted order already
    order = np.lexsort((kind_rank[fn_kind], line, file_rank[fn_file], fn_name))
    bar = np.stack([fn_name, fn_file, line, fn_kind])[:, order]
    new = np.ones(len(order), dtype=bool)
    new[1:] = (bar[:, 1:] != bar[:, :-1]).any(axis=0)  # equal bars (two groups' same function) are one row
    row_of_fn = np.empty(len(order), dtype=np.int64)
    row_of_fn[order] = np.cumsum(new) - 1
    rows = bar[:, new]
    by_rank = np.argsort(file_rank), np.argsort(kind_rank)
    return FunctionTable(
        names=list(map(names.__getitem__, rows[0].tolist())),
        files=list(map(files.__getitem__, by_rank[0].tolist())),
        file=file_rank[rows[1]],
        line=rows[2],
        kinds=list(map(kinds.__getitem__, by_rank[1].tolist())),
        kind=kind_rank[rows[3]],
        row=row_of_fn[per_frame],
    )


def _distinct_columns(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct columns of *rows* (non-negative ints), sorted, and each column's index among them.

    As one int64 key per column where the ranges allow (a tenth of the
    time of ``np.unique(axis=1)``), else column by column.
    """
    spans = [int(r.max()) + 1 for r in rows]
    if math.prod(spans) >= 2**63:
        found, inverse = np.unique(rows, axis=1, return_inverse=True)
        return found, inverse.reshape(-1)  # numpy 2.0-2.1 gave the inverse the input's shape
    key = np.zeros(rows.shape[1], dtype=np.int64)
    for r, span in zip(rows, spans, strict=True):
        key = key * span + r
    keys, inverse = np.unique(key, return_inverse=True)
    found = np.empty((len(rows), len(keys)), dtype=np.int64)
    for i in reversed(range(len(rows))):
        keys, found[i] = np.divmod(keys, spans[i])
    return found, inverse


def _intern(values: list[str]) -> tuple[list[str], np.ndarray]:
    """The distinct *values* and each value's index among them.

    One dict pass where every value is distinct (a million-frame page's
    names), two where some repeat: each value's last position, numbered.
    """
    last = dict(zip(values, range(len(values)), strict=True))
    if len(last) == len(values):
        return values, np.arange(len(values))
    uniq, index = np.unique(np.fromiter(map(last.__getitem__, values), np.int64, len(values)), return_inverse=True)
    return list(map(values.__getitem__, uniq.tolist())), index.reshape(-1)


def _sorted_intern(values: list[str]) -> tuple[list[str], np.ndarray]:
    """:func:`_intern` with the distinct values sorted: one sort of every value, no dict.

    Cheaper than interning then sorting where most values are distinct (a
    million function names), dearer where most repeat (files, kinds).
    """
    order = sorted(range(len(values)), key=values.__getitem__)
    ordered = list(map(values.__getitem__, order))
    new = np.ones(len(values), dtype=bool)
    new[1:] = np.fromiter(map(ne, ordered[1:], ordered[:-1]), bool, max(len(values) - 1, 0))
    ids = np.empty(len(values), dtype=np.int64)
    ids[order] = np.cumsum(new) - 1
    return list(compress(ordered, new.tolist())), ids


def _ranks(values: list[str]) -> np.ndarray:
    """Each value's position once *values* (distinct) are sorted as strings."""
    rank = np.empty(len(values), dtype=np.int64)
    rank[sorted(range(len(values)), key=values.__getitem__)] = np.arange(len(values))
    return rank


def _def_lines(start: np.ndarray, file: np.ndarray, python: np.ndarray | None, files: list[str]) -> np.ndarray:
    """Each function's ``def`` line (:func:`def_line`) for Python functions; *start* as it is for the rest."""
    line = start.copy()
    if python is None:
        return line
    asked = np.flatnonzero(python & (start > 0))
    asked = asked[np.argsort(file[asked], kind="stable")]
    cuts = np.flatnonzero(np.diff(file[asked])) + 1
    for at in np.split(asked, cuts) if len(asked) else ():
        moved = decorator_lines(files[int(file[at[0]])])
        if moved:
            line[at] = [moved.get(s, s) for s in start[at].tolist()]
    return line
