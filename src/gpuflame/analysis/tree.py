"""The flame tree of one sample type: every node with its self and total.

Roots are the outermost callers (the bottom of a flame graph, as the AKS guide
draws it); a node's children are the functions it called. **Total** is the
node and everything above it, **self** what the node allocated itself.

Why it is built the way it is: a large profile has hundreds of thousands of
stacks forty frames deep, and a node per (stack prefix) is millions of
nodes, far too many to create one Python object each within a report's time
budget. So the stacks become one integer matrix (a row per sample, frames
root first), the rows are sorted lexicographically (one C sort of the rows
as byte strings), and a node is then a run of consecutive rows that share a
prefix: node totals are differences of a running sum of the row values.
Nodes are computed one depth at a time, only when asked for, so ``report``
pays for the few levels near the roots it looks at, and ``export --format
json`` for all of them.

Frames are numbered by name (then file, line, kind), so sorting rows sorts
children by name, as flamegraph.pl does, whatever order the profile's frame
table has. Code ``0`` pads short rows and sorts first, so a stack that is a
prefix of another comes right before it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from gpuflame import limits
from gpuflame.analysis.stacks import SampleStacks, nonzero_stacks
from gpuflame.errors import GpuflameError
from gpuflame.model.functions import function_frames
from gpuflame.model.profile import PYTHON, SYNTHETIC, Frame, Labels, Profile, SampleType
from gpuflame.symbols.def_lines import def_line
from gpuflame.symbols.names import UNKNOWN

# Rows are converted from Python tuples this many at a time, so the
# temporary arrays stay small: on a machine where first-touching memory is
# slow, a few megabytes reused beat one large temporary.
CHUNK_ROWS = 8192
# ... and never more than this many cells at once (rows x the deepest stack): one stack 16,384
# frames deep made 8,192 rows of it a gigabyte of temporaries
CHUNK_CELLS = CHUNK_ROWS * 256
# ... and a matrix up to this size is sorted by gathering its rows whole into a second one
PERMUTE_BYTES = 64 << 20


def chunk_rows(width: int) -> int:
    """Rows per chunk of a matrix *width* cells wide: :data:`CHUNK_ROWS`, fewer when rows are wide."""
    return max(1, min(CHUNK_ROWS, CHUNK_CELLS // max(1, width)))


# Float64 sums of integers are exact while every partial sum stays below
# 2**53; the magnitude is itself a float sum, so keep a factor of two spare.
EXACT_FLOAT_LIMIT = 2**52
# Sums are int64, as pprof values are: a profile whose values add up past
# this (4 EiB, half of int64 as a margin for the float estimate) is refused
# rather than summed wrongly.
SUM_LIMIT = 2**62

NO_STACK = Frame(UNKNOWN, kind=SYNTHETIC)


def group_frame(key: str, value: str | None) -> Frame:
    """The synthetic root that holds one label value's samples (``device=cuda:0``)."""
    return Frame(f"{key}={value if value is not None else '(none)'}", kind=SYNTHETIC)


def frame_sort_key(frame: Frame) -> tuple[str, str, int, str, int]:
    return (frame.name, frame.file, frame.line, frame.kind, frame.start_line)


def frame_dict(frame: Frame) -> dict[str, object]:
    """A frame as JSON members: the same keys in every gpuflame JSON output.

    ``line`` is the bar's line (a function bar's ``def``; with ``--lines`` the
    line itself), ``def_line`` where the function is defined (0: unknown).
    """
    return {
        "name": frame.name,
        "file": frame.file,
        "line": frame.line,
        "def_line": def_line(frame.file, frame.start_line) if frame.kind == PYTHON else frame.start_line,
        "kind": frame.kind,
    }


def weighted_sum(index: np.ndarray, weights: np.ndarray, size: int, exact_float: bool) -> np.ndarray:
    """``out[i] = sum(weights[index == i])`` as exact int64.

    ``np.bincount`` is fast but sums in float64; it is used when the caller
    knows every sum is exact (:data:`EXACT_FLOAT_LIMIT`, four petabytes),
    else ``np.add.at``.
    """
    if exact_float:
        sums = np.bincount(index, weights=weights, minlength=size)
        return np.rint(sums).astype(np.int64)
    out = np.zeros(size, dtype=np.int64)
    np.add.at(out, index, weights.astype(np.int64, copy=False))
    return out


