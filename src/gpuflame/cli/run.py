"""``gpuflame run``: profile a Python program and its children, with no change to it."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import textwrap
from pathlib import Path
from typing import Any

from gpuflame.boundary.backends import AUTO_RULE, BACKENDS, JAX, REGISTRY, TORCH_CUDA, TORCH_HOOKS
from gpuflame.boundary.settings import Settings, env_name
from gpuflame.cli.options import add_force_option, add_pyroscope_options, interval
from gpuflame.defaults import BACKEND, PUSH_INTERVAL_S, TORCH_HOOK
from gpuflame.errors import GpuflameError
from gpuflame.launch.runner import Launch, launch
from gpuflame.launch.store import store_root

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

{backends}

How torch records (--torch-hook): allocator wraps PyTorch's CPU allocator
with a small C++ hook compiled on first use (needs a C++ compiler; the
fastest, CPU memory only); dispatch follows every operation through a
TorchDispatchMode (any device, slower). auto takes allocator when torch has
no accelerator and a compiler is there, else dispatch.""".format(
    backends=textwrap.fill(
        "Backends (--backend): " + ", ".join(f"{b.name} ({b.summary})" for b in REGISTRY.values()) + f". {AUTO_RULE}.",
        76,
    )
)

EPILOG = """\
examples:
  gpuflame run demo.py                      # profile goes to the local store
  gpuflame run -o run.pb.gz train.py        # profile to a file (per-process files beside it)
  gpuflame run --interval 30s -- python serve.py
  gpuflame run --backend torch --no-follow worker.py
  gpuflame run --pyroscope http://pyroscope:4040 --service-name trainer train.py

then: gpuflame report run.pb.gz"""


# argparse takes "-5s" for an option (it only knows "-5" as a number) and says "expected one
# argument"; read such words as values, so --interval can say what is wrong with them
_NEGATIVE_VALUE = re.compile(r"^-\d+(\.\d*)?\s*(ms|s|m|h)?$|^-\.\d+\s*(ms|s|m|h)?$")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    if hasattr(parser, "_negative_number_matcher"):
        parser._negative_number_matcher = _NEGATIVE_VALUE
    parser.add_argument("-o", "--output", metavar="FILE", help="write the merged profile here (.pb.gz)")
    add_force_option(parser)
    parser.add_argument("--backend", choices=BACKENDS, default=BACKEND, help=f"what to record (default {BACKEND})")
    parser.add_argument(
        "--interval",
        type=interval,
        default=None,
        metavar="DURATION",
        help="also write each process's profile every DURATION (15s, 500ms; 100ms to 24h), so "
        "that a process ending by os._exit or SIGKILL still leaves a (partial) profile; "
        f"default: only at exit, or {PUSH_INTERVAL_S:g}s with --pyroscope",
    )
    parser.add_argument("--no-follow", action="store_true", help="do not profile child processes")
    parser.add_argument(
        "--torch-hook",
        choices=TORCH_HOOKS,
        default=TORCH_HOOK,
        help="how the torch backend records: allocator (CPU, fast), dispatch (any device), auto (default)",
    )
    parser.add_argument(
        "--native",
        action="store_true",
        help="C++ frames too: below each Python caller with torch's allocator hook "
        f"(which aten op allocated), from the allocator history with {TORCH_CUDA}",
    )
    parser.add_argument(
        "--keep-framework",
        action="store_true",
        help=f"keep framework-internal frames ({', '.join(p + '/' for p in REGISTRY[JAX].packages)}) "
        f"that the {JAX} backend prunes",
    )
    parser.add_argument("--store", metavar="DIR", help=f"store folder for runs without -o (default {store_root()})")
    parser.add_argument(
        "--json",
        action="store_true",
        help="print a JSON summary at the end: the last line of stdout, after the program's own output "
        "(gpuflame run --json train.py | tail -n 1)",
    )
    add_pyroscope_options(parser, "", "$GPUFLAME_SERVICE_NAME, the pod's workload, the script")
    parser.add_argument("-m", dest="module", metavar="MODULE", help="run a module, like python -m")
    parser.add_argument(
        "target",
        nargs=argparse.REMAINDER,
        metavar="script.py | -- COMMAND",
        help="the script and its arguments, a command on PATH (python train.py), or -- and any command",
    )


