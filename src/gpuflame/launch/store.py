"""The local store: one folder per run, holding the profile and its metadata.

Layout (what ``gpuflame serve`` lists)::

    <store>/20261129-174102-train.py/
        profile.pb.gz        every process merged, with a pid label each
        meta.json            command, times, exit code, totals, processes
        processes/           one proc-<pid>.pb.gz per profiled process

``gpuflame run -o OUT`` writes OUT, and its per-process files in ``OUT.processes/``.

The store is ``$GPUFLAME_STORE``, else ``$XDG_DATA_HOME/gpuflame/runs``,
else ``~/.local/share/gpuflame/runs``.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gpuflame.files import atomic_write

PROFILE_NAME = "profile.pb.gz"
META_NAME = "meta.json"
PROCESSES_DIR = "processes"
PROCESSES_SUFFIX = ".processes"  # ``gpuflame run -o OUT`` keeps its per-process files in OUT.processes


def processes_folder(output: Path) -> Path:
    """Where ``gpuflame run -o OUTPUT`` keeps its per-process files."""
    return output.with_name(output.name + PROCESSES_SUFFIX)


def store_root() -> Path:
    explicit = os.environ.get("GPUFLAME_STORE")
    if explicit:
        return Path(explicit)
    data = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(data) / "gpuflame" / "runs"


def run_folder_name(command: list[str], started: float) -> str:
    """``20261129-174102-serve.py``: sortable by time, readable by what was run.

    *command* is what the user asked to run (``serve.py``, a module name, or
    ``vllm serve``), not the interpreter that runs it.
    """
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(started))
    words = [os.path.basename(c) for c in command[:2] if c and not c.startswith("-")]
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", "-".join(words))[:60].strip("._-") or "run"
    return f"{stamp}-{slug}"


def new_run_folder(root: Path, command: list[str], started: float) -> Path:
    """A fresh folder for one run (a suffix keeps two runs in the same second apart)."""
    base = root / run_folder_name(command, started)
    path, n = base, 1
    while True:
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            n += 1
            path = base.with_name(f"{base.name}-{n}")


@dataclass
class RunMeta:
    """What ``meta.json`` says about a run."""

    command: list[str]
    started: float
    ended: float = 0.0
    exit_code: int | None = None
    backend: str = "auto"
    profile: str | None = PROFILE_NAME  # None: the run wrote no profile
    processes: list[int] = field(default_factory=list)  # pids whose profile is in the merged one
    totals: dict[str, int] = field(default_factory=dict)
    lost: list[str] = field(default_factory=list)  # every loss, in words
    # per pid: {"pid", "why"} for processes that left nothing; {"pid", "why", "missing_s"} for
    # processes whose profile is their last --interval snapshot (missing_s: None when unknown)
    lost_processes: list[dict[str, object]] = field(default_factory=list)
    partial_processes: list[dict[str, object]] = field(default_factory=list)
    # a run of several processes (or a ranked one): each one's rank, command line, own peak and share of the
    # joint peak (analysis/processes.py's ProcessRow.to_dict), by rank; how uneven they were, None under two
    per_process: list[dict[str, object]] = field(default_factory=list)
    uneven: dict[str, object] | None = None

    def write(self, folder: Path) -> None:
        atomic_write(folder / META_NAME, json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def read(cls, folder: Path) -> RunMeta:
        data = json.loads((folder / META_NAME).read_text())
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)
