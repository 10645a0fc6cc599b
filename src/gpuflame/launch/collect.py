"""After the program: merge the per-process files of a run, and account for every process.

Each process of a run leaves ``proc-PID.pb.gz`` (and ``lost-PID.txt`` when
something could not be recorded) in the session folder (``contract.py``).
A process still registered in the roll call ended without its exit hooks:
its last ``--interval`` snapshot is kept and marked partial, or it is named
as lost, with the likely reason.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from gpuflame.boundary.contract import IDLE_FILE, LOST_FILE, PROCESS_FILE, STARTED_FILE, TABLE_FILE, process_files
from gpuflame.errors import GpuflameError
from gpuflame.files import write_problem
from gpuflame.formats import load, save
from gpuflame.launch import roll_call
from gpuflame.launch.store import RunMeta
from gpuflame.model import Profile, merge


class RunEnd:
    """How the run ended: the program's pid and exit code, and when each registered process was seen to end."""

    def __init__(self, root_pid: int, status: int, endings: dict[int, roll_call.Ending], interval: float) -> None:
        self.root_pid = root_pid
        self.status = status
        self.endings = endings
        self.interval = interval

    def how(self, pid: int) -> str:
        """The likely reasons a process skipped its exit hooks (the exact one where the launcher saw it)."""
        if pid == self.root_pid:
            if self.status >= 0:
                return f"it ended by os._exit({self.status})"
            try:
                return f"it was killed by {signal.Signals(-self.status).name}"
            except ValueError:
                return f"it was killed by signal {-self.status}"
        return "it ended by os._exit(), SIGKILL or a crash"


def collect(folder: Path, output: Path, meta: RunMeta, ending: RunEnd) -> Profile | None:
    """Merge the per-process profiles into *output*; note what was lost, per pid."""
    problem = write_problem(folder)
    if problem:  # the processes could not write there either: say why before what is missing
        meta.lost.append(
            f"the run's folder {folder} cannot be written ({problem}): the processes' profiles, "
            "and their notes of what they lost, may be missing"
        )
    profiles: dict[int, Profile] = {}
    for pid, path in process_files(folder, PROCESS_FILE).items():
        try:
            profiles[pid] = load(path)
        except GpuflameError as exc:
            meta.lost.append(f"unreadable process profile: {exc}")
    for pid, path in process_files(folder, LOST_FILE).items():
        meta.lost.extend(_lost_notes(pid, path))
    _account_unfinished(folder, set(profiles), meta, ending, problem)
    if not profiles:
        return None
    merged = merge(list(profiles.values()), peaks="final")  # the peak: a moment of the whole run (model/merge.py)
    for message in meta.lost + [str(p["why"]) for p in meta.partial_processes]:
        if not any(message.endswith(c) or c.endswith(message) for c in merged.comments):
            merged.comments.append(message)
    save(merged, output)
    meta.processes = sorted(profiles)
    meta.totals = merged.totals()
    return merged


def _lost_notes(pid: int, path: Path) -> list[str]:
    """What pid lost, from its note; an empty note was made but could not be written (a full disk)."""
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError as exc:
        return [f"pid {pid}: lost something; its note {path} cannot be read ({exc.strerror or exc})"]
    return [f"pid {pid}: {line}" for line in lines] or [
        f"pid {pid}: lost something but could not write down what (its note {path.name} is empty)"
    ]


def _account_unfinished(folder: Path, written: set[int], meta: RunMeta, ending: RunEnd, problem: str) -> None:
    """Processes that started recording and never finished: their last snapshot is partial, or nothing is left.

    In a read-only folder (*problem* says why it cannot be written), no
    process could remove its roll-call file: that, not how it ended, is why.
    """
    stuck = bool(problem) and not os.access(folder, os.W_OK)
    for pid in roll_call.unfinished(folder):
        seen = ending.endings.get(pid, roll_call.Ending(None, seen_running=False))
        if stuck and pid in written:
            continue
        if pid in written:
            taken = (folder / PROCESS_FILE.format(pid=pid)).stat().st_mtime
            meta.partial_processes.append(_partial(pid, taken, seen, meta.ended, ending))
        else:
            why = f"pid {pid}: nothing could be written ({problem})" if stuck else _nothing_written(pid, seen, ending)
            meta.lost_processes.append({"pid": pid, "why": why})
            meta.lost.append(why)


def _partial(pid: int, taken: float, seen: roll_call.Ending, run_ended: float, ending: RunEnd) -> dict[str, object]:
    """A process whose profile is its last --interval snapshot: how much of its life that misses."""
    if seen.ended is None and seen.seen_running:
        missing: float | None = run_ended - taken
        why = (
            f"pid {pid}: partial: still running when the run ended; its profile is its last --interval "
            f"snapshot, taken {missing:.1f} s before that"
        )
    else:
        missing = seen.ended - taken if seen.ended is not None else None
        when = f", {missing:.1f} s before the process ended" if missing is not None else ""
        why = (
            f"pid {pid}: partial: its profile stops at the last --interval snapshot{when}; "
            f"the final profile was never written ({ending.how(pid)})"
        )
    return {"pid": pid, "why": why, "missing_s": missing}


def _nothing_written(pid: int, seen: roll_call.Ending, ending: RunEnd) -> str:
    if seen.ended is None and seen.seen_running:
        return f"pid {pid}: nothing written: still running when the run ended"
    hint = (
        "; it ended before its first --interval snapshot"
        if ending.interval > 0
        else "; --interval 10s keeps a snapshot of such a process"
    )
    return f"pid {pid}: nothing could be written: {ending.how(pid)} before its exit hooks ran{hint}"


def tidy(folder: Path) -> None:
    """Remove the run's bookkeeping (and half-written files of killed processes); an empty folder goes too."""
    bookkeeping = [STARTED_FILE.format(pid="*"), IDLE_FILE.format(pid="*"), TABLE_FILE.format(device="*")]
    for pattern in bookkeeping + [".*.tmp"]:
        for path in folder.glob(pattern):
            try:
                path.unlink()
            except OSError:
                pass
    remove_if_empty(folder)


def remove_if_empty(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:
        pass  # not empty (or already gone): nothing to tidy


def idle_notes(folder: Path) -> dict[int, str]:
    """pid -> why that process recorded nothing (a framework imported that the backend does not record)."""
    notes = {}
    for pid, path in process_files(folder, IDLE_FILE).items():
        try:
            notes[pid] = path.read_text().strip()
        except OSError:
            continue
    return notes
