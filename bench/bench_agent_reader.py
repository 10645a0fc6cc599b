"""The node agent's reader alone: CPU per event to drain the ring and book its records (no BPF, no root).

The events ring is replaced by a memory file laid out as the kernel lays the
ring out (consumer page, producer page, records), filled with what the BPF
side sends for a Python caller making alloc+free pairs (10 frames, a few
distinct stacks, every stack already named), and read by the Agent's own
reader (``Agent.poll``: ``RingBuffer.drain`` and the booking). Rounds
alternate with a null control (a fixed Python loop) so that a busy machine
shows in both; the figure is this thread's CPU time.

    python bench/bench_agent_reader.py [--events 400000] [--rounds 7]

``--src DIR`` books with another checkout's ``src`` (the code before a change).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import struct
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FRAMES, STACKS = 10, 8
HEADER = struct.Struct("<BBHHHIIQQQiI16s")
PID = 4242


def records(pairs: int) -> list[bytes]:
    """Ring records (without their 8-byte ring header) of *pairs* alloc+free pairs, as the BPF side sends them."""
    stacks = [
        b"".join(struct.pack("<QQ", 0x7F0000100000 + 0x100 * (s + f), 2 * f) for f in range(FRAMES))
        for s in range(STACKS)
    ]
    out = []
    for i in range(pairs):
        addr = 0x7F0000000000 + 512 * i
        out.append(HEADER.pack(1, 0, FRAMES, 0, 0, PID, PID, addr, 4096, 0, -1, 0, b"") + stacks[i % STACKS])
        out.append(HEADER.pack(2, 8, 0, 0, 0, PID, PID, addr, 0, 0, -1, 0, b""))
    return out


def null_control(steps: int = 200_000) -> float:
    """ns of CPU per step of a fixed Python loop (dict and list churn, as the reader's)."""
    d: dict[int, list[int]] = {}
    start = time.thread_time_ns()
    for i in range(steps):
        row = d.get(i & 1023)
        if row is None:
            row = d[i & 1023] = [0, 0]
        row[0] += i
        row[1] += 1
    return (time.thread_time_ns() - start) / steps


def one_round(recs: list[bytes]) -> float:
    """ns of CPU per event for the Agent's reader to drain and book *recs*."""
    from tests.agent.agent_helpers import fake_ring, ring_for

    from gpuflame.agent.agent import Agent
    from gpuflame.model.profile import Frame

    agent = Agent(pids=[PID], nvml_library=None)
    for s in range(STACKS):  # every stack named already (the first of each is the rare case)
        raw = recs[2 * s][HEADER.size :]
        sid = agent._intern((Frame(f"f{s}", "x.py", 1),))
        if hasattr(agent, "_raw_stacks"):  # pid -> raw -> id
            agent._raw_stacks.setdefault(PID, {})[raw] = sid
        else:  # before: (pid, raw) -> id
            agent._raw_ids[(PID, raw)] = sid
    fd, size = fake_ring(recs)
    reader = agent._read_ring if hasattr(agent, "_read_ring") else agent._incoming.append  # before: per record
    agent._ring = ring_for(fd, size, reader)
    gc.collect()  # each round from the same heap: the collector's passes cost what the heap holds
    start = time.thread_time_ns()
    agent.poll(0)
    while agent._ring.more:
        agent.poll(0)
    took = time.thread_time_ns() - start
    agent._ring.close()
    os.close(fd)
    assert agent.ledger.groups[(PID, "cuda")].lines[0][0] == 0, "every block freed"
    assert agent.counts["handler_errors"] == 0
    return took / len(recs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=400_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--src", default=str(ROOT / "src"), help="the checkout's src to book with")
    args = parser.parse_args()
    sys.path.insert(0, args.src)
    sys.path.insert(1, str(ROOT))  # the test suite's helpers, as the package tests.*
    recs = records(args.events // 2)
    reader, control = [], []
    for _ in range(args.rounds):
        control.append(null_control())
        reader.append(one_round(recs))
    ratios = sorted(r / c for r, c in zip(reader, control, strict=True))
    print(
        f"reader: {statistics.median(reader) / 1000:.2f} us of CPU per event (median of {args.rounds} rounds, "
        f"{min(reader) / 1000:.2f}-{max(reader) / 1000:.2f}); null control {statistics.median(control):.0f} ns/step; "
        f"reader / control {statistics.median(ratios):.1f} steps per event ({ratios[0]:.1f}-{ratios[-1]:.1f})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
