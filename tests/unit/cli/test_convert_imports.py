"""``gpuflame convert`` of a snapshot imports no numpy: on a small file, start-up is most of the command.

numpy's import is about 0.2 s of CPU, a third of converting a real
snapshot of a few MB (BENCHMARKS.md, "Reading real snapshots, paired").
The analysis package, the selection and the function bars keep it out of
the path that only reads and writes a file.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import paths

SNAPSHOT = paths.REPO / "tests" / "data" / "torch-snapshot-MAGMA27-memory_snapshot.pickle.gz"
CHILD = """
import sys
from gpuflame.cli.main import main
code = main(sys.argv[1:])
print("numpy" in sys.modules, code)
"""


@pytest.mark.subprocess
def test_converting_a_snapshot_imports_no_numpy(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, "convert", str(SNAPSHOT), "-o", str(tmp_path / "out.pb.gz")],
        env={**os.environ, "PYTHONPATH": str(paths.SRC)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.stdout.splitlines()[-1] == "False 0", done.stderr
    assert (tmp_path / "out.pb.gz").stat().st_size > 0
