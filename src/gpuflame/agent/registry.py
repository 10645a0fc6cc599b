"""The processes the agent knows: where each one's interpreter is, told to the BPF side, and its labels.

:class:`Registry` is the part of :class:`~gpuflame.agent.agent.Agent` that
registers a process (a :class:`~gpuflame.agent.process.Process`: its
interpreter, checked layout and frame namer), writes what the BPF program
needs to walk it, says once why a Python is not walked, and looks again at
processes caught before their interpreter was there; its state is the Agent's.
"""

from __future__ import annotations

import sys
import time

from gpuflame.agent import procs
from gpuflame.agent.process import Process
from gpuflame.agent.state import AgentState

REGISTER_WINDOW = 3.0  # how long a new process is looked at for its interpreter
NEVER_READY = "its thread list never read back where its offsets say it is"


class Registry(AgentState):
    """The Agent's processes (mixed into :class:`~gpuflame.agent.agent.Agent`)."""

    def _wanted(self, pid: int) -> bool:
        return not self.pids or pid in self.processes or pid in self.pids

    def _register(self, pid: int, parent: Process | None = None) -> Process | None:
        """Tell the BPF side where *pid*'s interpreter is; keep its frame namer."""
        old = self.processes.pop(pid, None)
        if old is not None:
            old.close()
        try:
            proc = Process.forked(pid, parent) if parent is not None else Process(pid, self.native)
        except OSError:
            return None  # gone already
        self.processes[pid] = proc
        if proc.provisional and pid in self._never_ready:
            proc.refuse(NEVER_READY)
        self._procs.update(pid.to_bytes(4, "little"), proc.bpf_value())
        self._labels[pid] = self._process_labels(proc)
        self._watch_code_frees(proc)
        if proc.interpreter is None and procs.looks_like_python(pid) or proc.provisional:
            self._waiting.setdefault(pid, time.monotonic() + REGISTER_WINDOW)  # libpython not mapped yet
        else:
            self._waiting.pop(pid, None)
        if proc.unverified and self.unverified.get(pid) != proc.unverified:
            self.unverified[pid] = proc.unverified
            sys.stderr.write(
                f"gpuflame agent: pid {pid} (Python {proc.version}): {proc.unverified}; its "
                "allocations get native stacks\n"
            )
        elif proc.interpreter is not None and not proc.python and proc.version not in self.unsupported:
            self.unsupported.add(proc.version)
            sys.stderr.write(
                f"gpuflame agent: Python {proc.version} (pid {pid}) is not supported "
                f"({procs.supported_said()} are): its allocations get native stacks\n"
            )
        return proc

    def _process_labels(self, proc: Process) -> dict[str, str]:
        labels = {"pid": str(proc.pid), "comm": proc.comm, **procs.ranks(proc.pid)}
        if self.labels_for is not None:
            labels.update(self.labels_for(proc.pid))
        return labels

    def _retry_waiting(self) -> None:
        """Processes just started (exec) or not yet showing an interpreter: look again."""
        now = time.monotonic()
        for pid, until in list(self._waiting.items()):
            if now > until or not procs.alive(pid):
                self._waiting.pop(pid, None)
                proc = self.processes.get(pid)
                if proc is not None and proc.provisional and procs.alive(pid):
                    self._never_ready.add(pid)
                    self._register(pid)
                continue
            proc = self.processes.get(pid)
            if proc is not None and proc.provisional:  # its layout could not be checked yet: again
                proc.recheck()
                if proc.unverified:
                    self._register(pid)  # not the table's layout after all: native stacks from now on
                elif not proc.provisional:
                    self._waiting.pop(pid, None)
                continue
            if procs.interpreter(pid) is not None:
                self._register(pid)
