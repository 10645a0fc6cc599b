"""The hold (``--hold-late-drivers``): a process that opens a driver file the agent has not probed yet is
stopped until the file's probes are in, so a driver loaded after the agent started is seen from its first call.

The kernel side (``driver_opened`` in agent.bpf.c) stops the process with SIGSTOP on its way back from the
open, before the dynamic loader can map the file, and records it in the map ``held``; the agent probes the file
(:meth:`~gpuflame.agent.probing.Probing._driver_opened`) and sends SIGCONT. Bounded: the kernel side holds
nothing unless the agent's reader showed life within 2 s (:meth:`Holding._beat`) and the ring is nearly read,
never a process with a controlling terminal or a tracer; a resumer process (:mod:`gpuflame.agent.resume`)
resumes whatever is held past :data:`HOLD_BOUND_MS`, and everything when the agent ends, however it ends.
:class:`Holding` is the part of :class:`~gpuflame.agent.agent.Agent` that drives it; its state is the Agent's.
"""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

from gpuflame.agent import resume
from gpuflame.agent.libbpf import Map
from gpuflame.agent.state import AgentState

HOLD_BOUND_MS = 1000  # the longest a process is held, when the agent is slow (its resumer lets it go)
BEAT_EVERY_NS = 100_000_000  # the reader's sign of life to the kernel side (which holds only within 2 s of it)
HOLD_STATE = struct.Struct("<QII")  # struct hold_state: alive_ns, enabled, agent_tgid
FILE_KEY = struct.Struct("<IIQ")  # struct file_key: the kernel's dev_t, pad, inode
RESUMER_WAIT_S = 2.0  # at stop: the resumer lets the rest go and exits


def kernel_dev(st_dev: int) -> int:
    """A stat's st_dev as the kernel's dev_t (major << 20 | minor), as the kernel side reads it off the inode."""
    return os.major(st_dev) << 20 | os.minor(st_dev)


class Holding(AgentState):
    """The Agent's hold on processes loading a driver file late (mixed into :class:`~gpuflame.agent.agent.Agent`)."""

    def _hold_maps(self) -> None:
        """The hold's maps of a newly loaded object: the files probed so far, and (asked) the hold on."""
        assert self._obj is not None
        self._hold_map = Map(self._obj.map_fd("hold"), HOLD_STATE.size)
        self._held = Map(self._obj.map_fd("held"), 8)
        self._probed_files = Map(self._obj.map_fd("probed_files"), 1)
        for key in self.attached:
            self._note_probed(key)
        if self.hold:
            self._start_resumer()  # on this object's map (a reload has a new one)
            self._beat(force=True)

    def _beat(self, force: bool = False) -> None:
        """Tell the kernel side the reader is alive (at most every BEAT_EVERY_NS): it holds only then."""
        now = time.monotonic_ns()
        if self.hold and (force or now - self._beat_ns >= BEAT_EVERY_NS):
            self._beat_ns = now
            self._hold_map.update(b"\0\0\0\0", HOLD_STATE.pack(now, 1, os.getpid()))

    def _note_probed(self, key: tuple[int, int]) -> None:
        """A driver file probed (its stat's device and inode): its opens need no word and hold nothing."""
        self._probed_files.update(FILE_KEY.pack(kernel_dev(key[0]), 0, key[1]), b"\x01")

    def _note_opened(self, dev: int, ino: int) -> None:
        """The same by the key the kernel side read off an opened file (an overlay's may differ from stat's)."""
        self._probed_files.update(FILE_KEY.pack(dev, 0, ino), b"\x01")

    def holds(self) -> dict[str, int]:
        """With --hold-late-drivers, the holds as numbers for --json ({} without): processes held, of those let go
        by the resumer at the bound before their probes were in, and the longest of the others' holds."""
        if not self.hold:
            return {}
        counts = self.counts
        return {
            "held": counts["held"],
            "let_go_at_bound": counts["held_past_bound"],
            "longest_ms": counts["held_ms_max"],
        }

    def _let_go(self, pid: int) -> None:
        """SIGCONT to a held process once its driver file is probed (or could not be); counted, with the longest
        hold, and counted apart when the resumer had let it go at the bound already."""
        self.counts["held"] += 1
        key = pid.to_bytes(4, "little")
        since = self._held.lookup(key)
        if since is None or not self._held.delete(key):
            self.counts["held_past_bound"] += 1
            return
        held_ms = (time.monotonic_ns() - int.from_bytes(since, "little")) // 1_000_000
        self.counts["held_ms_max"] = max(self.counts["held_ms_max"], held_ms)
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass

    def _start_resumer(self) -> None:
        """The resumer process, on the held map; one at a time (a reloaded object's replaces the last)."""
        self._stop_resumer()
        fd = self._obj.map_fd("held") if self._obj is not None else -1
        read_end, self._resumer_pipe = os.pipe()
        where = str(Path(__file__).resolve().parents[2])  # the gpuflame this agent runs, for the child too
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (where, os.environ.get("PYTHONPATH"))))}
        try:
            self._resumer = subprocess.Popen(
                [sys.executable, "-m", "gpuflame.agent.resume", str(fd), str(read_end), str(HOLD_BOUND_MS)],
                pass_fds=(fd, read_end),
                stdin=subprocess.DEVNULL,
                env=env,
            )
        finally:
            os.close(read_end)

    def _stop_resumer(self) -> None:
        """Close its pipe: it lets every process still held go, and exits."""
        if self._resumer_pipe >= 0:
            os.close(self._resumer_pipe)
            self._resumer_pipe = -1
        if self._resumer is not None:
            try:
                self._resumer.wait(RESUMER_WAIT_S)
            except subprocess.TimeoutExpired:
                self._resumer.kill()
                self._resumer.wait()
            self._resumer = None

    def _stop_hold(self) -> None:
        """At the agent's stop: hold no more, let every held process go (the resumer does, then this process
        once more: a program that read the hold as on just before it went off may have held one since)."""
        if self.hold and self._obj is not None:
            self._hold_map.update(b"\0\0\0\0", HOLD_STATE.pack(0, 0, os.getpid()))
        self._stop_resumer()
        self._let_all_go()

    def _let_all_go(self) -> None:
        if self.hold and self._obj is not None:
            for pid, _ in resume.held(self._held):
                resume.resume(self._held, pid)
