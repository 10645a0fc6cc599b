"""diff of two real runs of a renamed script: one file, functions by name; --no-align as before.

The script prints the bytes its one tensor holds; the second copy (renamed)
keeps twice as many. The diff's only change is that difference, computed
from the scripts' own numbers.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.run_cli import gpuflame_run, write

pytestmark = pytest.mark.slow

SCRIPT = """
import json, torch

def build():
    return torch.nn.Linear(64, 64)

def keep(n):
    return torch.zeros(n)

model = build()
kept = keep({n})
print(json.dumps({{"kept": kept.numel() * kept.element_size()}}))
"""


def diff_json(cwd: Path, *args: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "gpuflame", "diff", "a.pb.gz", "b.pb.gz", "--json", "-n", "50", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_two_runs_of_a_renamed_script(tmp_path: Path) -> None:
    write(tmp_path / "train.py", SCRIPT.format(n=1 << 16))
    write(tmp_path / "train_v2.py", SCRIPT.format(n=1 << 17))
    kept = {}
    for script, out in (("train.py", "a.pb.gz"), ("train_v2.py", "b.pb.gz")):
        done = gpuflame_run("-o", out, "--", sys.executable, script, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        kept[script] = json.loads(done.stdout.splitlines()[-1])["kept"]
    grew = kept["train_v2.py"] - kept["train.py"]
    data = diff_json(tmp_path)
    assert [(a["base"].rsplit("/", 1)[-1], a["new"].rsplit("/", 1)[-1]) for a in data["aligned"]] == [
        ("train.py", "train_v2.py")
    ]
    changes = {c["name"]: c for c in data["grew"] + data["shrank"]}
    assert changes["<module>"]["delta"] == changes["keep"]["delta"] == grew
    assert all(c["status"] == "grew" for c in changes.values())
    assert "build" not in changes  # the same model in both: matched by name, no change
    apart = diff_json(tmp_path, "--no-align")
    assert apart["aligned"] == []
    statuses = {(c["name"], c["status"]) for c in apart["grew"] + apart["shrank"]}
    assert {("<module>", "new"), ("<module>", "vanished"), ("build", "new"), ("build", "vanished")} <= statuses
