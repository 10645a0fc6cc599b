"""After the program: merge the per-process files of a run, and account for every process.

Each process of a run leaves ``proc-PID.pb.gz`` (and ``lost-PID.txt`` when
something could not be recorded) in the session folder (``contract.py``).
A process still registered in the roll call ended without its exit hooks:
its last ``--interval`` snapshot is kept and marked partial, or it is named
as lost, with the likely reason.
"""

from __future__ import annotations

import errno
import os
import signal
from pathlib import Path

from gpuflame.boundary import session_folder
from gpuflame.boundary.contract import IDLE_FILE, LOST_FILE, PER_PROCESS, PROCESS_FILE, pid_of, process_files
from gpuflame.errors import GpuflameError
from gpuflame.formats import loads, save
from gpuflame.launch import roll_call
from gpuflame.launch.folder import Held, remove_if_empty
from gpuflame.launch.outcome import note_processes
from gpuflame.launch.store import RunMeta
from gpuflame.limits import INFLATED_BYTES
from gpuflame.model import Profile, merge

# A process's note (lost-PID.txt, idle-PID.txt) is a few lines: the program can write anything there, so
# the launcher reads at most this much of one (a 40 MB note took 28.7 s, 3.04 GB and 160 MB of stderr)
NOTE_BYTES = 64 << 10
NOTE_LINES = 100  # lines of one note said; the rest are counted
# lines of all the notes said: each is a line on stderr and a comment of the merged profile, compared with the
# others (1,000 notes of 100 lines would take minutes and make a profile past GPUFLAME_MAX_COMMENTS)
NOTES_SHOWN = 2_000


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


def collect(folder: Held, output: Path, meta: RunMeta, ending: RunEnd) -> Profile | None:
    """Merge the per-process profiles into *output*; note what was lost, per pid.

    Only regular files of this user are read, through the folder's descriptor (``session_folder.py``).
    """
    problem = session_folder.write_problem(folder.fd)
    if problem:  # the processes could not write there either: say why before what is missing
        meta.lost.append(
            f"the run's folder {folder.path} cannot be written ({problem}): the processes' profiles, "
            "and their notes of what they lost, may be missing"
        )
    profiles: dict[int, Profile] = {}
    limit = INFLATED_BYTES.value()
    for pid, name in process_files(folder.fd, PROCESS_FILE).items():
        try:
            data = session_folder.read_file(folder.fd, name, limit)
            profiles[pid] = loads(data, source=str(folder.path / name))
        except OSError as exc:
            why = INFLATED_BYTES.exceeded(str(folder.path / name), limit) if exc.errno == errno.EFBIG else None
            meta.lost.append(f"unreadable process profile: {why or f'{folder.path / name}: {exc.strerror or exc}'}")
        except GpuflameError as exc:
            meta.lost.append(f"unreadable process profile: {exc}")
    meta.lost += _all_lost_notes(folder)
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
    note_processes(meta, merged)
    return merged


def _all_lost_notes(folder: Held) -> list[str]:
    """Every process's note, until NOTES_SHOWN lines: the program can make a note for any pid it likes."""
    notes = process_files(folder.fd, LOST_FILE)
    lines: list[str] = []
    for n, (pid, name) in enumerate(notes.items()):
        if len(lines) >= NOTES_SHOWN:
            return lines + [f"... and the notes of {len(notes) - n:,} more processes, not read ({folder.path})"]
        lines += _lost_notes(pid, folder, name)
    return lines


def _lost_notes(pid: int, folder: Held, name: str) -> list[str]:
    """What pid lost, from its note; an empty note was made but could not be written (a full disk)."""
    try:
        text = session_folder.read_file(folder.fd, name, NOTE_BYTES).decode("utf-8", errors="replace")
    except OSError as exc:
        why = f"larger than {NOTE_BYTES:,} bytes" if exc.errno == errno.EFBIG else exc.strerror or exc
        return [f"pid {pid}: lost something; its note {folder.path / name} cannot be read ({why})"]
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) > NOTE_LINES:
        lines[NOTE_LINES:] = [f"... and {len(lines) - NOTE_LINES:,} more lines of its note {folder.path / name}"]
    return [f"pid {pid}: {line}" for line in lines] or [
        f"pid {pid}: lost something but could not write down what (its note {name} is empty)"
    ]


def _account_unfinished(folder: Held, written: set[int], meta: RunMeta, ending: RunEnd, problem: str) -> None:
    """Processes that started recording and never finished: their last snapshot is partial, or nothing is left.

    In a read-only folder (*problem* says why it cannot be written), no
    process could remove its roll-call file: that, not how it ended, is why.
    """
    stuck = bool(problem) and not os.access(".", os.W_OK, dir_fd=folder.fd)
    for pid in roll_call.unfinished(folder.fd):
        seen = ending.endings.get(pid, roll_call.Ending(None, seen_running=False))
        if stuck and pid in written:
            continue
        if pid in written:
            taken = os.stat(PROCESS_FILE.format(pid=pid), dir_fd=folder.fd, follow_symlinks=False).st_mtime
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


def tidy(folder: Held) -> None:
    """Remove the run's bookkeeping (and half-written files of killed processes); an empty folder goes too.

    What stays is each process's profile and note of what it lost.
    """
    for name in os.listdir(folder.fd):
        if pid_kind(name) not in (PROCESS_FILE, LOST_FILE):
            session_folder.remove(folder.fd, name)
    remove_if_empty(folder.path)


def keep_for_several(folder: Held, meta: RunMeta) -> bool:
    """Whether the folder stays: for a run of several processes, each one's own profile (and note) does.

    A run of one process leaves one output: its own profile is what was merged
    (its notes are in it too), so the folder goes once the merge is written.
    A merge that failed left ``meta.processes`` empty: the files stay then.
    """
    if len(meta.processes) != 1:
        return len(meta.processes) > 1
    for name in os.listdir(folder.fd):
        if pid_kind(name) in (PROCESS_FILE, LOST_FILE):
            session_folder.remove(folder.fd, name)
    remove_if_empty(folder.path)
    return False


def pid_kind(name: str) -> str:
    """Which per-process file *name* is (PROCESS_FILE, ...); '' for anything else."""
    pid = pid_of(name)
    return next((p for p in PER_PROCESS if pid is not None and name == p.format(pid=pid)), "")


def idle_notes(folder: Held) -> dict[int, str]:
    """pid -> why that process recorded nothing (a framework imported that the backend does not record)."""
    notes = {}
    for pid, name in process_files(folder.fd, IDLE_FILE).items():
        try:
            notes[pid] = session_folder.read_file(folder.fd, name, NOTE_BYTES).decode("utf-8", errors="replace").strip()
        except OSError:
            continue
    return notes
