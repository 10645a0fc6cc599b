"""Run a program under the profiler: its session folder, its environment, its signals, then the merge.

``gpuflame run`` parses its arguments into a :class:`Launch` and
:class:`~gpuflame.boundary.settings.Settings` and calls :func:`launch`; the
program's exit code is the run's, whatever happens to the profile, and a
program killed by a signal ends the launcher by the same signal once the
profile is merged.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from gpuflame.boundary.contract import child_env, unprofiled_reason
from gpuflame.boundary.settings import Settings
from gpuflame.errors import GpuflameError
from gpuflame.files import check_folder, check_output
from gpuflame.launch import roll_call
from gpuflame.launch.collect import RunEnd, collect, idle_notes, keep_for_several, tidy
from gpuflame.launch.folder import Held, make_fresh, remove_if_empty
from gpuflame.launch.outcome import say, say_where, write_meta
from gpuflame.launch.store import PROCESSES_DIR, PROFILE_NAME, RunMeta, new_run_folder, processes_folder, store_root
from gpuflame.model import Profile
from gpuflame.model.peak import is_joint, run_note
from gpuflame.printable import printable

SETTLE_S = 10.0  # how long the run waits for processes that outlive the program to write their profile


@dataclass
class Launch:
    """One ``gpuflame run``: what to start and where its profile goes."""

    command: list[str]  # what is started
    asked: list[str] = field(default_factory=list)  # what the user named (the store folder's name)
    output: str | None = None  # -o: the merged profile; None: a new run folder in the store
    store: str | None = None  # --store: the store's root; None: store_root()
    force: bool = False  # -o may replace a file gpuflame did not write
    as_json: bool = False  # --json: the summary as one JSON line on stdout

    def check(self) -> None:
        """The output (or the store) is writable and is not the program: before anything starts."""
        if self.output:  # never the script, a folder or a file gpuflame did not write
            check_output(self.output, self.command, force=self.force, make_folders=True)
        else:
            check_folder(self.store or store_root())


def launch(request: Launch, settings: Settings) -> int:
    """Run *request* with *settings* (its session folder filled in here); the program's exit code."""
    started = time.time()
    try:
        folder, output, run_dir = _places(request, started)
    except OSError as exc:  # a full disk that still made the check's empty file: before the program starts
        raise GpuflameError(f"{exc.filename or 'the run folder'}: cannot make it ({exc.strerror or exc})") from None
    try:
        return _launch(request, settings, started, folder, output, run_dir)
    finally:
        folder.close()  # the lock goes with it: another run may take this -o now


def _launch(
    request: Launch, settings: Settings, started: float, folder: Held, output: Path, run_dir: Path | None
) -> int:
    settings = replace(settings, enabled=True, session_dir=str(folder.path.resolve()))
    watch = roll_call.EndWatch(folder.fd).start()
    env = child_env(settings)
    try:
        status, root_pid = _run_program(request.command, env)
    except GpuflameError:
        watch.stop()
        for empty in (folder.path, run_dir):
            if empty is not None:
                remove_if_empty(empty)
        raise
    _wait_for_stragglers(watch)
    exit_code = 128 - status if status < 0 else status  # as a shell gives it
    meta = RunMeta(
        command=request.command, started=started, ended=time.time(), exit_code=exit_code, backend=settings.backend
    )
    unprofiled = unprofiled_reason(request.command, env)
    if unprofiled:  # before what the processes say: it is why the program itself left nothing
        meta.lost.append(f"the program goes unprofiled: {unprofiled}")
    ending = RunEnd(root_pid, status, watch.stop(), settings.interval)
    merged: Profile | None = None
    try:
        merged = collect(folder, output, meta, ending)
    except GpuflameError as exc:  # the program's exit code still wins
        meta.lost.append(f"the merged profile could not be written: {exc}")
        meta.processes = []
    if not meta.processes:
        meta.profile = None
    idle = idle_notes(folder)
    tidy(folder)
    if keep_for_several(folder, meta) and not request.as_json:
        say(sys.stderr, f"gpuflame: each process's own profile is in {printable(str(folder.path))}/\n")
    if run_dir is not None:
        write_meta(meta, run_dir)
    note = run_note(merged.peaks, settings.interval) if merged is not None else ""
    joint = merged is None or is_joint(merged.peak_units())
    say_where(output, meta, idle, note, as_json=request.as_json, joint=joint)
    if status < 0:
        _end_by(-status)
    return exit_code