def command_line(args: argparse.Namespace) -> list[str]:
    """The command to start, from ``script.py args``, ``-m module args``, ``-- cmd args`` or ``cmd args`` (a command
    on PATH that is not a file here, as ``python train.py``)."""
    rest = list(args.target)
    if args.module:
        return [sys.executable, "-m", args.module, *rest[rest[:1] == ["--"] :]]
    if rest and rest[0] == "--":
        if len(rest) == 1:
            raise GpuflameError("nothing to run after --")
        _check_command(rest[1])
        return rest[1:]
    if not rest:
        raise GpuflameError("nothing to run: give a script, -m MODULE, or -- COMMAND")
    script = rest[0]
    if os.path.exists(script):
        return rest if _program_not_python(script) else [sys.executable, *rest]
    if not script.endswith(".py") and shutil.which(script):  # `gpuflame run python train.py`, `... torchrun ...`
        return rest
    _not_on_path(script)
    raise GpuflameError(f"{script}: no such script (to run a command, write: gpuflame run -- {script} ...)")


def _program_not_python(path: str) -> bool:
    """An executable file that is not Python source (an interpreter's binary, a shell script): run it itself.

    ``gpuflame run /usr/bin/python3 train.py`` ran ``python /usr/bin/python3 train.py``, and Python
    read the ELF binary as a script ("source code cannot contain null bytes"); ``./train.sh``
    failed the same way. A Python script, with a ``python`` shebang or none, still runs with this
    environment's Python, as before.
    """
    if path.endswith(".py") or not os.path.isfile(path) or not os.access(path, os.X_OK):
        return False
    try:
        with open(path, "rb") as f:
            head = f.read(256)
    except OSError:
        return False  # Python says why it cannot read it
    if head.startswith(b"\x7fELF"):
        return True
    return head.startswith(b"#!") and b"python" not in head.split(b"\n", 1)[0]


def _check_command(word: str) -> None:
    """A script named after ``--`` is not a command: say how to run it instead of "command not found"."""
    if os.sep not in word and os.path.isfile(word) and shutil.which(word) is None:
        how = f"python {word}" if word.endswith(".py") else f"./{word}"
        raise GpuflameError(f"{word}: not a command (after --, write: gpuflame run -- {how}; or leave out --)")
    _not_on_path(word)


def _not_on_path(word: str) -> None:
    """A command of gpuflame's own environment that is not on PATH (not activated): name where it is.

    `.venv/bin/gpuflame run torchrun ...` said 'no such script (write: gpuflame run -- torchrun)', and
    that said 'command not found': torchrun was in .venv/bin beside gpuflame, which PATH did not hold.
    """
    if os.sep in word or shutil.which(word):
        return
    beside = os.path.join(os.path.dirname(sys.executable), word)
    if os.path.isfile(beside) and os.access(beside, os.X_OK):
        raise GpuflameError(
            f"{word}: not on PATH; gpuflame's environment has {beside}: write gpuflame run -- {beside} ... "
            "(or activate that environment)"
        )


def run(args: argparse.Namespace) -> int:
    """The arguments as a launch request and settings; the run itself is ``launch/runner.py``'s."""
    command = command_line(args)
    asked = [args.module] if args.module else [w for w in args.target if w != "--"]
    request = Launch(command, asked, output=args.output, store=args.store, force=args.force, as_json=args.json)
    request.check()
    settings = Settings(
        backend=args.backend,
        interval=_interval(args),
        follow=not args.no_follow,
        native=args.native,
        torch_hook=args.torch_hook,
        keep_framework=args.keep_framework,
        **_pyroscope_settings(args),
    )
    return launch(request, settings)


def _interval(args: argparse.Namespace) -> float:
    if args.interval is not None:
        return args.interval
    return PUSH_INTERVAL_S if args.pyroscope else 0.0


def _pyroscope_settings(args: argparse.Namespace) -> dict[str, Any]:
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
    out = {k: v or os.environ.get(env_name(k), "") for k, v in given.items()}
    credentials = Credentials.from_env(
        user=out["pyroscope_user"], token_file=out["pyroscope_token_file"], password_file=out["pyroscope_password_file"]
    )
    PyroscopeClient(args.pyroscope, credentials=credentials, ca_file=out["pyroscope_ca"] or None)
    return {"pyroscope_url": args.pyroscope, **out}


def _absolute(path: str | None) -> str:
    return str(Path(path).resolve()) if path else ""
