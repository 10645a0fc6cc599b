"""The snapshot reader on every CPython gpuflame supports: the same profile, its fast paths compiled there.

The suite runs on one interpreter; the reader's scan compiles a regular
expression whose syntax differs between versions (possessive repetition is
3.11's), and a pattern 3.10 could not compile once made every snapshot
unreadable there. Each interpreter found here reads the files in a child
(the reader and the model are standard library only) and must print what
the suite's own interpreter prints running the same child (samples, totals,
history; not the notes, which say which sources each interpreter's own
packages hold); a version not installed here is skipped.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

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


def summary(python: str, paths: list[Path], cache: Path) -> object:
    """What *python* reads the files to (CHILD), the same code for every interpreter."""
    env = {"PYTHONPATH": str(SRC), "GPUFLAME_CACHE_DIR": str(cache), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [python, "-c", CHILD, *map(str, paths)], capture_output=True, text=True, env=env, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


@pytest.mark.subprocess
@pytest.mark.parametrize("version", VERSIONS)
def test_every_python_reads_a_snapshot_to_the_same_profile(version: str, tmp_path: Path) -> None:
    python = python_for(version)
    if python is None:
        pytest.skip(f"no CPython {version} here")
    text = tmp_path / "text-arguments.pickle"  # protocol 0: floats, longs and strings as lines of text
    text.write_bytes(pickle.dumps({"segments": [], "note": "x" * 5000, "f": 1.5, "n": 10**30}, protocol=0))
    paths = [*FILES, text]
    theirs = summary(python, paths, tmp_path / "cache")
    assert theirs == summary(sys.executable, paths, tmp_path / "cache"), f"{version} vs {sys.version_info[:2]}"