def _places(request: Launch, started: float) -> tuple[Held, Path, Path | None]:
    """(the per-process folder, made fresh and held, the merged profile, the store's run folder or None with -o)."""
    if request.output:
        output = Path(request.output)
        return make_fresh(processes_folder(output)), output, None
    run_dir = new_run_folder(Path(request.store) if request.store else store_root(), request.asked, started)
    try:
        return make_fresh(run_dir / PROCESSES_DIR, "try again"), run_dir / PROFILE_NAME, run_dir
    except GpuflameError:
        remove_if_empty(run_dir)
        raise


def _wait_for_stragglers(watch: roll_call.EndWatch) -> None:
    """Processes that outlive the program (a forkserver, orphans) may still be writing: give them time, and say so."""
    waiting = watch.settle(1.0)
    if waiting:
        say(
            sys.stderr,
            f"gpuflame: waiting up to {SETTLE_S:.0f} s for {waiting} process"
            f"{'es' if waiting > 1 else ''} that outlive the program to write their profile\n",
        )
        watch.settle(SETTLE_S)


# Every signal a user or a supervisor sends to ask something of the program (SIGHUP: reload, SIGUSR1: reopen
# logs, ...): left at their default, each would kill the launcher instead, orphaning the program unmerged.
FORWARDED = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
FROM_THE_TERMINAL = (signal.SIGINT, signal.SIGQUIT)  # Ctrl-C, Ctrl-\: the terminal sends them to the whole group


def _run_program(command: list[str], env: dict[str, str]) -> tuple[int, int]:
    """Start the program, pass it the signals we get (FORWARDED); its status (-N: killed by signal N) and its pid."""
    try:
        child = subprocess.Popen(command, env=env)
    except FileNotFoundError:
        raise GpuflameError(f"{command[0]}: command not found") from None
    except PermissionError:
        raise GpuflameError(f"{command[0]}: permission denied") from None

    def forward(signum: int, _frame: object) -> None:
        if child.poll() is None and not (signum in FROM_THE_TERMINAL and _terminal_sent_it_too(child.pid)):
            child.send_signal(signum)

    # one we were started ignoring (nohup, a background job) stays ignored, as the program inherits it
    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED if signal.getsignal(sig) != signal.SIG_IGN}
    try:
        code = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return code, child.pid


def _end_by(signum: int) -> None:
    """End this process by the signal that ended the program, so whoever waits for us sees its death.

    An exit status of 128+N is not the same: bash goes on with a script after
    a Ctrl-C unless the command died of SIGINT, and a parent's ``wait()`` (a
    job runner, ``subprocess``) tells a death by signal from an exit. A core
    dump would be the launcher's, not the program's: none is written. Returns
    where the signal cannot end us (PID 1 of a container ignores it): the
    caller then exits with 128+N, as a shell gives it.
    """
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass
    try:
        resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    except (OSError, ValueError):
        pass
    try:
        if signum not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
        signal.raise_signal(signum)
    except (OSError, ValueError):
        pass


def _terminal_sent_it_too(pid: int) -> bool:
    """Ctrl-C (Ctrl-\\) reaches the whole foreground group, the program included: a second one would be too many."""
    try:
        tty = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY)
    except OSError:
        return False
    try:
        return os.tcgetpgrp(tty) == os.getpgrp() == os.getpgid(pid)
    except OSError:
        return False
    finally:
        os.close(tty)
