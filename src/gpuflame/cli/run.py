"""``gpuflame run``: profile a Python program and its children, with no change to it."""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import gpuflame
from gpuflame.capture import joint_peak, roll_call
from gpuflame.capture.autostart import BOOTSTRAP_DIR
from gpuflame.capture.session import FRAMEWORKS, IDLE_FILE, LOST_FILE, PROCESS_FILE
from gpuflame.capture.settings import BACKENDS, TORCH_HOOKS, Settings
from gpuflame.capture.store import PROCESSES_DIR, PROFILE_NAME, RunMeta, new_run_folder, store_root
from gpuflame.cli.common import add_force_option
from gpuflame.cli.options import add_pyroscope_options, duration
from gpuflame.errors import GpuflameError
from gpuflame.files import check_folder, check_output
from gpuflame.formats import load, save
from gpuflame.model import Profile, merge
from gpuflame.model.peak import run_note
from gpuflame.units import format_bytes

HELP = "profile a Python program (and its child processes)"

DESCRIPTION = """\
Run a program with gpuflame recording which Python functions hold memory, then
write one profile for the whole run (every process, with a pid label each).

  gpuflame run train.py --epochs 1          a script and its arguments
  gpuflame run -m vllm.entrypoints.cli.main serve ...   a module
  gpuflame run -- vllm serve facebook/opt-125m           any command that starts Python

Nothing in the program changes: gpuflame starts through a sitecustomize on
PYTHONPATH, so it also follows subprocess and multiprocessing children
(spawn, fork, forkserver). Each process writes its own profile at exit (also
on SIGTERM, at every --interval, and at a CUDA out-of-memory error); the run
merges them. The exit code is the program's. A process that ends without its
exit hooks (os._exit, SIGKILL, a crash) is named with the reason; with
--interval its last snapshot is kept and marked partial.

Backends (--backend): torch-cuda (PyTorch's caching-allocator history: peak,
in use, allocated, cached free blocks), torch (torch memory on any device,
CPU included), jax (JAX's live buffers). auto picks torch-cuda when CUDA is
available, else torch, plus jax when the program imports it.

How torch records (--torch-hook): allocator wraps PyTorch's CPU allocator
with a small C++ hook compiled on first use (needs a C++ compiler; the
fastest, CPU memory only); dispatch follows every operation through a
TorchDispatchMode (any device, slower). auto takes allocator when torch has
no accelerator and a compiler is there, else dispatch."""

EPILOG = """\
examples:
  gpuflame run demo.py                      # profile goes to the local store
  gpuflame run -o run.pb.gz train.py        # profile to a file (per-process files beside it)
  gpuflame run --interval 30s -- python serve.py
  gpuflame run --backend torch --no-follow worker.py
  gpuflame run --pyroscope http://pyroscope:4040 --service-name trainer train.py

then: gpuflame report run.pb.gz"""

SETTLE_S = 10.0  # how long the run waits for processes that outlive the program to write their profile


# argparse takes "-5s" for an option (it only knows "-5" as a number) and says "expected one
# argument"; read such words as values, so --interval can say what is wrong with them
_NEGATIVE_VALUE = re.compile(r"^-\d+(\.\d*)?\s*(ms|s|m|h)?$|^-\.\d+\s*(ms|s|m|h)?$")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    if hasattr(parser, "_negative_number_matcher"):
        parser._negative_number_matcher = _NEGATIVE_VALUE
    parser.add_argument("-o", "--output", metavar="FILE", help="write the merged profile here (.pb.gz)")
    add_force_option(parser)
    parser.add_argument("--backend", choices=BACKENDS, default="auto", help="what to record (default auto)")
    parser.add_argument("--interval", type=duration, default=None, metavar="DURATION",
                        help="also write each process's profile every DURATION (15s, 500ms), so that a process "
                        "ending by os._exit or SIGKILL still leaves a (partial) profile; "
                        "default: only at exit, or 15s with --pyroscope")
    parser.add_argument("--no-follow", action="store_true", help="do not profile child processes")
    parser.add_argument("--torch-hook", choices=TORCH_HOOKS, default="auto",
                        help="how the torch backend records: allocator (CPU, fast), dispatch (any device), "
                        "auto (default)")
    parser.add_argument("--native", action="store_true",
                        help="C++ frames too: below each Python caller with torch's allocator hook "
                        "(which aten op allocated), from the allocator history with torch-cuda")
    parser.add_argument("--keep-framework", action="store_true",
                        help="keep framework-internal frames (jax/, jaxlib/) that the jax backend prunes")
    parser.add_argument("--store", metavar="DIR", help=f"store folder for runs without -o (default {store_root()})")
    parser.add_argument("--json", action="store_true", help="print a JSON summary at the end (on stdout)")
    add_pyroscope_options(parser, "", "$GPUFLAME_SERVICE_NAME, the pod's workload, the script")
    parser.add_argument("-m", dest="module", metavar="MODULE", help="run a module, like python -m")
    parser.add_argument("target", nargs=argparse.REMAINDER, metavar="script.py | -- COMMAND",
                        help="the script and its arguments, or -- and any command")


