"""The dispatch recorder's per-phase books (capture/recorders/dispatch/ledger.py), exact.

Phase changes are queued among the ledger's events as ``(None, phase id,
epoch ns)`` (a joint mark is ``(device, epoch, highest total)``), so they
are replayed in the true order of allocations and frees. From the first one
on, each allocation is booked at the site of its (stack, device, phase)
and each phase keeps its own highest total the way the ledger keeps the
peak: the allocation number of that moment, and per site the storages live
then and freed since. Before the first mark nothing here runs.

Frees do not carry a time, so a phase's ``peak_time`` is unknown here (0):
the table says when each phase started and ended.
"""

from __future__ import annotations

from typing import Any


class PhaseBook:
    """One phase: its first start, last end, highest total and its moment, in use at its end."""

    __slots__ = ("start", "end", "peak", "peak_seq", "inuse_end", "gone")

    def __init__(self, start: int) -> None:
        self.start, self.end, self.peak, self.peak_seq, self.inuse_end = start, 0, -1, 0, 0
        self.gone: dict[int, int] = {}  # site -> bytes live at the phase's peak, freed since

    def raise_to(self, total: int, seq: int) -> None:
        if total > self.peak:
            self.peak, self.peak_seq = total, seq
            if self.gone:
                self.gone.clear()


class LedgerPhases:
    """Per-phase books of one ledger, from its first phase mark (at *at*, epoch ns) on."""

    def __init__(self, ledger: Any, at: int) -> None:
        self.current = 0
        book = PhaseBook(0)  # the window so far was phase 0: its highest moment is the peak so far
        self.books = {0: book}
        book.peak, book.peak_seq = ledger.peak, ledger.peak_seq
        book.gone = {site: v[0] for site, v in ledger.peak_gone.items()}
        self.enter(0, at, ledger.total, ledger.seq)

    def enter(self, phase_id: int, at: int, total: int, seq: int) -> None:
        """The running phase ends at *at*; *phase_id* begins (its peak is at least the total now)."""
        old = self.books[self.current]
        old.end, old.inuse_end = at, total
        book = self.books.get(phase_id)
        if book is None:
            book = self.books[phase_id] = PhaseBook(at)
        book.raise_to(total, seq)
        self.current = phase_id

    def on_free(self, site: int, nbytes: int, seq: int) -> None:
        for book in self.books.values():
            if seq <= book.peak_seq:
                book.gone[site] = book.gone.get(site, 0) + nbytes

    def rows(self, live: list[Any], total: int) -> list[tuple[int, int, int, int, int, int, list[tuple[int, int]]]]:
        """As capture/books/phase_table.py reads them; *live*: the ledger's live references (copied)."""
        out = []
        for phase_id, book in self.books.items():
            at_peak = dict(book.gone)
            for ref in live:
                if 0 < ref.seq <= book.peak_seq:
                    at_peak[ref.site] = at_peak.get(ref.site, 0) + ref.nbytes
            running = phase_id == self.current
            out.append(
                (
                    phase_id,
                    book.start,
                    0 if running else book.end,
                    max(book.peak, 0),
                    0,
                    total if running else book.inuse_end,
                    list(at_peak.items()),
                )
            )
        return out
