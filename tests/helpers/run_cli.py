"""Running ``gpuflame run`` in a child process as a user would, and reading what it leaves behind."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from gpuflame.model import Profile

KIB = 1024


def gpuflame_run(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 180
) -> subprocess.CompletedProcess:
    """``gpuflame run ARGS`` in a child process, in *cwd*, with a store of its own and no inherited settings."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLAME_") and k != "PYTHONPATH"}
    full_env["GPUFLAME_STORE"] = str(cwd / "store")
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "gpuflame", "run", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def write(path: Path, *parts: str) -> Path:
    """Write a script made of dedented parts (the shared head, then the test's own lines)."""
    path.write_text("\n".join(textwrap.dedent(p) for p in parts))
    return path


def bytes_by_function(profile: Profile, type_name: str = "inuse_space", pid: int | None = None) -> dict[str, int]:
    """Self bytes per leaf function name (optionally of one process)."""
    idx = profile.type_index(type_name)
    out: dict[str, int] = {}
    for s in profile.samples:
        if pid is not None and s.label("pid") != str(pid):
            continue
        leaf = profile.frames[s.stack[0]].name if s.stack else ""
        out[leaf] = out.get(leaf, 0) + s.values[idx]
    return out


ALLOCATE = """
    import os, sys, torch

    class Holder:
        def make(self, kib):
            return torch.zeros(kib * 256, dtype=torch.float32)  # kib KiB

    def child_work(kib):
        keep = Holder().make(kib)
        print(f"child {os.getpid()}", flush=True)
        return keep
"""
