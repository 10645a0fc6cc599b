"""What every part of the GPU check shares: its context, its file's header, and commands with a time limit.

Every part writes one file into the output folder that starts

    # <title>
    status: ok | skipped: <why> | failed: <why>

so a reader (and tests/e2e/test_gpu_check.py) finds each part's outcome on
its second line. Standard library only: the driver imports the parts
without torch.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
WORKLOADS = HERE / "workloads.py"
INJECT_ENV = "GPUFLAME_GPU_CHECK_INJECT"  # PART=raise|hang[,PART=...]: make a part fail, to test the driver
RUNNING = "running"


@dataclass(frozen=True)
class Context:
    """Where a part writes, where it keeps scratch files, and how big it runs."""

    out: Path
    scratch: Path
    dry_run: bool
    impl: str = "auto"
    deadline: float = float("inf")  # time.monotonic() (system-wide on Linux) when the driver stops this part

    def left(self, margin: float = 3.0) -> float:
        """Seconds this part has left, less *margin* to write its file."""
        return self.deadline - time.monotonic() - margin

    @property
    def size(self) -> str:
        return "tiny" if self.dry_run else "full"


def status_text(title: str, status: str, body: str = "") -> str:
    return f"# {title}\nstatus: {status}\n\n{body.rstrip()}\n"


def write_status(path: Path, title: str, status: str, body: str = "") -> None:
    """Write a part's file whole (a rename, so a reader never sees half of it)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(status_text(title, status, body))
    os.replace(tmp, path)


def read_status(path: Path) -> str | None:
    """The status line's value of a part's text file, or None when it has none."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return None
    return next((line[len("status: ") :] for line in lines[:3] if line.startswith("status: ")), None)


def part_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for gpuflame and the workloads: this checkout's ``src`` first on PYTHONPATH."""
    env = dict(os.environ)
    paths = [str(ROOT / "src")] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.pop(INJECT_ENV, None)
    env.update(extra or {})
    return env


@dataclass
class Done:
    """A finished command: its exit code (None: killed at its time limit), its output and how long it ran."""

    argv: list[str]
    rc: int | None
    stdout: str
    stderr: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def why(self) -> str:
        """One line on what went wrong, with the end of its stderr."""
        head = f"timed out after {self.seconds:.0f} s" if self.rc is None else f"exit {self.rc}"
        tail = " | ".join(self.stderr.strip().splitlines()[-3:])
        return f"{self.name()}: {head}" + (f": {tail}" if tail else "")

    def name(self) -> str:
        """The command in two words: ``gpuflame simulate``, ``workloads.py``, ``nvidia-smi``."""
        if len(self.argv) > 3 and self.argv[1] == "-m":
            return f"{self.argv[2]} {self.argv[3]}"
        return Path(self.argv[1] if len(self.argv) > 1 and self.argv[1].endswith(".py") else self.argv[0]).name


def run(argv: list[str], timeout: float, env: dict[str, str] | None = None, cwd: Path = ROOT) -> Done:
    """Run *argv* in its own process group; past *timeout* seconds the whole group is killed."""
    start = time.monotonic()
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env if env is not None else part_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=max(timeout, 0.1))
        rc: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        kill_group(proc)
        out, err = proc.communicate()
        rc = None
    return Done(argv, rc, out, err, time.monotonic() - start)


def kill_group(proc: subprocess.Popen[str]) -> None:
    """SIGKILL *proc*'s process group (it was started in a session of its own)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def checkout_version() -> str:
    """``git describe`` of this checkout, else (a copy without .git, or no git) gpuflame's version and why."""
    version_file = ROOT / "src" / "gpuflame" / "version.py"
    version = next((ln.split("=")[1].strip().strip("\"'") for ln in version_file.read_text().splitlines()
                    if ln.startswith("__version__")), "?")  # fmt: skip
    try:
        argv = ["git", "-C", str(ROOT), "describe", "--always", "--dirty"]
        git = subprocess.run(argv, capture_output=True, text=True)
        described = git.stdout.strip() or f"none ({git.stderr.strip()[:100]})"
    except OSError as exc:
        described = f"none ({exc.strerror})"
    return f"gpuflame {version}, git {described}"


def python() -> str:
    return sys.executable


def workload_argv(names: list[str], ctx: Context, device: str, *extra: str) -> list[str]:
    """The command that runs *names* on *device* at the context's size (workloads.py)."""
    return [python(), str(WORKLOADS), *names, "--device", device, "--size", ctx.size, "--impl", ctx.impl, *extra]


def run_workloads(
    ctx: Context, names: list[str], device: str, timeout: float, env: dict[str, str] | None = None, *extra: str
) -> tuple[list[dict[str, Any]], Done]:
    """Run workloads.py once; the JSON line it printed per workload, and the finished command."""
    done = run(workload_argv(names, ctx, device, *extra), min(timeout, ctx.left()), env=part_env(env))
    results = []
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            results.append(json.loads(line))
    return results, done


def gpuflame_argv(*args: str) -> list[str]:
    """gpuflame's command line, from this checkout (its CLI, not its internals)."""
    return [python(), "-m", "gpuflame", *args]


def cuda_available() -> bool:
    """Whether torch sees a CUDA device (imports torch: call it in a part, not in the driver)."""
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def mib(n: float | None) -> str:
    return "-" if n is None else f"{n / (1 << 20):.1f} MiB"


def table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
