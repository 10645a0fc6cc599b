"""The agent's reader without BPF: the events ring walked where it lies and its records booked.

The ring is a memory file laid out as the kernel lays it out (agent_helpers.fake_ring). The reader books
frees and allocations of stacks already named in its own loop and hands every other record to
``Booking._handle``: both ways must book the same.
"""

from __future__ import annotations

import mmap
import os
import random
import struct

from gpuflame.agent import events
from gpuflame.agent.agent import Agent
from gpuflame.agent.libbpf import RingBuffer
from gpuflame.model.profile import Frame
from tests.agent.agent_helpers import fake_ring, ring_for

PID = 4242
STACKS = [b"".join(struct.pack("<QQ", 0x7F00001000 + 64 * (s + f), f) for f in range(3)) for s in range(4)]


def record(
    type_: int, kind: int, addr: int, size: int = 0, stack: bytes = b"", flags: int = 0, device: int = -1
) -> bytes:
    n = len(stack) // 16
    return events.HEADER.pack(type_, kind, n, 0, flags, PID, PID, addr, size, 0, device, 0, b"") + stack


def agent_with_stacks() -> Agent:
    """An Agent (not started) that has named every stack of STACKS already."""
    agent = Agent(pids=[PID], nvml_library=None)
    for i, raw in enumerate(STACKS):
        agent._raw_stacks.setdefault(PID, {})[raw] = agent._intern((Frame(f"f{i}", "x.py", i + 1),))
    return agent


def mixed_records(seed: int) -> list[bytes]:
    """Allocations (some flagged, some VMM handles, host memory) and frees (some of unknown blocks, handle
    releases), addresses handed out again, as the BPF side sends them."""
    rng = random.Random(seed)
    out, live, handles = [], [], []
    for i in range(600):
        roll = rng.random()
        if live and roll < 0.4:
            out.append(record(events.EV_FREE, events.K_FREE, live.pop(rng.randrange(len(live)))))
        elif handles and roll < 0.45:
            out.append(record(events.EV_FREE, events.K_RELEASE, handles.pop()))
        elif roll < 0.5:
            out.append(record(events.EV_FREE, events.K_FREE, 0xDEAD0000 + i))  # from before the agent
        elif roll < 0.55:
            handles.append(0x1000 + i)
            out.append(record(events.EV_ALLOC, events.K_CREATE, handles[-1], 2 << 20, rng.choice(STACKS), device=0))
        else:
            addr = 0x7F0000000000 + 512 * rng.randrange(40)  # reused addresses: some frees were missed
            flags = rng.choice([0, 0, 0, events.F_REPLACED, events.F_TRUNCATED, events.F_UNTRACKED])
            device = rng.choice([-1, -1, -2])
            live.append(addr)
            out.append(
                record(events.EV_ALLOC, events.K_ALLOC, addr, rng.randrange(1, 9999), rng.choice(STACKS), flags, device)
            )
    return out


def booked(agent: Agent) -> tuple[list, dict, int]:
    return sorted(agent.ledger.rows()), dict(agent.counts), agent.ledger.unmatched_frees


def read_all(agent: Agent, recs: list, limit: int = 1 << 20, **ring: int) -> RingBuffer:
    fd, size = fake_ring(recs, **ring)
    agent._ring = ring_for(fd, size, agent._read_ring, limit)
    os.close(fd)  # the mappings hold the file
    agent.poll(0)
    while agent._ring.more:
        agent.poll(0)
    return agent._ring


def test_the_ring_reader_books_as_each_record_booked_alone():
    for seed in range(5):
        recs = mixed_records(seed)
        one_by_one = agent_with_stacks()
        for rec in recs:
            one_by_one._handle(rec)
        through_ring = agent_with_stacks()
        read_all(through_ring, recs, limit=4000)  # several reads (4,000 bytes each)
        assert booked(through_ring) == booked(one_by_one)
        assert through_ring.counts["handler_errors"] == 0


def test_a_record_wrapping_the_ring_end_is_read_whole():
    recs = [record(events.EV_ALLOC, events.K_ALLOC, 0x7F0000000000 + 512 * i, 100, STACKS[i % 4]) for i in range(20)]
    agent = agent_with_stacks()
    read_all(agent, recs, size=4096, start=4096 - 40)  # the first record's data wraps the end
    assert sum(v[4] for _, _, v in agent.ledger.rows()) == 20 * 100


