"""The fields of one protobuf message that follow each other with one key, found in bulk with numpy.

A large pprof's top-level message is five million fields in a few runs: a
million Samples, then a million Locations, Functions, strings. Reading
them one after another costs a microsecond of Python each (2.2 s for a
million frames); here each run is found by array operations over a few
hundred KB at a time, and the caller (:mod:`gpuflame.formats.pprof_read`)
reads field by field only what is not such a run, and every error.

Launcher side only (numpy).
"""

from __future__ import annotations

import numpy as np


def field_run(data: np.ndarray, pos: int, window: int, key: int) -> tuple[np.ndarray, np.ndarray, int]:
    """The fields of one-byte *key* and a one- or two-byte length that follow each other from *pos*.

    The bulk of a large pprof's top-level message: a million Samples, then a
    million Locations, one after another. Returns their values' (starts,
    stops) and where the run ends: at the first field that is not such a
    field or would run past the data (the caller reads that one and says
    what is wrong), or after the last field that starts before *window*.

    Read a piece at a time: :data:`RUN_FIRST` bytes, then twice as many
    each time, up to :data:`RUN_CHUNK` (each step's arrays stay in the
    processor's caches). Each piece is scanned whole, so a run that ends
    early costs no more than twice its length and the first piece.
    """
    starts, stops = [], []
    size = min(RUN_FIRST, RUN_CHUNK)
    while pos < window:
        piece = min(window, pos + size)
        begin, stop, pos = _run_piece(data, pos, piece, key)
        starts.append(begin)
        stops.append(stop)
        if pos < piece:  # the run ended inside this piece
            break
        size = min(2 * size, RUN_CHUNK)
    if not starts:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), pos
    return np.concatenate(starts), np.concatenate(stops), pos


# Bytes of fields in the first step of :func:`field_run`, and in the largest.
RUN_FIRST = 1 << 14
RUN_CHUNK = 1 << 18


def _run_piece(data: np.ndarray, pos: int, piece: int, key: int) -> tuple[np.ndarray, np.ndarray, int]:
    """:func:`field_run` of the fields that start before *piece*.

    Every byte equal to *key* is a candidate field, linked to the candidate
    where it would end; the run is the chain of links from *pos*. Bytes equal
    to *key* inside values make chains of their own, which the one from
    *pos* never reaches (:func:`_reached`).
    """
    none = np.zeros(0, dtype=np.int64)
    if key >= 0x80 or data[pos] != key:
        return none, none, pos
    n = len(data)
    cand = np.flatnonzero(data[pos:piece] == key) + pos
    first = data[np.minimum(cand + 1, n - 1)].astype(np.int64)
    second = data[np.minimum(cand + 2, n - 1)].astype(np.int64)
    two = first >= 0x80
    start = cand + 2 + two
    stop = start + np.where(two, (first & 0x7F) | (second << 7), first)
    ok = (cand + 1 < n) & (~two | ((cand + 2 < n) & (second < 0x80))) & (stop <= n)
    after = np.searchsorted(cand, stop)
    linked = ok & (after < len(cand)) & (cand[np.minimum(after, len(cand) - 1)] == stop)
    chain = _reached(np.where(linked, after, len(cand)))
    last = int(chain[-1])
    if not ok[last]:  # the caller reads this one field by field
        return start[chain[:-1]], stop[chain[:-1]], int(cand[last])
    return start[chain], stop[chain], int(stop[last])


def _reached(step: np.ndarray) -> np.ndarray:
    """The nodes reached from node 0, in order, where node i links to ``step[i] > i`` (``len(step)``: to none).

    The links only go forward, so the nodes that remain once every other
    node nothing links to is let go, again and again, are those reached
    from node 0. A node inside a value links to one nothing links to, or to
    a field: two or three rounds let them all go. A file made of chains of
    them goes on to doubling, whose rounds each cost as much.
    """
    alive = np.arange(len(step))
    for _ in range(_PRUNE_ROUNDS):
        linked_to = np.zeros(len(step) + 1, dtype=bool)
        linked_to[step[alive]] = True
        linked_to[0] = True
        keep = linked_to[alive]
        if keep.all():
            return alive
        alive = alive[keep]
    return _doubling(np.append(step, len(step)))


_PRUNE_ROUNDS = 6


def _doubling(step: np.ndarray) -> np.ndarray:
    """:func:`_reached`, with *step*'s last entry the end (stepping to itself), by pointer doubling.

    The nodes fewer than 2**k steps away, with each one's node 2**k steps
    on, give those fewer than 2**(k+1) away; done when a round adds none.
    """
    end = len(step) - 1
    reached = np.zeros(len(step), dtype=bool)
    reached[0] = True
    nodes = np.zeros(1, dtype=np.int64)
    while True:
        reached[step[nodes]] = True
        grown = np.flatnonzero(reached[:end])
        if len(grown) == len(nodes):
            return nodes
        nodes = grown
        step = step[step]