@dataclass(eq=False)
class StackTable:
    """The samples of one sample type as a sorted matrix of frame codes, root first.

    ``codes[r, d]`` is ``1 + index into frames`` of the frame at depth ``d``
    of row ``r`` (``0`` past the row's end), stored big-endian so that the
    rows sort as byte strings. Samples whose value is zero are left out.
    """

    sample_type: SampleType
    frames: list[Frame]
    codes: np.ndarray
    lengths: np.ndarray
    values: np.ndarray
    # where each row came from, for what the bars merge (the line of each frame)
    samples: SampleStacks = field(default_factory=lambda: SampleStacks(np.zeros(0, dtype=np.int64)), repr=False)
    sample_of_row: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.intp), repr=False)
    source_frames: list[Frame] = field(default_factory=list, repr=False)
    offset: int = 0  # columns before a sample's root frame (1 with group_by)

    @property
    def rows(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def total(self) -> int:
        return int(self.values.sum())

    @property
    def magnitude(self) -> float:
        """Sum of the absolute values: a bound on every sum taken over rows."""
        return float(np.abs(self.values.astype(np.float64)).sum())

    @property
    def exact_float(self) -> bool:
        """Whether float64 sums of these values are exact (see :func:`weighted_sum`)."""
        return self.magnitude < EXACT_FLOAT_LIMIT

    def row_lines(self, start: int, end: int, depth: int) -> list[dict[int, int]]:
        """For rows ``start:end`` and each depth up to *depth*: {source line: summed value}.

        A function bar merges its lines; this is what it merged, the line
        each frame was running (a call's line, or an allocation's), read from
        the samples the rows came from.
        """
        out: list[dict[int, int]] = [{} for _ in range(depth + 1)]
        lines_of = np.array([f.line for f in self.source_frames] or [0], dtype=np.int64)
        step = chunk_rows(self.codes.shape[1] if self.codes.ndim == 2 else 0)
        for lo in range(start, end, step):
            hi = min(end, lo + step)
            lens, flat = self.samples.of(self.sample_of_row[lo:hi])
            row = np.repeat(np.arange(len(lens)), lens)
            firsts = np.repeat(np.cumsum(lens) - lens, lens)
            col = self.offset + np.repeat(lens, lens) - 1 - (np.arange(len(flat)) - firsts)  # root first
            keep = col <= depth
            col, lines = col[keep], lines_of[flat[keep]]
            values = self.values[lo:hi][row[keep]]
            keys, inverse = np.unique(np.stack([col, lines]), axis=1, return_inverse=True)
            sums = weighted_sum(inverse.ravel(), values, keys.shape[1], self.exact_float)
            for (d, line), value in zip(keys.T.tolist(), sums.tolist(), strict=True):
                out[d][line] = out[d].get(line, 0) + value
        return out

    def self_line(self, start: int, end: int, depth: int) -> int:
        """The source line that allocated the most among rows ``start:end`` ending at *depth* (0: none).

        A function bar's own line is its ``def``; a failure message or a
        leak names the line that allocated, as ``--lines`` would.
        """
        ends = start + np.flatnonzero(self.lengths[start:end] == depth + 1)
        lens, flat = self.samples.of(self.sample_of_row[ends])
        leaves = np.cumsum(lens) - lens
        sums: dict[int, int] = {}
        for n, leaf, value in zip(lens.tolist(), leaves.tolist(), self.values[ends].tolist(), strict=True):
            line = self.source_frames[int(flat[leaf])].line if n else 0
            sums[line] = sums.get(line, 0) + value
        return min(sums, key=lambda ln: (-sums[ln], ln)) if sums else 0

    def leaf_codes(self) -> np.ndarray:
        """The code of each row's leaf frame (the frame that allocated)."""
        if not self.rows:
            return np.zeros(0, dtype=np.intp)
        return self.codes[np.arange(self.rows), self.lengths - 1].astype(np.intp)


def build_table(profile: Profile, type_index: int, group_by: str | None = None, lines: bool = False) -> StackTable:
    """The :class:`StackTable` of one sample type, rows sorted.

    With *group_by* (a label key such as ``pid`` or ``device``), each
    sample's stack gets a synthetic root ``key=value`` below its outermost
    frame, so the tree has one subtree per label value.

    A bar is a function: frames that differ only in their line (a function
    allocating at two lines, or calling on from two lines) are one bar, as
    in Grafana and pprof's default. With *lines*, each source line is its
    own bar.
    """
    samples = nonzero_stacks(profile, type_index)
    values = samples.values
    lengths = samples.lengths()
    has_empty = bool(len(lengths)) and int(lengths.min()) == 0
    label_ids, label_sets = samples.label_ids() if group_by else (np.zeros(0, dtype=np.intp), [])
    frames, code_of_id, group_codes, unknown = _frame_codes(profile, label_sets, group_by, has_empty, lines)
    offset = 1 if group_by else 0
    lengths = np.maximum(lengths, 1) + offset  # an empty stack becomes <unknown>
    width = int(lengths.max()) if len(samples) else 0
    check_cells(len(samples), width)
    dtype = np.dtype(">u2") if len(frames) < 2**16 else np.dtype(">u4")
    codes = np.zeros((len(samples), width), dtype=dtype)
    step = chunk_rows(width)
    for start in range(0, len(samples), step):
        stop = min(start + step, len(samples))
        _fill_rows(codes[start:stop], *samples.band(start, stop), code_of_id, offset, unknown)
        if group_by:
            codes[start:stop, 0] = group_codes[label_ids[start:stop]]
    order = row_order(codes)
    permute_rows(codes, order)
    table = StackTable(
        sample_type=profile.sample_types[type_index],
        frames=frames,
        codes=codes,
        lengths=lengths[order],
        values=values[order],
        samples=samples,
        sample_of_row=order,
        source_frames=profile.frames,
        offset=offset,
    )
    if table.magnitude >= SUM_LIMIT:
        raise GpuflameError(
            f"the {table.sample_type.type} values of this profile add up past 2**62; "
            "gpuflame sums in 64-bit integers, as pprof stores them"
        )
    return table


def check_cells(rows: int, width: int) -> None:
    """Refuse a table of more cells than :data:`gpuflame.limits.TABLE_CELLS`, before it is made.

    The matrix holds every row padded to the deepest stack: 50,000 short
    stacks and one 16,380 frames deep are 819 million cells, gigabytes from
    a file of one megabyte.
    """
    bound = limits.TABLE_CELLS.value()
    if rows * width > bound:
        raise limits.TABLE_CELLS.exceeded(
            f"the flame graph's table ({rows:,} stacks x {width:,} frames, the deepest stack's length)"
        )


def permute_rows(codes: np.ndarray, order: np.ndarray) -> None:
    """``codes[:] = codes[order]``: whole rows at once up to :data:`PERMUTE_BYTES`, else a band of columns at a time.

    Rows gathered whole cost one random read per row (0.04 s for 2M rows
    of 10 frames, against 0.22 s a column at a time), but a second matrix;
    past the bound the bands keep one copy, not two.
    """
    if codes.size == 0:
        return
    if codes.nbytes <= PERMUTE_BYTES and codes.flags.c_contiguous:
        rows = codes.view(np.dtype((np.void, codes.shape[1] * codes.itemsize))).ravel()
        codes[:] = rows[order].view(codes.dtype).reshape(codes.shape)
        return
    band = max(1, CHUNK_CELLS // max(1, codes.shape[0]))
    for lo in range(0, codes.shape[1], band):
        codes[:, lo : lo + band] = codes[order, lo : lo + band]


def _frame_codes(
    profile: Profile, label_sets: list[Labels], group_by: str | None, has_empty: bool, lines: bool = False
) -> tuple[list[Frame], np.ndarray, np.ndarray, int]:
    """Frames sorted by name, each profile frame id's code, each label set's group root code, <unknown>'s code.

    A frame listed twice in the profile's table gets one code, so a function
    is one function even in a hand-built profile.
    """
    shown = profile.frames if lines else function_frames(profile.frames)
    distinct = set(shown)
    groups: dict[str | None, Frame] = {}
    group_of_set = [_label(labels, group_by) for labels in label_sets] if group_by else []
    if group_by:
        groups = {v: group_frame(group_by, v) for v in set(group_of_set)}
    distinct.update(groups.values())
    if has_empty:
        distinct.add(NO_STACK)
    frames = sorted(distinct, key=frame_sort_key)
    position = {f: i + 1 for i, f in enumerate(frames)}
    code_of_id = np.array([position[f] for f in shown] or [0], dtype=np.intp)
    group_codes = np.array([position[groups[v]] for v in group_of_set], dtype=np.intp)
    return frames, code_of_id, group_codes, position[NO_STACK] if has_empty else 0


def _label(labels: Labels, key: str) -> str | None:
    """The value of *key* in *labels* (the first, as ``Sample.label``), None without one."""
    return next((v for k, v in labels if k == key), None)


def _fill_rows(
    block: np.ndarray, lens: np.ndarray, flat: np.ndarray, code_of_id: np.ndarray, offset: int, unknown: int
) -> None:
    """Write stacks (*lens* frames each, *flat* their ids, leaf first) into *block* root first, from column *offset*."""
    codes = code_of_id[flat]
    if len(lens) and lens.min() == lens.max():
        n = int(lens[0])
        if n:
            block[:, offset : offset + n] = codes.reshape(len(lens), n)[:, ::-1]
    else:
        row = np.repeat(np.arange(len(lens)), lens)
        ends = np.repeat(np.cumsum(lens), lens)  # one past each row's last flat position
        col = offset + ends - 1 - np.arange(len(flat))
        block[row, col] = codes
    if unknown:
        block[lens == 0, offset] = unknown


def row_order(codes: np.ndarray) -> np.ndarray:
    """Lexicographic order of the rows: big-endian codes compare as bytes do."""
    if codes.size == 0:
        return np.arange(codes.shape[0])
    rows = np.ascontiguousarray(codes).view(np.dtype((np.void, codes.shape[1] * codes.itemsize)))
    return np.argsort(rows.ravel(), kind="stable")


class Level(NamedTuple):
    """The nodes at one depth, in name order: each is the rows ``start:end`` of the table."""

    codes: np.ndarray
    start: np.ndarray
    end: np.ndarray
    total: np.ndarray


class Node(NamedTuple):
    """A handle on one node: its depth and its position in that depth's level."""

    depth: int
    index: int  # type: ignore[assignment]  # a field named as tuple.index, which it hides on purpose


@dataclass(eq=False)
class FlameTree:
    """The flame tree of a :class:`StackTable`, computed a depth at a time on demand."""

    table: StackTable
    _levels: list[Level] = field(default_factory=list, repr=False)
    _selfs: dict[int, np.ndarray] = field(default_factory=dict, repr=False)
    _shared: np.ndarray | None = field(default=None, repr=False)
    _cumulative: np.ndarray | None = field(default=None, repr=False)

    # -- whole levels (vectorised) -----------------------------------------

    @property
    def frames(self) -> list[Frame]:
        return self.table.frames

    @property
    def total(self) -> int:
        return self.table.total

    @property
    def depth(self) -> int:
        """Number of levels: the deepest stack's length."""
        return int(self.table.lengths.max()) if self.table.rows else 0

    def level(self, depth: int) -> Level:
        """All nodes at *depth* (0 = roots)."""
        while len(self._levels) <= depth:
            self._levels.append(self._compute_level(len(self._levels)))
        return self._levels[depth]

    def level_self(self, depth: int) -> np.ndarray:
        """Self of every node at *depth*: the bytes of its rows that end there.

        Those rows come first in the node's run (a shorter stack sorts before
        its extensions), so self is the run up to its first longer row.
        """
        cached = self._selfs.get(depth)
        if cached is None:
            lv = self.level(depth)
            longer = np.flatnonzero(self.table.lengths > depth + 1)
            first_longer = np.append(longer, self.table.rows)[np.searchsorted(longer, lv.start)]
            stop = np.minimum(first_longer, lv.end)
            cs = self._cumsum()
            cached = self._selfs[depth] = cs[stop] - cs[lv.start]
        return cached

    def children_range(self, depth: int) -> tuple[np.ndarray, np.ndarray]:
        """For each node at *depth*, the slice of level ``depth + 1`` holding its children."""
        lv, up = self.level(depth), self.level(depth + 1)
        return np.searchsorted(up.start, lv.start), np.searchsorted(up.start, lv.end)

    def node_count(self) -> int:
        return sum(len(self.level(d).start) for d in range(self.depth))

    # -- single nodes ------------------------------------------------------

    def roots(self) -> list[Node]:
        return [Node(0, i) for i in range(len(self.level(0).start))] if self.depth else []

    def children(self, node: Node) -> list[Node]:
        """The functions *node* called, in name order."""
        if node.depth + 1 >= self.depth:
            return []
        lv, up = self.level(node.depth), self.level(node.depth + 1)
        lo = int(np.searchsorted(up.start, lv.start[node.index]))
        hi = int(np.searchsorted(up.start, lv.end[node.index]))
        return [Node(node.depth + 1, i) for i in range(lo, hi)]

    def parent(self, node: Node) -> Node | None:
        if node.depth == 0:
            return None
        row = self.level(node.depth).start[node.index]
        below = self.level(node.depth - 1).start
        return Node(node.depth - 1, int(np.searchsorted(below, row, side="right")) - 1)

    def path(self, node: Node) -> list[Node]:
        """*node* and its callers, root first: the stack read bottom-up."""
        out = [node]
        while (up := self.parent(out[-1])) is not None:
            out.append(up)
        return out[::-1]

    def node_at_row(self, depth: int, row: int) -> Node:
        """The node at *depth* on the stack of table row *row*."""
        return Node(depth, int(np.searchsorted(self.level(depth).start, row, side="right")) - 1)

    def frame(self, node: Node) -> Frame:
        return self.frames[int(self.level(node.depth).codes[node.index]) - 1]

    def node_total(self, node: Node) -> int:
        return int(self.level(node.depth).total[node.index])

    def node_self(self, node: Node) -> int:
        return int(self.level_self(node.depth)[node.index])

    def walk(self) -> Iterator[Node]:
        """Every node, depth first, callers before callees (for tests and small trees)."""
        pending = self.roots()[::-1]
        while pending:
            node = pending.pop()
            yield node
            pending.extend(self.children(node)[::-1])

    # -- internals ---------------------------------------------------------

    def _cumsum(self) -> np.ndarray:
        """Running sum of the row values, with a leading 0: a run's total is a difference."""
        if self._cumulative is None:
            cs = np.zeros(self.table.rows + 1, dtype=np.int64)
            np.cumsum(self.table.values, out=cs[1:])
            self._cumulative = cs
        return self._cumulative

    def _shared_prefix(self) -> np.ndarray:
        """How many leading frames each row shares with the row before it."""
        if self._shared is None:
            codes, lengths, rows = self.table.codes, self.table.lengths, self.table.rows
            shared = np.zeros(rows, dtype=np.intp)
            step = chunk_rows(codes.shape[1])
            for lo in range(1, rows, step):  # row r against row r - 1, a band of rows at a time
                hi = min(rows, lo + step)
                same = codes[lo:hi] == codes[lo - 1 : hi - 1]
                shared[lo:hi] = np.where(same.all(axis=1), lengths[lo:hi], same.argmin(axis=1))
            self._shared = shared
        return self._shared

    def _compute_level(self, depth: int) -> Level:
        """A node starts wherever a row's shared prefix is no longer than *depth*."""
        lengths = self.table.lengths
        boundary = np.flatnonzero(self._shared_prefix() <= depth)
        ends = np.append(boundary[1:], self.table.rows)
        reaches = lengths[boundary] > depth
        start, end = boundary[reaches], ends[reaches]
        codes = self.table.codes[start, depth].astype(np.intp) if len(start) else np.zeros(0, np.intp)
        cs = self._cumsum()
        return Level(codes=codes, start=start, end=end, total=cs[end] - cs[start])


def build_tree(profile: Profile, type_index: int, group_by: str | None = None, lines: bool = False) -> FlameTree:
    """The flame tree of *profile* for the sample type at *type_index* (see :func:`build_table`)."""
    return FlameTree(build_table(profile, type_index, group_by, lines))
