"""Booking the events ring: allocations, results, frees, exits into the ledger, each under its named stack.

:class:`Booking` is the part of :class:`~gpuflame.agent.agent.Agent` the
reader thread runs for each record: a stack not seen before is named once
(Python frames through the process's code reader, native ones from ELF
symbols) and interned; entry-only probes' results are matched to their
pending calls and their return sites probed once verified; its state is the
Agent's.
"""

from __future__ import annotations

import mmap
import sys
import time

from gpuflame.agent import procs
from gpuflame.agent.call_sites import MAX_SITES
from gpuflame.agent.events import (
    BLOCK_KEY,
    DEVICE_CUDA,
    DEVICE_HOST,
    EV_ALLOC,
    EV_CODE,
    EV_CODE_FREED,
    EV_DRIVER,
    EV_DRIVER_OPENED,
    EV_EXEC,
    EV_EXIT,
    EV_FORK,
    EV_FREE,
    EV_NEW_PROCESS,
    EV_RESULT,
    EV_SITE,
    EV_VMM,
    F_FAILED,
    F_HELD,
    F_NO_THREAD,
    F_NOT_REGISTERED,
    F_PENDING,
    F_RETURNED,
    F_TRUNCATED,
    F_UNKNOWN,
    F_UNTRACKED,
    HEADER,
    K_CREATE,
    K_MAP,
    K_RELEASE,
    K_RETAIN,
    K_UNMAP,
    RING_RECORD,
    Header,
    code_record,
    device_label,
    header,
    native_frames,
    python_frames,
    unpack_free,
    vmm_handle,
)
from gpuflame.agent.ledger import (
    ALLOC,
    ALLOC_N,
    CHANGED,
    INUSE,
    INUSE_N,
    MAX_IN_FLIGHT,
    PEAK,
    PEAK_N,
    block_key,
    key_parts,
)
from gpuflame.agent.libbpf import BpfError, RingBuffer
from gpuflame.agent.pending import Pending
from gpuflame.agent.process import Process
from gpuflame.agent.state import AgentState
from gpuflame.model.profile import SYNTHETIC, Frame

SITE_CHECKS_PER_PROCESS = 64  # return addresses one process may have checked (each reads its maps and code)
NO_PYTHON_STACK = Frame("<no Python stack>", kind=SYNTHETIC)
TOO_EARLY = Frame("<before the agent knew the process>", kind=SYNTHETIC)
TRUNCATED = Frame("<deeper frames not recorded>", kind=SYNTHETIC)
OVER_LIMIT = (Frame("<stacks beyond the agent's limit>", kind=SYNTHETIC),)
MAX_STACKS = 1 << 18  # distinct stacks named (each a row of the ledger and of the profile)
MAX_RAW_STACK_BYTES = 64 << 20  # the raw frames kept to recognise stacks already named
_LABELS = {d: device_label(d) for d in (DEVICE_CUDA, DEVICE_HOST)}  # the devices the hot path books


