"""The wheel ships every file of the package, the launcher's bootstrap included.

An editable install (what the tests run on) finds any file under src/; a
wheel only holds what the build configuration names. A bootstrap missing
from the wheel would make ``gpuflame run`` profile nothing for every user.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "gpuflame"


def test_the_wheel_holds_every_source_and_data_file(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "-w", str(tmp_path), str(ROOT)],
        check=True, capture_output=True, timeout=300,
    )
    wheel = next(tmp_path.glob("gpuflame-*.whl"))
    shipped = set(zipfile.ZipFile(wheel).namelist())
    wanted = {
        "gpuflame/" + p.relative_to(PACKAGE).as_posix()
        for p in PACKAGE.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }
    assert "gpuflame/inject/bootstrap/sitecustomize.py" in wanted
    assert wanted - shipped == set()
