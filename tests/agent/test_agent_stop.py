"""The agent stops on time while a watched process floods the driver: probes off first, then a bounded read of
the ring, what is left counted and said (docs/agent.md, "Stopping")."""

from __future__ import annotations

import json
import os
import signal
import threading

from gpuflame.agent.agent import Agent
from gpuflame.formats import load
from tests.agent.agent_expected import replay, rows
from tests.agent.agent_helpers import FLOOD, NativeCaller, agent_cli, fake_ring, ring_for, watching

# The flood and the agent share one CPU, the agent at nice 10 (a twentieth of it or so, as on a node whose
# workload has the cores): the flood outruns the reader, and the ring is still full when the read's bound runs out.
FLOOD_CPU = ("taskset", "-c", "0")
AGENT_CPU = (*FLOOD_CPU, "nice", "-n", "10")


def test_sigterm_while_a_process_floods_the_agent_writes_the_profile_and_says_what_was_left(
    libcuda, bpf_object, push_pb2, profile_pb2, tmp_path
):
    """Before the fix the agent read the ring before taking its probes off, which the flood kept full: it ran on
    for as long as the flood (killed after 90 s here) and Kubernetes killed it before it wrote anything. Now: the
    probes off, the ring read for a bounded time, what is left counted, and said in the file, --json and the
    last push."""
    from tests.helpers.pyroscope_server import Server, decode_push

    server = Server()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    flood = NativeCaller(FLOOD, libcuda, tmp_path, prefix=FLOOD_CPU)
    try:
        out = tmp_path / "agent.pb.gz"
        args = ("--pid", str(flood.pid), "-o", str(out), "--json", "--pyroscope", server.url, "--interval", "1h")
        proc = agent_cli(*args, prefix=AGENT_CPU)
        watching(proc)
        flood.go()
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=90)  # a hang guard, not a timing (BENCHMARKS.md has those)
    finally:
        flood.close()
        server.shutdown()
        server.server_close()
    assert proc.returncode == 0, stderr
    summary = json.loads(stdout)
    stop = summary["stop"]
    assert stop["detach"][1] <= stop["drain"][0] <= stop["drain"][1] <= stop["count"][0]  # the probes off first
    assert summary["processes"] == [flood.pid]
    profile = load(out)
    assert profile.totals()["alloc_objects"] > 0
    assert stop["left_in_ring"] > 0, stop
    (note,) = [c for c in profile.comments if "events left in the ring at stop were not read" in c]
    assert f" {stop['left_in_ring']} events left in the ring at stop" in note and note in summary["lost"]
    (last,) = decode_push(server.requests[-1]["body"], push_pb2, profile_pb2)  # --interval 1h: only the last
    assert note in [last[1].string_table[i] for i in last[1].comment]


def test_what_the_ring_holds_at_stop_is_read_or_counted(start_target, bpf_object):
    """No read at all (a bound of 0): every record is counted and said; the default bound: every one is booked."""
    target = start_target("3.11")
    target.ready()
    skipped = Agent(pids=[target.pid])
    skipped.start(thread=False)  # nothing reads the ring until the stop
    try:
        target.run("threads")
    finally:
        skipped.stop(drain_s=0)
    allocs = [r for r in target.records if r["op"] == "alloc"]
    code = {(name, file, first) for r in allocs for _, name, file, first, _ in r["stack"]}
    assert skipped.stop_steps["detach"][1] <= skipped.stop_steps["drain"][0]
    # one record per allocation, one naming each code object of their stacks (sent once per process), and any
    # other process's exec or fork the kernel side told of meanwhile (other tests run beside this one)
    left = skipped.counts["left_in_ring"]
    assert left >= len(allocs) + len(code)
    profile = skipped.snapshot()
    assert profile.totals()["alloc_objects"] == 0
    assert f"gpuflame agent: {left} events left in the ring at stop were not read" in "\n".join(profile.comments)

    first = len(target.records)
    read = Agent(pids=[target.pid])
    read.start(thread=False)
    try:
        target.run("threads")
    finally:
        read.stop()
    assert read.counts["left_in_ring"] == 0
    profile = read.snapshot()
    assert not any("left in the ring" in c for c in profile.comments)
    assert rows(profile) == replay(target.records[first:])  # every record booked at the stop


def test_the_records_left_are_counted_by_their_headers():
    """Discarded records are not counted, a record wrapping the ring's end is one; past the time given, the rest
    is estimated from the mean size of those counted."""
    from gpuflame.agent.libbpf import RingBuffer

    records = [bytes(40), (RingBuffer.DISCARD | 40, bytes(40)), bytes(120), bytes(40)] * 2048
    fd, size = fake_ring(records, size=1 << 20, start=(1 << 20) - 24)  # the first record wraps the end
    ring = ring_for(fd, size, lambda *a: a[3])
    try:
        assert ring.left() == (3 * 2048, True)
        n, exact = ring.left(until=0.0)  # already past
        assert not exact and abs(n - 3 * 2048) <= 3 * 2048 // 100  # 512 counted, the rest from their mean size
    finally:
        ring.close()
        os.close(fd)


def test_the_last_push_to_every_url_shares_one_deadline(monkeypatch):
    """Each URL's pusher flushes within what is left of FINAL_PUSH_S, not a fresh FINAL_PUSH_S each: the stop
    fits the DaemonSet's grace period however many URLs it pushes to (each flush here takes 2 s)."""
    from gpuflame.agent import push

    now = [1000.0]
    given: list[float] = []

    def flush(pusher: object, timeout: float) -> None:
        given.append(timeout)
        now[0] += 2.0

    monkeypatch.setattr(push.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(push.Pusher, "close", flush)
    push.AgentPush([f"http://127.0.0.1:9/{n}" for n in range(4)]).close()
    assert given == [push.FINAL_PUSH_S, push.FINAL_PUSH_S - 2, push.FINAL_PUSH_S - 4, 0.0]
