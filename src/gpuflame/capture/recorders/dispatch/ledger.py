"""The dispatch recorder's books: live storages, the peak, totals per site.

A site is one (stack, device) (see stacks.py and recorder.py); each site's
row is the per-site row of capture/books/site_row.py. The dispatch mode
(mode.py) queues every new storage here; the recorder reads the rows when it
builds a profile.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

from gpuflame.capture.books import site_row
from gpuflame.capture.books.categories import HISTORY_TAG_BITS
from gpuflame.capture.books.ledger_phases import LedgerPhases
from gpuflame.capture.books.site_row import ALLOC, COUNT, INUSE, JOINT, PEAK
from gpuflame.model.history import EventLog


class StorageRef(weakref.ref):
    """A weak reference to one storage's Python object, carrying its record.

    The same object is both events of a storage's life: it is queued once
    when the storage is made, and its callback (the ledger's ``on_free``)
    queues it again when the storage dies. ``seq`` says which: 0 = made, not
    yet counted; > 0 = live, counted as allocation number ``seq``; < 0 = gone.
    ``table`` is the run's shared peak table its bytes were published to
    (-1: none), so that its free is published there too.
    """

    __slots__ = ("cdata", "site", "nbytes", "seq", "table", "tag", "t0", "t1", "event", "key")  # tag: categories.py
    # t0, t1: when it was made and when it died (epoch ns), for the event history; event, key: its
    # allocation's number in the history's log and its site there, a key of site and tag (categories.history_key),
    # set when the allocation is logged (LedgerCategories.tag moves it when its category is known)

    cdata: int
    site: int
    nbytes: int
    seq: int
    table: int
    tag: int
    t0: int
    t1: int
    event: int
    key: int


class Ledger:
    """Peak / in-use / allocated bytes and counts per site.

    A site is one (stack, device). Recording an allocation only queues an
    event (no lock, no arithmetic); frees queue themselves from the weak
    reference's callback, into the same queue, so the queue holds the true
    order of events across threads. :meth:`_process` replays it — when a
    profile is built, and in batches while recording.

    The peak is the moment (allocation number) of the highest total; a
    storage freed after that moment but allocated before it was live at the
    peak, and its bytes go to ``peak_gone`` for its site. A new peak empties
    ``peak_gone``. So the peak's breakdown is exact without keeping freed
    storages around.

    In a run (``gpuflame run``), each device's events are also published to
    the run's shared peak table (capture/books/joint_peak.py) at the moment they
    happen, and the table queues *marks* ``(device, epoch, highest total)``
    among them where this process's share at the run's joint peak is to be
    taken; replaying a mark is the same trick as the peak's, per device
    (``joint_seq``, ``joint_gone``).
    """

    # events queued before the recording thread replays them: few enough that
    # a storage's reference is replayed and dropped while it is young (4096
    # kept them through the collector's young generations: 0.25-0.3 us an op
    # more on tiny ops, BENCHMARKS.md)
    BATCH = 256

    def __init__(self, hook: Any = None) -> None:
        self.lock = threading.Lock()
        self.events: deque[Any] = deque()  # StorageRef events and (device, epoch, max) marks
        self.append = self.events.append
        self.tracked: dict[int, StorageRef] = {}  # storage address -> its reference
        self.alloc_bytes: list[int] = []
        self.alloc_count: list[int] = []
        self.peak_gone: dict[int, list[int]] = {}
        # (site, category tag) -> [peak it belongs to, bytes, count]: tagged storages in peak_gone
        self.gone_tagged: dict[tuple[int, int], list[int]] = {}
        self.total = 0
        self.peak = 0
        self.peak_seq = 0
        self.seq = 0
        self.frozen = False
        # the joint peak: the hook module's table functions, when in a run
        # Any: a function of the compiled hook; called only for a table handle >= 0, which only the hook gives
        self.table_event: Any = hook.table_event if hook is not None else None
        self.site_table: list[int] = []  # site -> table handle of its device, -1 for none
        self.site_device: list[str] = []
        self.publishing = True  # False once this ledger is not the process's (a fork child's old one)
        self.joint_seq: dict[str, int] = {}  # device -> allocation number at its latest mark
        self.joint_at: dict[str, tuple[int, int]] = {}  # device -> (epoch, highest total) of that mark
        self.joint_gone: dict[int, list[int]] = {}
        # (site, category tag) -> [bytes, count]: tagged storages in joint_gone (emptied with it at each mark)
        self.joint_gone_tagged: dict[tuple[int, int], list[int]] = {}
        site_device = self.site_device
        self.log = EventLog(time.time_ns(), key_of=lambda key: site_device[key >> HISTORY_TAG_BITS])  # model/history.py
        self.on_free = self._free_callback() if hook is not None else self._stamped_free()
        # phases (capture/books/ledger_phases.py): from the first (None, id, ns) event on
        self.phases: LedgerPhases | None = None
        self.site_for: Callable[[int, int], int] = lambda site, phase_id: site

    def _stamped_free(self) -> Callable[[StorageRef], None]:
        """Outside a run a death only notes its time and queues itself."""
        append, now = self.append, time.time_ns

        def on_free(ref: StorageRef) -> None:
            ref.t1 = now()
            append(ref)

        return on_free

    def _free_callback(self) -> Callable[[StorageRef], None]:
        """The weak references' callback: queue the free, published to the table where it goes."""
        append = self.append
        site_device = self.site_device

        def on_free(ref: StorageRef) -> None:
            ref.t1 = time.time_ns()
            table = ref.table
            if table < 0 or not self.publishing:
                append(ref)
                return
            try:
                self.table_event(table, -ref.nbytes, append, ref, site_device[ref.site])
            except Exception:  # noqa: BLE001 - never into the workload: the bound says the rest
                append(ref)

        return on_free

    def new_site(self, device: str = "", table: int = -1) -> int:
        self.alloc_bytes.append(0)
        self.alloc_count.append(0)
        self.site_device.append(device)
        self.site_table.append(table)
        return len(self.alloc_bytes) - 1

    def alloc(self, storage: Any, cdata: int, nbytes: int, site: int) -> None:
        """Queue a new storage (safe from any thread: appends are atomic)."""
        ref = StorageRef(storage, self.on_free)
        ref.cdata = cdata
        ref.site = site
        ref.nbytes = nbytes
        ref.seq = 0
        ref.t0 = time.time_ns()
        table = ref.table = self.site_table[site]
        self.tracked[cdata] = ref
        if table >= 0 and self.publishing:
            self.table_event(table, nbytes, self.append, ref, self.site_device[site])
        else:
            self.append(ref)
        if len(self.events) > self.BATCH:
            self.replay_some()

    def replay_some(self) -> None:
        """Replay the queue unless another thread (or this one, re-entered) is at it."""
        if self.lock.acquire(False):
            try:
                self._process()
            finally:
                self.lock.release()

    def _process(self) -> None:
        events = self.events
        if self.frozen:
            events.clear()
            return
        tracked = self.tracked
        while events:
            ref = events.popleft()
            if type(ref) is tuple:
                self._mark(*ref)
                continue
            seq = ref.seq
            if seq == 0:
                seq = self.seq = self.seq + 1
                ref.seq = seq
                site = ref.site
                phased = self.phases
                if phased is not None and phased.current:
                    site = ref.site = self.site_for(site, phased.current)
                self.alloc_bytes[site] += ref.nbytes
                self.alloc_count[site] += 1
                self.total += ref.nbytes
                key = ref.key = site << HISTORY_TAG_BITS
                ref.event = self.log.add(ref.t0, key, ref.nbytes)
                if self.total > self.peak:
                    self.peak = self.total
                    self.peak_seq = seq
                    if self.peak_gone:
                        self.peak_gone.clear()
                if phased is not None:
                    phased.books[phased.current].raise_to(self.total, seq)
            elif seq > 0:
                self._gone(ref, tracked)

    def _mark(self, device: str | None, epoch: int, table_max: int) -> None:
        """This process's share of *device* at the run's joint peak is its books as they are now.

        ``(None, phase id, epoch ns)``: a phase begins (capture/books/ledger_phases.py).
        """
        if device is None:
            if self.phases is None:
                self.phases = LedgerPhases(self, table_max)
            self.phases.enter(epoch, table_max, self.total, self.seq)
            return
        self.joint_seq[device] = self.seq
        self.joint_at[device] = (epoch, table_max)
        if self.joint_gone:
            site_device = self.site_device
            for site in [k for k in self.joint_gone if site_device[k] == device]:
                del self.joint_gone[site]
            for key in [k for k in self.joint_gone_tagged if site_device[k[0]] == device]:
                del self.joint_gone_tagged[key]

    def _gone(self, ref: StorageRef, tracked: dict[int, StorageRef]) -> None:
        seq = ref.seq
        ref.seq = -seq
        if tracked.get(ref.cdata) is ref:
            del tracked[ref.cdata]
        self.total -= ref.nbytes
        if self.phases is not None:
            self.phases.on_free(ref.site, ref.nbytes, seq)
        self.log.add(ref.t1, ref.key, -ref.nbytes)
        if seq <= self.peak_seq:
            _add(self.peak_gone, ref.site, ref.nbytes)
            tag = getattr(ref, "tag", 0)
            if tag:
                self._gone_tagged(ref.site, tag, ref.nbytes)
        if self.joint_seq and seq <= self.joint_seq.get(self.site_device[ref.site], 0):
            _add(self.joint_gone, ref.site, ref.nbytes)
            tag = getattr(ref, "tag", 0)
            if tag:
                entry = self.joint_gone_tagged.setdefault((ref.site, tag), [0, 0])
                entry[0] += ref.nbytes
                entry[1] += 1

    def _gone_tagged(self, site: int, tag: int, nbytes: int) -> None:
        entry = self.gone_tagged.get((site, tag))
        if entry is None or entry[0] != self.peak_seq:
            entry = self.gone_tagged[(site, tag)] = [self.peak_seq, 0, 0]
        entry[1] += nbytes
        entry[2] += 1

    def forget(self, storage: Any, cdata: int) -> None:
        """Count a live storage as freed now, though it lives on (its bytes were replaced by a resize)."""
        with self.lock:
            self._process()
            ref = self.tracked.get(cdata)
            if ref is not None and ref.seq > 0 and ref() is storage and not self.frozen:
                self.on_free(ref)  # published and queued as a free now ...
                ref.table = -1  # ... and not again when the storage really dies
                self._process()

    def look(self) -> None:
        """Queue a mark for each table whose epoch moved since this process last looked (a snapshot)."""
        if self.table_event is None or not self.publishing:
            return
        for table, device in {(t, d) for t, d in zip(self.site_table, self.site_device, strict=True) if t >= 0}:
            self.table_event(table, 0, self.append, None, device)

    def freeze(self) -> None:
        """End of the window: replay what is queued, then ignore any later event."""
        with self.lock:
            self._process()
            self.frozen = True

    def phase_rows(self) -> list[Any]:
        """Each phase's books (capture/books/phase_table.py); [] before the first phase mark."""
        with self.lock:
            self._process()
            if self.phases is None:
                return []
            live = [ref for ref in list(self.tracked.values()) if ref.seq > 0]
            return self.phases.rows(live, self.total)

    def rows(self) -> dict[int, list[int]]:
        """Site -> its row (capture/books/site_row.py), joint-peak pair included."""
        with self.lock:
            if not self.frozen:
                self.look()
            self._process()
            # copy first: building the rows allocates, which may run the garbage
            # collector, whose finalizers may record
            peak_seq = self.peak_seq
            live = [ref for ref in list(self.tracked.values()) if ref.seq > 0]
            gone = [(site, list(v)) for site, v in self.peak_gone.items()]
            joint_gone = [(site, list(v)) for site, v in self.joint_gone.items()]
            joint_seq = dict(self.joint_seq)
            alloc = list(zip(self.alloc_bytes, self.alloc_count, strict=True))
            site_device = list(self.site_device)
        rows: dict[int, list[int]] = {}

        def row(site: int) -> list[int]:
            found = rows.get(site)
            if found is None:
                found = rows[site] = site_row.empty()
            return found

        for site, (nbytes, count) in gone:
            row(site)[PEAK : PEAK + 2] = [nbytes, count]
        for site, (nbytes, count) in joint_gone:
            row(site)[JOINT : JOINT + 2] = [nbytes, count]
        for ref in live:
            r = row(ref.site)
            r[INUSE] += ref.nbytes
            r[INUSE + COUNT] += 1
            if ref.seq <= peak_seq:
                r[PEAK] += ref.nbytes
                r[PEAK + COUNT] += 1
            if ref.seq <= joint_seq.get(site_device[ref.site], 0):
                r[JOINT] += ref.nbytes
                r[JOINT + COUNT] += 1
        for site, (nbytes, count) in enumerate(alloc):
            if nbytes or count:
                row(site)[ALLOC : ALLOC + 2] = [nbytes, count]
        return rows


def _add(gone: dict[int, list[int]], site: int, nbytes: int) -> None:
    """One more storage of *site* that was live at a mark and is gone since."""
    found = gone.get(site)
    if found is None:
        gone[site] = [nbytes, 1]
    else:
        found[0] += nbytes
        found[1] += 1