def command_line(args: argparse.Namespace) -> list[str]:
    """The command to start, from ``script.py args``, ``-m module args`` or ``-- cmd args``."""
    rest = list(args.target)
    if args.module:
        return [sys.executable, "-m", args.module, *rest]
    if rest and rest[0] == "--":
        if len(rest) == 1:
            raise GpuflameError("nothing to run after --")
        return rest[1:]
    if not rest:
        raise GpuflameError("nothing to run: give a script, -m MODULE, or -- COMMAND")
    script = rest[0]
    if not os.path.exists(script):
        raise GpuflameError(f"{script}: no such script (to run a command, write: gpuflame run -- {script} ...)")
    return [sys.executable, *rest]


def profiler_env(settings: Settings) -> dict[str, str]:
    """The environment that starts gpuflame in the program and its children."""
    env = dict(os.environ)
    home = str(Path(gpuflame.__file__).resolve().parents[1])
    paths = [BOOTSTRAP_DIR] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["GPUFLAME_HOME"] = home
    env.update(settings.to_env())
    return env


def run(args: argparse.Namespace) -> int:
    command = command_line(args)
    if args.output:  # never the script, a folder or a file gpuflame did not write
        check_output(args.output, command, force=args.force, make_folders=True)
    else:
        check_folder(args.store or store_root())
    started = time.time()
    folder, output, run_dir = _places(args, started)
    settings = Settings(
        enabled=True,
        session_dir=str(folder.resolve()),
        backend=args.backend,
        interval=_interval(args),
        follow=not args.no_follow,
        native=args.native,
        torch_hook=args.torch_hook,
        keep_framework=args.keep_framework,
        **_pyroscope_settings(args),
    )
    watch = roll_call.EndWatch(folder).start()
    try:
        status, root_pid = _run_program(command, profiler_env(settings))
    except GpuflameError:
        watch.stop()
        for empty in (folder, run_dir):
            if empty is not None:
                _remove_if_empty(empty)
        raise
    _wait_for_stragglers(watch)
    exit_code = 128 - status if status < 0 else status  # as a shell gives it
    meta = RunMeta(command=command, started=started, ended=time.time(), exit_code=exit_code, backend=args.backend)
    ending = RunEnd(root_pid, status, watch.stop(), settings.interval)
    merged: Profile | None = None
    try:
        merged = _collect(folder, output, meta, ending)
    except GpuflameError as exc:  # the program's exit code still wins
        meta.lost.append(f"the merged profile could not be written: {exc}")
        meta.processes = []
    if not meta.processes:
        meta.profile = None
    idle = _idle_notes(folder)
    _tidy(folder)
    if run_dir is not None:
        _write_meta(meta, run_dir)
    _say_where(args, output, meta, idle, run_note(merged.peaks) if merged is not None else "")
    return exit_code


def _places(args: argparse.Namespace, started: float) -> tuple[Path, Path, Path | None]:
    """(the per-process folder, the merged profile, the store's run folder or None with -o)."""
    if args.output:
        output = Path(args.output)
        folder = output.with_name(output.name + ".processes")
        folder.mkdir(parents=True, exist_ok=True)
        _clear_previous_run(folder)
        return folder, output, None
    asked = [args.module] if args.module else [w for w in args.target if w != "--"]
    run_dir = new_run_folder(Path(args.store) if args.store else store_root(), asked, started)
    folder = run_dir / PROCESSES_DIR
    folder.mkdir()
    return folder, run_dir / PROFILE_NAME, run_dir


def _wait_for_stragglers(watch: roll_call.EndWatch) -> None:
    """Processes that outlive the program (a forkserver, orphans) may still be writing: give them time, and say so."""
    waiting = watch.settle(1.0)
    if waiting:
        sys.stderr.write(f"gpuflame: waiting up to {SETTLE_S:.0f} s for {waiting} process"
                         f"{'es' if waiting > 1 else ''} that outlive the program to write their profile\n")
        watch.settle(SETTLE_S)


def _interval(args: argparse.Namespace) -> float:
    if args.interval is not None:
        return args.interval
    return 15.0 if args.pyroscope else 0.0


