"""``gpuflame run``: profile a Python program and its children, with no change to it."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import gpuflame
from gpuflame.capture.autostart import BOOTSTRAP_DIR
from gpuflame.capture.session import LOST_FILE, PROCESS_FILE
from gpuflame.capture.settings import BACKENDS, TORCH_HOOKS, Settings
from gpuflame.capture.store import PROCESSES_DIR, PROFILE_NAME, RunMeta, new_run_folder, store_root
from gpuflame.errors import GpuflameError
from gpuflame.formats import load, save
from gpuflame.model import Profile, merge
from gpuflame.units import format_bytes, parse_duration

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
merges them. The exit code is the program's.

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

def duration(text: str) -> float:
    """``--interval``'s type: a duration (``15s``, ``500ms``, ``2m``) in seconds."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", metavar="FILE", help="write the merged profile here (.pb.gz)")
    parser.add_argument("--backend", choices=BACKENDS, default="auto", help="what to record (default auto)")
    parser.add_argument("--interval", type=duration, default=None, metavar="DURATION",
                        help="also write each process's profile every DURATION (15s, 500ms); "
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
    ship = parser.add_argument_group(
        "continuous profiling into Pyroscope",
        "secrets only from the environment or files: GPUFLAME_PYROSCOPE_TOKEN, GPUFLAME_PYROSCOPE_PASSWORD "
        "(or their *_FILE variants)",
    )
    ship.add_argument("--pyroscope", metavar="URL", help="push each process's profile to this Pyroscope every interval")
    ship.add_argument("--service-name", metavar="NAME",
                      help="service_name label (default: $GPUFLAME_SERVICE_NAME, the pod's workload, the script)")
    ship.add_argument("--tenant", metavar="ID", help="X-Scope-OrgID header (multi-tenant Pyroscope)")
    ship.add_argument("--pyroscope-ca", metavar="FILE", help="CA certificate file to verify Pyroscope's TLS with")
    ship.add_argument("--pyroscope-user", metavar="USER", help="basic auth user (password or token: environment)")
    ship.add_argument("--pyroscope-token-file", metavar="FILE", help="file holding the bearer token")
    ship.add_argument("--pyroscope-password-file", metavar="FILE", help="file holding the basic auth password")
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
    started = time.time()
    if args.output:
        output = Path(args.output)
        folder = output.with_name(output.name + ".processes")
        folder.mkdir(parents=True, exist_ok=True)
        _clear_previous_run(folder)
        run_dir = None
    else:
        asked = [args.module] if args.module else [w for w in args.target if w != "--"]
        run_dir = new_run_folder(Path(args.store) if args.store else store_root(), asked, started)
        folder = run_dir / PROCESSES_DIR
        folder.mkdir()
        output = run_dir / PROFILE_NAME
    settings = Settings(
        session_dir=str(folder.resolve()),
        backend=args.backend,
        interval=_interval(args),
        follow=not args.no_follow,
        native=args.native,
        torch_hook=args.torch_hook,
        keep_framework=args.keep_framework,
        **_pyroscope_settings(args),
    )
    exit_code = _run_program(command, profiler_env(settings))
    meta = RunMeta(command=command, started=started, ended=time.time(), exit_code=exit_code, backend=args.backend)
    try:
        _collect(folder, output, meta)
    except GpuflameError as exc:  # the program's exit code still wins
        meta.lost.append(f"the merged profile could not be written: {exc}")
        meta.processes = []
    if run_dir is not None:
        _write_meta(meta, run_dir)
    _say_where(args, output, meta)
    return exit_code


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
    for pattern in (PROCESS_FILE, LOST_FILE):
        for path in folder.glob(pattern.format(pid="*")):
            try:
                path.unlink()
            except OSError as exc:
                raise GpuflameError(f"{path}: cannot remove the previous run's file ({exc.strerror})") from None


def _run_program(command: list[str], env: dict[str, str]) -> int:
    """Start the program, pass it our SIGINT/SIGTERM, and return its exit code as a shell would."""
    try:
        child = subprocess.Popen(command, env=env)
    except FileNotFoundError:
        raise GpuflameError(f"{command[0]}: command not found") from None
    except PermissionError:
        raise GpuflameError(f"{command[0]}: permission denied") from None

    def forward(signum: int, _frame: object) -> None:
        if child.poll() is None:
            child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 - code if code < 0 else code


def _collect(folder: Path, output: Path, meta: RunMeta) -> Profile | None:
    """Merge the per-process profiles into *output*; note what was lost."""
    profiles = []
    for path in sorted(folder.glob(PROCESS_FILE.format(pid="*"))):
        try:
            profiles.append(load(path))
        except GpuflameError as exc:
            meta.lost.append(f"unreadable process profile: {exc}")
    for notes in sorted(folder.glob(LOST_FILE.format(pid="*"))):
        pid = notes.stem.split("-", 1)[1]
        meta.lost.extend(f"pid {pid}: {line}" for line in notes.read_text().splitlines() if line.strip())
    if not profiles:
        return None
    merged = merge(profiles, peaks="final")  # the peak: a moment of the whole run (model/merge.py)
    for message in meta.lost:
        if not any(message.endswith(c) or c.endswith(message) for c in merged.comments):
            merged.comments.append(message)
    save(merged, output)
    meta.processes = sorted(int(p.name.split("-")[1].split(".")[0]) for p in folder.glob(PROCESS_FILE.format(pid="*")))
    meta.totals = merged.totals()
    return merged


def _write_meta(meta: RunMeta, run_dir: Path) -> None:
    try:
        meta.write(run_dir)
    except GpuflameError as exc:
        sys.stderr.write(f"gpuflame: could not write the run's metadata ({exc})\n")


def _say_where(args: argparse.Namespace, output: Path, meta: RunMeta) -> None:
    for message in meta.lost:
        sys.stderr.write(f"gpuflame: lost: {message}\n")
    if args.json:
        summary = {**asdict(meta), "profile": str(output.resolve()) if meta.processes else None}
        sys.stdout.write(json.dumps(summary) + "\n")
        return
    if not meta.processes:
        why = "see what was lost above" if meta.lost else f"no process imported torch or jax (backend {args.backend})"
        sys.stderr.write(f"gpuflame: no profile was written: {why}\n")
        return
    if not any(meta.totals.values()):
        why = "see what was lost above" if meta.lost else "nothing was allocated while recording"
        sys.stderr.write(f"gpuflame: the profile is empty ({why}): {output}\n")
        return
    shown = next((t for t in ("peak_space", "inuse_space", "alloc_space") if t in meta.totals), None)
    size = f", {shown.split('_')[0]} {format_bytes(meta.totals[shown])}" if shown else ""
    procs = len(meta.processes)
    sys.stderr.write(
        f"gpuflame: profile of {procs} process{'es' if procs > 1 else ''}{size}: {output}\n"
        f"gpuflame: next: gpuflame report {shlex.quote(str(output))}\n"
    )

