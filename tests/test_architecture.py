"""The rule ARCHITECTURE.md states for the in-process side: it imports only the standard library.

The profiler runs inside the user's program (and, on Kubernetes, from a
payload copied into the pod without gpuflame's dependencies), so recording
and writing a profile must not import numpy or rich. Each check runs in a
fresh interpreter, where ``sys.modules`` shows exactly what was imported.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

LAUNCHER_ONLY = ("numpy", "rich")

PLAIN = """
import json, sys
import gpuflame
gpuflame.start(sys.argv[1], backend="jax")
gpuflame.stop()
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in {names!r})))
"""

TORCH = """
import json, sys
before = set(sys.modules)
import torch
imported_by_torch = set(sys.modules) - before
import gpuflame
with gpuflame.profile(sys.argv[1], backend="torch"):
    kept = torch.zeros(1 << 16)
ours = sorted(m for m in set(sys.modules) - before - imported_by_torch if m.split(".")[0] in {names!r})
print(json.dumps(ours))
"""


def run_fresh(code: str, out: Path) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-c", code.format(names=set(LAUNCHER_ONLY)), str(out)],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def test_start_stop_imports_no_launcher_dependency(tmp_path):
    assert run_fresh(PLAIN, tmp_path / "p.pb.gz") == []


def test_recording_and_writing_a_torch_profile_imports_no_launcher_dependency(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "t.pb.gz"
    assert run_fresh(TORCH, out) == []
    assert out.stat().st_size > 0  # a profile was written, so the writer's imports were counted