def _pyroscope_settings(args: argparse.Namespace) -> dict[str, str]:
    """Continuous-mode settings, checked here so a bad URL or file fails before the program starts.

    An option left out keeps the value already in the environment (the
    settings' variables are written over the program's environment).
    """
    if not args.pyroscope:
        return {}
    from gpuflame.ship.pyroscope import Credentials, PyroscopeClient

    given = {
        "service_name": args.service_name,
        "tenant": args.tenant,
        "pyroscope_user": args.pyroscope_user,
        "pyroscope_ca": _absolute(args.pyroscope_ca),
        "pyroscope_token_file": _absolute(args.pyroscope_token_file),
        "pyroscope_password_file": _absolute(args.pyroscope_password_file),
    }
    out = {k: v or os.environ.get("GPUFLAME_" + k.upper(), "") for k, v in given.items()}
    credentials = Credentials.from_env(
        user=out["pyroscope_user"], token_file=out["pyroscope_token_file"], password_file=out["pyroscope_password_file"]
    )
    PyroscopeClient(args.pyroscope, credentials=credentials, ca_file=out["pyroscope_ca"] or None)
    return {"pyroscope_url": args.pyroscope, **out}


def _absolute(path: str | None) -> str:
    return str(Path(path).resolve()) if path else ""


def _clear_previous_run(folder: Path) -> None:
    """A folder reused by ``-o``: last run's process files must not join this run."""
    for pattern in (PROCESS_FILE, LOST_FILE, IDLE_FILE, roll_call.STARTED_FILE):
        for path in folder.glob(pattern.format(pid="*")):
            try:
                path.unlink()
            except OSError as exc:
                raise GpuflameError(f"{path}: cannot remove the previous run's file ({exc.strerror})") from None


def _run_program(command: list[str], env: dict[str, str]) -> tuple[int, int]:
    """Start the program, pass it our SIGINT/SIGTERM; its status (-N: killed by signal N) and its pid."""
    try:
        child = subprocess.Popen(command, env=env)
    except FileNotFoundError:
        raise GpuflameError(f"{command[0]}: command not found") from None
    except PermissionError:
        raise GpuflameError(f"{command[0]}: permission denied") from None

    def forward(signum: int, _frame: object) -> None:
        if child.poll() is None and not (signum == signal.SIGINT and _terminal_sent_it_too(child.pid)):
            child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return code, child.pid


def _terminal_sent_it_too(pid: int) -> bool:
    """Ctrl-C reaches the whole foreground group, the program included: a second SIGINT would be one too many."""
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


def _collect(folder: Path, output: Path, meta: RunMeta, ending: RunEnd) -> Profile | None:
    """Merge the per-process profiles into *output*; note what was lost, per pid."""
    profiles: dict[int, Profile] = {}
    for path in sorted(folder.glob(PROCESS_FILE.format(pid="*"))):
        try:
            profiles[_pid_of(path)] = load(path)
        except GpuflameError as exc:
            meta.lost.append(f"unreadable process profile: {exc}")
    for notes in sorted(folder.glob(LOST_FILE.format(pid="*"))):
        pid = notes.stem.split("-", 1)[1]
        meta.lost.extend(f"pid {pid}: {line}" for line in notes.read_text().splitlines() if line.strip())
    _account_unfinished(folder, set(profiles), meta, ending)
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


def _pid_of(path: Path) -> int:
    return int(path.name.split("-")[1].split(".")[0])


def _account_unfinished(folder: Path, written: set[int], meta: RunMeta, ending: RunEnd) -> None:
    """Processes that started recording and never finished: their last snapshot is partial, or nothing is left."""
    for pid in roll_call.unfinished(folder):
        seen = ending.endings.get(pid, roll_call.Ending(None, seen_running=False))
        if pid in written:
            taken = (folder / PROCESS_FILE.format(pid=pid)).stat().st_mtime
            meta.partial_processes.append(_partial(pid, taken, seen, meta.ended, ending))
        else:
            why = _nothing_written(pid, seen, ending)
            meta.lost_processes.append({"pid": pid, "why": why})
            meta.lost.append(why)


def _partial(pid: int, taken: float, seen: roll_call.Ending, run_ended: float, ending: RunEnd) -> dict[str, object]:
    """A process whose profile is its last --interval snapshot: how much of its life that misses."""
    if seen.ended is None and seen.seen_running:
        missing: float | None = run_ended - taken
        why = (f"pid {pid}: partial: still running when the run ended; its profile is its last --interval "
               f"snapshot, taken {missing:.1f} s before that")
    else:
        missing = seen.ended - taken if seen.ended is not None else None
        when = f", {missing:.1f} s before the process ended" if missing is not None else ""
        why = (f"pid {pid}: partial: its profile stops at the last --interval snapshot{when}; "
               f"the final profile was never written ({ending.how(pid)})")
    return {"pid": pid, "why": why, "missing_s": missing}


