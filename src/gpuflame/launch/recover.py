"""Finish a run whose launcher died: merge the per-process files it left, and account for every process.

A SIGKILL'd ``gpuflame run`` (an OOM killer, a node drained, ``kill -9``)
never merges: its folder keeps ``proc-PID.pb.gz``, ``lost-PID.txt`` and the
roll call, and no ``profile.pb.gz``. The program it started usually runs on
to its end and writes its own files. Recovering does what the launcher would
have done, with :func:`collect.collect` (the same merge and the same
accounting): what the launcher alone knew (the program's exit code, when each
process was seen to end) is unknown, and said so.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from gpuflame.boundary import session_folder
from gpuflame.boundary.contract import PER_PROCESS, process_files
from gpuflame.errors import GpuflameError
from gpuflame.files import check_output
from gpuflame.launch import roll_call
from gpuflame.launch.collect import RunEnd, collect, idle_notes, keep_for_several, tidy
from gpuflame.launch.folder import Held, hold_existing
from gpuflame.launch.outcome import say, say_where, write_meta
from gpuflame.launch.store import PROCESSES_DIR, PROCESSES_SUFFIX, PROFILE_NAME, RunMeta, processes_folder
from gpuflame.model import Profile
from gpuflame.model.peak import is_joint, run_note
from gpuflame.printable import printable


@dataclass
class RunFolder:
    """What a killed run left: its per-process folder, where its profile goes, the store's run folder or None."""

    folder: Path
    output: Path | None
    run_dir: Path | None


def find(given: Path) -> RunFolder:
    """The run behind *given*: a store run folder, an ``OUT.processes`` folder, ``OUT`` itself, or any such folder.

    Nothing is opened here (a FIFO given as RUN is named, never read); the folder is checked as it is held.
    """
    if (given / PROCESSES_DIR).is_dir():
        return RunFolder(given / PROCESSES_DIR, given / PROFILE_NAME, given)
    if given.is_dir() and given.name.endswith(PROCESSES_SUFFIX) and len(given.name) > len(PROCESSES_SUFFIX):
        return RunFolder(given, given.with_name(given.name[: -len(PROCESSES_SUFFIX)]), None)
    if not given.is_dir() and processes_folder(given).is_dir():
        return RunFolder(processes_folder(given), given, None)
    if given.is_dir():
        return RunFolder(given, None, None)
    if given.exists() and not given.is_file():
        raise GpuflameError(f"{given}: is a device, a pipe or a socket, not a run's folder or its -o file")
    if given.is_file():  # a run that ended merges and removes its folder (one process): nothing is left to do
        raise GpuflameError(
            f"{given}: that run's profile is already merged (its per-process folder "
            f"{processes_folder(given).name} is gone): nothing to recover"
        )
    raise GpuflameError(f"{given}: no such run folder (give the store's run folder, or the -o file of the run)")


def recover(given: Path, output: Path | None = None, force: bool = False, as_json: bool = False) -> int:
    """Merge what the run at *given* left; 0 when a profile was written, 1 when nothing could be."""
    run = find(given)
    held = hold_existing(run.folder)  # ours, private, and no run uses it now: else one line
    try:
        return _recover(given, run, held, output, force, as_json)
    finally:
        held.close()


def _recover(given: Path, run: RunFolder, held: Held, output: Path | None, force: bool, as_json: bool) -> int:
    if not any(process_files(held.fd, pattern) for pattern in PER_PROCESS):
        raise GpuflameError(f"{given}: no per-process files of a run here (proc-PID.pb.gz, lost-PID.txt, started-PID)")
    target = output or run.output
    if target is None:
        raise GpuflameError(f"{given}: not a run folder gpuflame made; say where the profile goes with -o FILE")
    check_output(target, force=force)
    meta = RunMeta(command=[], started=_first_write(held.fd), ended=time.time(), backend="")
    running = _still_running(held.fd)
    ending = RunEnd(root_pid=0, status=0, endings=running, interval=0.0)
    meta.lost.append("the launcher did not end the run: the program's exit code and how each process ended are unknown")
    merged: Profile | None = None
    try:
        merged = collect(held, target, meta, ending)
    except GpuflameError as exc:
        meta.lost.append(f"the merged profile could not be written: {exc}")
        meta.processes = []
    if not meta.processes:
        meta.profile = None
    idle = idle_notes(held)
    if running:
        say(
            sys.stderr,
            f"gpuflame: {len(running)} process(es) of the run still run (pid "
            f"{', '.join(map(str, running))}): their profiles are not final; recover again once "
            "they have ended\n",
        )
    else:
        tidy(held)
        if keep_for_several(held, meta) and not as_json:
            say(sys.stderr, f"gpuflame: each process's own profile is in {printable(str(held.path))}/\n")
    if run.run_dir is not None and output is None:
        write_meta(meta, run.run_dir)
    note = run_note(merged.peaks) if merged is not None else ""
    joint = merged is None or is_joint(merged.peak_units())
    say_where(target, meta, idle, note, as_json=as_json, joint=joint)
    return 0 if meta.processes else 1


def _first_write(folder: int) -> float:
    """When the run started, as near as its files tell (the earliest one written)."""
    return min((st.st_mtime for st in session_folder.own_files(folder).values()), default=time.time())


def _still_running(folder: int) -> dict[int, roll_call.Ending]:
    """Registered processes that are alive now (the others ended without their exit hooks)."""
    alive = {}
    for pid in roll_call.unfinished(folder):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        except OSError:
            pass  # alive, another user's
        alive[pid] = roll_call.Ending(None, seen_running=True)
    return alive
