"""Distinct stacks as one tree of (parent, code) nodes: the stack table the viewer's page ships.

A million stacks forty deep become a million nodes, built by sorting the
stacks as rows (as :mod:`gpuflame.analysis.tree` sorts them for the flame
tree) and starting a node wherever a row's shared prefix with the row
before it ends.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from gpuflame.analysis.tree import check_cells, row_order

# Sorted stacks compared with their neighbours this many at a time (:func:`_shared_prefixes`) ...
PREFIX_ROWS = 1 << 16
# ... and never more cells than this: 65,536 rows padded to a stack 16,384 deep were 4 GB of one piece
PREFIX_CELLS = 1 << 23


def piece_rows(width: int) -> int:
    """Rows per piece of a matrix *width* cells wide."""
    return max(1, min(PREFIX_ROWS, PREFIX_CELLS // max(1, width)))


class PrefixTree(NamedTuple):
    """Distinct stacks as one tree of (parent, code) nodes: what the viewer's page ships.

    Node 0 is the root (no frame); nodes are numbered depth by depth, so a
    parent comes before its children, and children in code order.
    ``node_of_stack[i]`` is the node where stack *i* ends (0: an empty stack).
    """

    parent: np.ndarray
    code: np.ndarray
    node_of_stack: np.ndarray


def prefix_tree(
    lengths: np.ndarray, flat: np.ndarray, leaf_first: bool = False, code_of: np.ndarray | None = None
) -> PrefixTree:
    """The :class:`PrefixTree` of stacks concatenated in *flat* with their *lengths*, each root first.

    With *leaf_first*, each stack in *flat* is leaf first (pprof's order): read
    backwards, the whole column is the same stacks root first, last to first,
    so no reversed copy of it is made. With *code_of*, *flat* holds ids and
    the tree is of their codes ``code_of[id]`` (the page's function rows),
    looked up a piece at a time. Vectorised like :class:`FlameTree` (rows
    sorted as byte strings, a node wherever a row's shared prefix ends), so a
    million stacks forty deep take seconds, not the minutes of a dict lookup
    per frame.
    """
    if leaf_first:
        tree = prefix_tree(lengths[::-1], flat[::-1], code_of=code_of)
        return tree._replace(node_of_stack=tree.node_of_stack[::-1])
    n = len(lengths)
    width = int(lengths.max()) if n else 0
    if not width:
        return PrefixTree(np.array([-1]), np.array([-1]), np.zeros(n, dtype=np.int64))
    check_cells(n, width)
    codes = np.zeros((n, width), dtype=">u4")
    _fill(codes, lengths, flat, code_of)
    order = row_order(codes)
    lens = lengths[order]
    shared = _shared_prefixes(codes, order, lens)
    parents, node_codes = [np.array([-1])], [np.array([-1])]
    leaf = np.zeros(n, dtype=np.int64)
    above_start, above_first, first = np.zeros(1, dtype=np.intp), 0, 1
    for depth in range(width):
        start = np.flatnonzero((shared <= depth) & (lens > depth))
        parents.append(
            above_first + np.searchsorted(above_start, start, side="right") - 1
            if depth
            else np.zeros(len(start), dtype=np.intp)
        )
        node_codes.append(codes[order[start], depth].astype(np.int64) - 1)
        ends_here = np.flatnonzero(lens == depth + 1)
        leaf[ends_here] = first + np.searchsorted(start, ends_here, side="right") - 1
        above_start, above_first, first = start, first, first + len(start)
    node_of_stack = np.empty(n, dtype=np.int64)
    node_of_stack[order] = leaf
    return PrefixTree(np.concatenate(parents).astype(np.int64), np.concatenate(node_codes), node_of_stack)


def _fill(codes: np.ndarray, lengths: np.ndarray, flat: np.ndarray, code_of: np.ndarray | None) -> None:
    """Each row's codes, left to right, plus one (0: no frame), PREFIX_ROWS rows at a time.

    A boolean mask fills a block row by row in the order of *flat* (no index
    per frame). In pieces, the codes looked up and the mask stay a few MB:
    looked up whole, forty million codes were 160 MB beside a 60 MB mask.
    """
    width = codes.shape[1]
    ends = np.cumsum(lengths)
    step = piece_rows(width)
    for lo in range(0, len(lengths), step):
        hi = min(len(lengths), lo + step)
        piece = flat[int(ends[lo - 1]) if lo else 0 : int(ends[hi - 1])]
        filled = np.arange(width) < lengths[lo:hi, None]
        block = codes[lo:hi]
        block[filled] = piece if code_of is None else code_of[piece]
        np.add(block, filled, out=block, casting="unsafe")


def _shared_prefixes(codes: np.ndarray, order: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """How many leading codes each row in *order* shares with the row before it (0 for the first).

    PREFIX_ROWS rows at a time, gathered in order: the rows were copied
    whole into sorted order before (240 MB for a million stacks sixty deep,
    and a 60 MB comparison beside it), which set the page's peak memory.
    """
    n = len(order)
    shared = np.zeros(n, dtype=np.intp)
    step = piece_rows(codes.shape[1])
    for lo in range(1, n, step):
        hi = min(n, lo + step)
        rows = codes[order[lo - 1 : hi]]  # the row before the piece, then the piece
        same = rows[1:] == rows[:-1]
        shared[lo:hi] = np.where(same.all(axis=1), np.minimum(lens[lo:hi], lens[lo - 1 : hi - 1]), same.argmin(axis=1))
    return shared