class Booking(AgentState):
    """The Agent's events, booked (mixed into :class:`~gpuflame.agent.agent.Agent`)."""

    def _read_ring(self, data: mmap.mmap, page: int, mask: int, consumer: int, stop: int) -> int:
        """Book the ring's records from *consumer* to *stop*, or to the first still being written; where it
        stopped (a reader of :meth:`RingBuffer.drain`).

        The two records that make nearly all of a busy ring are booked in the loop, read where they lie, with
        no Python call: a free of a known block, and an allocation of a stack already named with nothing to
        count, on a row that exists and an address not in use (:meth:`Ledger.free` and :meth:`Ledger.alloc`
        inlined: their calls were a tenth of the reader's time). Every other record goes through
        :meth:`_handle`, which books those two alike (tests/agent/test_agent_reader.py holds both ways to the
        same rows)."""
        ledger, raw_stacks, labels = self.ledger, self._raw_stacks, _LABELS
        blocks_of, groups, in_flight, clock = ledger.blocks, ledger.groups, ledger.in_flight, ledger.clock
        fields, frames_at, flagged = RING_RECORD.unpack_from, 8 + HEADER.size, RingBuffer.DISCARD
        while consumer < stop:
            at = page + (consumer & mask)
            length, type_, kind, flags, tgid, tid, addr, size, device = fields(data, at)  # one call for all
            if length >= flagged:  # busy or discarded (the two top bits)
                if length & RingBuffer.BUSY:
                    break  # being written: read at the next drain
                consumer += ((length & ~flagged) + 15) & ~7
                continue
            consumer += (length + 15) & ~7  # the 8-byte ring header, 8-aligned
            try:
                if type_ == EV_FREE and kind != K_RELEASE and not flags:
                    blocks = blocks_of.get(tgid)
                    block = blocks.pop(addr, None) if blocks is not None else None
                    if block is not None:
                        if len(in_flight) < MAX_IN_FLIGHT or tid in in_flight:  # Ledger.note, inlined
                            in_flight[tid] = (tgid, addr, block)
                        else:
                            ledger.note(tid, (tgid, addr, block))
                        g, line, size = block
                        clock += 1  # Ledger.free, inlined
                        if line[CHANGED] <= g.peak_time:
                            line[PEAK] = line[INUSE]
                            line[PEAK_N] = line[INUSE_N]
                        line[INUSE] -= size
                        line[INUSE_N] -= 1
                        line[CHANGED] = clock
                        g.total -= size
                        continue
                elif type_ == EV_ALLOC and not flags and kind != K_CREATE:
                    label = labels.get(device)
                    raws = raw_stacks.get(tgid)
                    stack = raws.get(data[at + frames_at : at + 8 + length]) if raws is not None else None
                    if stack is not None and label is not None:
                        group, blocks = groups.get((tgid, label)), blocks_of.get(tgid)
                        row = group.lines.get(stack) if group is not None else None
                        if group is not None and row is not None and blocks is not None and addr not in blocks:
                            clock += 1  # Ledger.alloc, inlined
                            if row[CHANGED] <= group.peak_time:
                                row[PEAK] = row[INUSE]
                                row[PEAK_N] = row[INUSE_N]
                            row[INUSE] += size
                            row[INUSE_N] += 1
                            row[ALLOC] += size
                            row[ALLOC_N] += 1
                            row[CHANGED] = clock
                            total = group.total = group.total + size
                            if total > group.peak_total:
                                group.peak_total = total
                                group.peak_time = clock
                            blocks[addr] = (group, row, size)
                            continue
                ledger.clock = clock
                self._handle(data[at + 8 : at + 8 + length])
            except Exception as exc:  # noqa: BLE001 - one bad record must not stop the agent
                self._not_booked(exc)
            clock = ledger.clock
        ledger.clock = clock
        return consumer

    def _not_booked(self, exc: Exception) -> None:
        self.counts["handler_errors"] += 1
        if self.counts["handler_errors"] == 1:
            sys.stderr.write(f"gpuflame agent: could not book an event ({type(exc).__name__}: {exc})\n")

    def _handle(self, data: bytes) -> None:
        kind = data[0]
        if kind == EV_FREE:  # the most frequent with allocations: kept short; booked at the call's entry
            flags, tgid, tid, addr, size = unpack_free(data)
            if flags & F_UNKNOWN:  # a block allocated before the probes of the driver file it loaded late
                self.late_frees[tgid] = self.late_frees.get(tgid, 0) + 1
            elif flags & F_FAILED:  # the driver refused it: undone
                self.ledger.undo(tgid, tid, block_key(data[1] == K_RELEASE, addr))
            elif data[1] == K_RELEASE:
                self.ledger.release(tgid, addr, tid)
            else:  # a size: the kernel knew the block (its allocation's record lost, if not known here)
                self.ledger.free(tgid, addr, tid, known=size > 0)
        elif kind == EV_ALLOC:
            self._alloc(data)
        elif kind == EV_RESULT:
            self._result(header(data))
        elif kind == EV_SITE:
            self._probe_return_site(header(data))
        elif kind == EV_CODE:
            record = code_record(data)
            proc = self.processes.get(record.tgid)
            if proc is not None and proc.reader is not None:
                proc.reader.remember(record)
        elif kind == EV_CODE_FREED:
            h = header(data)
            self._code_freed(h.tgid, h.addr)
        elif kind == EV_VMM:
            h = header(data)
            if h.kind == K_MAP:
                self.ledger.map(h.tgid, h.addr, h.size, vmm_handle(data))
            elif h.kind == K_UNMAP and h.flags & F_FAILED:  # refused: the mapping holds on
                self.ledger.undo(h.tgid, h.tid, h.addr)
            elif h.kind == K_UNMAP:
                self.ledger.unmap(h.tgid, h.addr, h.size, h.tid)
            elif h.kind == K_RETAIN:
                self.ledger.retain(h.tgid, h.addr)
        elif kind == EV_DRIVER:
            h = header(data)
            self._driver_loaded(h.tgid, h.ts)
        elif kind == EV_DRIVER_OPENED:
            h = header(data)
            try:
                if self._driver_opened(h.tgid, h.addr, h.ts):
                    self._note_opened(h.seq, h.size)  # by the kernel's (dev, inode): its next opens send nothing
            finally:
                if h.flags & F_HELD:  # stopped at the open by the kernel side (--hold-late-drivers)
                    self._let_go(h.tgid)
        elif kind == EV_EXIT:
            self._exit(header(data).tgid)
        elif kind == EV_NEW_PROCESS:
            tgid = header(data).tgid
            if self._wanted(tgid) and (tgid not in self.processes or not self.processes[tgid].python):
                self._register(tgid)
        elif kind == EV_FORK:
            h = header(data)
            if h.tgid in self.processes:
                self._register(h.addr, parent=self.processes[h.tgid])
        elif kind == EV_EXEC:
            tgid = header(data).tgid
            if tgid in self.processes or (not self.pids and procs.looks_like_python(tgid)):
                self._register(tgid)  # a new image: what we knew of the process is void

    def _code_freed(self, pid: int, code: int) -> None:
        """A code object named in a stack is gone: forget its name and the raw stacks holding its address."""
        proc = self.processes.get(pid)
        if proc is not None and proc.reader is not None:
            proc.reader.forget(code)
        needle = code.to_bytes(8, "little")
        raws = self._raw_stacks.get(pid)
        if raws:
            self._raw_stacks[pid] = {raw: sid for raw, sid in raws.items() if needle not in raw}
            self._count_raw_bytes()

    def _count_raw_bytes(self) -> None:
        self._raw_bytes = sum(len(raw) for raws in self._raw_stacks.values() for raw in raws)

    def _alloc(self, data: bytes) -> None:
        _type, kind, _n, _nn, flags, tgid, tid, addr, size, _ts, device, seq, _comm = HEADER.unpack_from(data)
        raw = data[HEADER.size :]
        stack = self._raw_stacks.get(tgid, {}).get(raw)
        if stack is None:  # a stack not seen before (the BPF side woke us at once for it)
            stack = self._new_stack(raw, header(data), data)
            if stack is None:
                return
        if flags:
            for flag, name in (
                (F_NOT_REGISTERED, "not_registered"),
                (F_NO_THREAD, "no_thread"),
                (F_TRUNCATED, "truncated"),
                (F_UNTRACKED, "untracked"),
            ):
                if flags & flag:
                    self.counts[name] += 1
        if flags & F_PENDING:
            self.pending.add(tgid, tid, Pending(seq, kind, device_label(device), stack, size))
            return
        self.ledger.alloc(tgid, device_label(device), stack, block_key(kind == K_CREATE, addr), size)

    def _result(self, h: Header) -> None:
        call = self.pending.take(h.tgid, h.tid, h.seq)
        if call is None or h.flags & F_FAILED:
            return  # an allocation not booked (a process not watched), or the call failed: nothing allocated
        if h.flags & F_UNKNOWN:
            self.counts["results_unknown"] += 1
            self.counts["results_unknown_bytes"] += h.size
            return
        if not h.flags & F_RETURNED:
            self.counts["results_next_entry"] += 1
        self.ledger.alloc(h.tgid, call.device, call.stack, block_key(call.kind == K_CREATE, h.addr), h.size)

    def _probe_return_site(self, h: Header) -> None:
        """A plain uprobe where a driver call returns to (in its file: every process that maps it), once verified.

        The address comes from the process's stack: only a site :mod:`call_sites` has verified in the file
        (right after a call into the driver) is probed; the others are counted, their results read at the
        thread's next driver call.
        """
        checked = self._site_checks[h.tgid] = self._site_checks.get(h.tgid, 0) + 1
        if len(self.return_sites) >= MAX_SITES or checked > SITE_CHECKS_PER_PROCESS:
            self.counts["sites_unverified"] += 1
            return
        site = self._verifier.site(h.tgid, h.addr)
        if isinstance(site, str):
            self.counts["sites_unverified"] += 1
            if self.counts["sites_unverified"] == 1:
                sys.stderr.write(
                    f"gpuflame agent: not probing return address {h.addr:#x} of pid {h.tgid}: {site} "
                    "(its results are read at the next driver call)\n"
                )
            return
        try:
            if site.key in self.return_sites:
                return
            assert self._obj is not None  # return sites are found in the events of a loaded object
            if self._multi:
                self._obj.attach_uprobe_multi("ret_site", site.path, [site.offset], [0], ret=False)
            else:
                self._obj.attach_uprobe("ret_site", site.path, site.offset, ret=False)
        except BpfError:
            self.counts["sites_unprobed"] += 1
            return
        finally:
            site.close()
        self.return_sites[site.key] = site.shown

    def _new_stack(self, raw: bytes, h: Header, data: bytes) -> int | None:
        self.cuda_seen = True
        if not self.first_event_ns:
            self.first_event_ns = time.time_ns()
        proc = self.processes.get(h.tgid)
        if proc is None and self._wanted(h.tgid):
            proc = self._register(h.tgid)
            if proc is None:  # gone already, or /proc refused it: its allocation is missing, and counted
                self.counts["unread_allocs"] += 1
                self.counts["unread_alloc_bytes"] += h.size
        if proc is None:
            return None
        if len(self._stacks) >= self.max_stacks or self._raw_bytes >= MAX_RAW_STACK_BYTES:
            self.counts["stacks_over_limit"] += 1  # a process making stacks without end: bounded, and said
            return self._intern(OVER_LIMIT)
        self._raw_bytes += len(raw)
        stack = self._raw_stacks.setdefault(h.tgid, {})[raw] = self._intern(self._frames(proc, h, data))
        return stack

    def _frames(self, proc: Process, h: Header, data: bytes) -> tuple[Frame, ...]:
        frames: list[Frame] = []
        if h.nnative:
            addresses = native_frames(data, h.nframes, h.nnative)
            frames += proc.native_frames(addresses, above_python=bool(h.nframes and proc.python))
        if h.nframes and proc.python:
            frames += [proc.python_frame(code, instr) for code, instr in python_frames(data, h.nframes)]
            if h.flags & F_TRUNCATED:
                frames.append(TRUNCATED)
        elif proc.python or h.flags & F_NOT_REGISTERED and not h.nnative:
            frames.append(TOO_EARLY if h.flags & F_NOT_REGISTERED else NO_PYTHON_STACK)
        return tuple(frames) or (NO_PYTHON_STACK,)

    def _intern(self, frames: tuple[Frame, ...]) -> int:
        sid = self._stack_ids.get(frames)
        if sid is None:
            sid = self._stack_ids[frames] = len(self._stacks)
            self._stacks.append(frames)
        return sid

    def forget_exited(self) -> None:
        """Drop the rows of processes that have ended (a long-running agent pushing every interval keeps
        only live processes; their last push carried their final values)."""
        with self._lock:
            for pid in self._exited:
                self.ledger.drop(pid)
                self._labels.pop(pid, None)
            self._exited.clear()

    def _exit(self, pid: int) -> None:
        self._exited.add(pid)
        self._site_checks.pop(pid, None)
        self.counts["results_unread"] += self.pending.drop(pid)
        for key in self.ledger.exit(pid):
            self._live.delete(BLOCK_KEY.pack(pid, *key_parts(key)))
        proc = self.processes.pop(pid, None)
        if proc is not None:
            proc.close()
        if self._raw_stacks.pop(pid, None):
            self._count_raw_bytes()
