"""The snapshot reader on every CPython gpuflame supports: the same profile, its fast paths compiled there.

The suite runs on one interpreter; the reader's scan compiles a regular
expression whose syntax differs between versions (possessive repetition is
3.11's), and a pattern 3.10 could not compile once made every snapshot
unreadable there. Each interpreter found here reads the files in a child
(the reader and the model are standard library only) and must print what
this one computes (samples, totals, history; not the notes, which say which
sources each interpreter's own packages hold); a version not installed here
is skipped.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from gpuflame.formats import torch_snapshot
from tests.helpers.paths import DATA, SRC
from tests.helpers.pythons import VERSIONS, python_for

FILES = [DATA / "torch-snapshot-DeComFL-memory.pickle.gz", DATA / "hostile" / "protocol-0.pickle"]

CHILD = """
import json, sys
from gpuflame.formats import torch_snapshot
out = []
for path in sys.argv[1:]:
    p = torch_snapshot.decode(open(path, "rb").read())
    out.append([len(p.samples), [sum(s.values[i] for s in p.samples) for i in range(len(p.sample_types))],
                p.history.events() if p.history else 0])
print(json.dumps(out))
"""


def summary(paths: list[Path]) -> list[list[object]]:
    out: list[list[object]] = []
    for path in paths:
        p = torch_snapshot.decode(path.read_bytes())
        totals = [sum(s.values[i] for s in p.samples) for i in range(len(p.sample_types))]
        out.append([len(p.samples), totals, p.history.events() if p.history else 0])
    return out


@pytest.mark.subprocess
@pytest.mark.parametrize("version", VERSIONS)
def test_every_python_reads_a_snapshot_to_the_same_profile(version: str, tmp_path: Path) -> None:
    python = python_for(version)
    if python is None:
        pytest.skip(f"no CPython {version} here")
    text = tmp_path / "text-arguments.pickle"  # protocol 0: floats, longs and strings as lines of text
    text.write_bytes(pickle.dumps({"segments": [], "note": "x" * 5000, "f": 1.5, "n": 10**30}, protocol=0))
    paths = [*FILES, text]
    env = {"PYTHONPATH": str(SRC), "GPUFLAME_CACHE_DIR": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [python, "-c", CHILD, *map(str, paths)], capture_output=True, text=True, env=env, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == json.loads(json.dumps(summary(paths))), f"{version} vs {sys.version_info[:2]}"