def test_discarded_records_are_skipped_and_a_record_being_written_is_left():
    alloc = record(events.EV_ALLOC, events.K_ALLOC, 0x7F0000000000, 100, STACKS[0])
    later = record(events.EV_ALLOC, events.K_ALLOC, 0x7F0000001000, 7, STACKS[1])
    recs = [alloc, (RingBuffer.DISCARD | len(alloc), alloc), (RingBuffer.BUSY | len(later), later), later]
    agent = agent_with_stacks()
    ring = read_all(agent, recs)
    assert sum(v[4] for _, _, v in agent.ledger.rows()) == 100  # the discarded copy not booked
    assert not ring.more  # stopped at the busy record: read again at the next drain
    assert struct.unpack_from("<Q", ring._consumer, 0)[0] == 2 * (8 + len(alloc))  # after the two records read


def test_a_drain_reads_what_the_producer_wrote_meanwhile_and_stops_at_its_limit():
    """The producer position is read again when the reader catches up; *limit* bytes end a drain (``more``)."""
    recs = [record(events.EV_ALLOC, events.K_ALLOC, 0x7F0000000000 + 512 * i, 10, STACKS[i % 4]) for i in range(30)]
    each = 8 + len(recs[0])
    fd, size = fake_ring(recs)
    with mmap.mmap(fd, mmap.PAGESIZE * 2) as m:
        struct.pack_into("<Q", m, mmap.PAGESIZE, 10 * each)  # the producer has written 10 of the 30 so far
        calls = []

        def reader(*args: int) -> int:
            if not calls:  # the kernel writes the other 20 while the first 10 are read
                struct.pack_into("<Q", m, mmap.PAGESIZE, 30 * each)
            calls.append(args[4])
            return agent._read_ring(*args)

        agent = agent_with_stacks()
        ring = ring_for(fd, size, reader, limit=25 * each)
        ring.drain(0)
        assert calls == [10 * each, 25 * each] and ring.more  # stopped at the limit, not at the producer
        assert sum(v[5] for _, _, v in agent.ledger.rows()) == 25
        ring.drain(0)
        assert sum(v[5] for _, _, v in agent.ledger.rows()) == 30 and not ring.more
    os.close(fd)


def test_a_handle_and_an_address_of_the_same_value_are_two_blocks():
    from gpuflame.agent.ledger import Ledger, block_key, key_parts

    ledger = Ledger()
    ledger.alloc(7, "cuda", 0, block_key(True, 0x1000), 2 << 20)  # cuMemCreate's handle 0x1000
    ledger.alloc(7, "cuda", 1, block_key(False, 0x1000), 512)  # cuMemAlloc's address 0x1000
    assert ledger.release(7, 0x1000)  # the handle's last reference
    assert {stack: v[2] for _, stack, v in ledger.rows()} == {0: 0, 1: 512}
    assert [key_parts(key) for key in ledger.exit(7)] == [(0, 0x1000)]
    assert key_parts(block_key(True, (1 << 64) - 1)) == (1, (1 << 64) - 1)


def test_a_free_after_the_peak_keeps_its_row_at_the_peak():
    """The peak is at the second allocation; the free that follows must not lower the first row's peak."""
    recs = [
        record(events.EV_ALLOC, events.K_ALLOC, 0xA000, 100, STACKS[0]),
        record(events.EV_ALLOC, events.K_ALLOC, 0xB000, 50, STACKS[1]),
        record(events.EV_FREE, events.K_FREE, 0xA000),
        record(events.EV_ALLOC, events.K_ALLOC, 0xC000, 10, STACKS[1]),
    ]
    agent = agent_with_stacks()
    read_all(agent, recs)
    # (peak, peak blocks, in use, in use blocks, allocated, allocations) per stack
    assert {stack: v for _, stack, v in agent.ledger.rows()} == {0: (100, 1, 0, 0, 100, 1), 1: (50, 1, 60, 2, 60, 2)}


def test_lost_events_and_those_the_ring_refused_are_said():
    from gpuflame.agent.agent import loss_notes

    stats = {"lost_events": 7, "ring_refused": 2, "lost_allocs": 3, "lost_alloc_bytes": 3000, "lost_frees": 2}
    assert (
        "gpuflame agent: 7 events were lost, 5 to a full ring buffer (the reader was behind); 2 refused by the "
        f"ring buffer while it had room (each tried {events.OUTPUT_TRIES} times): 3 allocations (3000 bytes), "
        "2 frees, 2 other records; the totals are short"
    ) in loss_notes(stats)
    (note,) = [n for n in loss_notes({"lost_events": 3, "lost_frees": 3}) if "lost" in n]
    assert "3 to a full ring buffer" in note and "refused" not in note and "0 allocations (0 bytes), 3 frees" in note