def _nothing_written(pid: int, seen: roll_call.Ending, ending: RunEnd) -> str:
    if seen.ended is None and seen.seen_running:
        return f"pid {pid}: nothing written: still running when the run ended"
    hint = ("; it ended before its first --interval snapshot" if ending.interval > 0
            else "; --interval 10s keeps a snapshot of such a process")
    return f"pid {pid}: nothing could be written: {ending.how(pid)} before its exit hooks ran{hint}"


def _tidy(folder: Path) -> None:
    """Remove the run's bookkeeping (and half-written files of killed processes); an empty folder goes too."""
    bookkeeping = (roll_call.STARTED_FILE, IDLE_FILE, joint_peak.TABLE_FILE.replace("{device}", "{pid}"))
    for pattern in [name.format(pid="*") for name in bookkeeping] + [".*.tmp"]:
        for path in folder.glob(pattern):
            try:
                path.unlink()
            except OSError:
                pass
    _remove_if_empty(folder)


def _remove_if_empty(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:
        pass  # not empty (or already gone): nothing to tidy


def _write_meta(meta: RunMeta, run_dir: Path) -> None:
    try:
        meta.write(run_dir)
    except GpuflameError as exc:
        sys.stderr.write(f"gpuflame: could not write the run's metadata ({exc})\n")


def _idle_notes(folder: Path) -> dict[int, str]:
    """pid -> why that process recorded nothing (a framework imported that the backend does not record)."""
    notes = {}
    for path in folder.glob(IDLE_FILE.format(pid="*")):
        try:
            notes[int(path.stem.split("-", 1)[1])] = path.read_text().strip()
        except (OSError, ValueError):
            continue
    return notes


def _say_where(args: argparse.Namespace, output: Path, meta: RunMeta, idle: dict[int, str], peak_note: str) -> None:
    for message in meta.lost:
        sys.stderr.write(f"gpuflame: lost: {message}\n")
    for partial in meta.partial_processes:
        sys.stderr.write(f"gpuflame: {partial['why']}\n")
    if args.json:
        summary = {**asdict(meta), "profile": str(output.resolve()) if meta.processes else None}
        sys.stdout.write(json.dumps(summary) + "\n")
        return
    if not meta.processes:
        why = "see what was lost above" if meta.lost else _why_nothing(args.backend, idle)
        sys.stderr.write(f"gpuflame: no profile was written: {why}\n")
        return
    if not any(meta.totals.values()):
        why = "see what was lost above" if meta.lost else "nothing was allocated while recording"
        sys.stderr.write(f"gpuflame: the profile is empty ({why}): {output}\n")
        return
    shown = next((t for t in ("peak_space", "inuse_space", "alloc_space") if t in meta.totals), None)
    size = f", {shown.split('_')[0]} {format_bytes(meta.totals[shown])}" if shown else ""
    sys.stderr.write(f"gpuflame: profile of {_processes_phrase(meta)}{size}: {output}\n")
    if peak_note:  # the peak is not one moment that happened (JAX samples, a bound): say what it is
        sys.stderr.write(f"gpuflame: {peak_note}\n")
    sys.stderr.write(f"gpuflame: next: gpuflame report {shlex.quote(str(output))}\n")


def _processes_phrase(meta: RunMeta) -> str:
    """``3 processes``; ``2 of 3 processes (1 lost: see above)``; never a count that hides a loss."""
    done, lost, partial = len(meta.processes), len(meta.lost_processes), len(meta.partial_processes)
    total = done + lost
    noun = "process" if total == 1 else "processes"
    counted = f"{done} of {total} {noun}" if lost else f"{done} {noun}"
    notes = [f"{lost} lost"] * bool(lost) + [f"{partial} partial"] * bool(partial)
    return counted + (f" ({', '.join(notes)}: see above)" if notes else "")


def _why_nothing(backend: str, idle: dict[int, str]) -> str:
    """What really happened when no process recorded: which framework never came, and what did."""
    watched = [m for m, backends in FRAMEWORKS.items() if backend in backends]
    never = " or ".join(watched)
    head = f"{never} was never imported" if backend != "auto" else "no process imported torch or jax"
    seen = "; ".join(f"pid {pid} {note}" for pid, note in sorted(idle.items()))
    return f"{head} (--backend {backend})" + (f"; {seen}" if seen else "")
