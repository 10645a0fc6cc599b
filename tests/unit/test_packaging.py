"""The wheel ships every file of the package, the launcher's bootstrap included.

An editable install (what the tests run on) finds any file under src/; a
wheel only holds what the build configuration names. A bootstrap missing
from the wheel would make ``gpuflame run`` profile nothing for every user.
"""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.helpers.paths import REPO

ROOT = REPO
PACKAGE = ROOT / "src" / "gpuflame"


@pytest.mark.subprocess
def test_the_wheel_holds_every_source_and_data_file(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=300,
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


def test_the_version_is_written_in_one_place_and_every_image_tag_follows_it() -> None:
    """pyproject reads gpuflame/version.py; the manifests and the Dockerfile name the same tag."""
    import re

    import gpuflame
    from gpuflame.webhook.patch import DEFAULT_IMAGE

    root = REPO
    pyproject = (root / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in pyproject and 'version = {attr = "gpuflame.version.__version__"}' in pyproject
    from gpuflame.version import __version__

    assert gpuflame.__version__ is __version__
    assert DEFAULT_IMAGE.endswith(":" + gpuflame.__version__)
    import yaml

    tags = set()
    for path in [root / "Dockerfile", *root.glob("deploy/kubernetes/**/*.yaml")]:
        text = path.read_text()
        tags |= set(re.findall(r"ghcr\.io/gpuflame/gpuflame[-a-z]*:([0-9][^\s\"']*)", text))
        if path.name == "kustomization.yaml":
            images = (yaml.safe_load(text) or {}).get("images") or []
            tags |= {str(i["newTag"]) for i in images if "gpuflame" in i.get("name", "") and "newTag" in i}
    assert tags == {gpuflame.__version__}, tags
    newest = re.search(r"^## \[([^\]]+)\]", (root / "CHANGELOG.md").read_text(), re.MULTILINE)
    assert newest and newest.group(1) == gpuflame.__version__  # the changelog's newest heading


def test_make_lint_runs_ruff_the_format_check_and_mypy_and_ci_runs_it() -> None:
    root = REPO
    lint = root.joinpath("Makefile").read_text().split("\nlint:", 1)[1].split("\n\n", 1)[0]
    assert "ruff check" in lint and "ruff format --check" in lint and "mypy" in lint
    assert "make lint" in root.joinpath(".ci", "run").read_text()
    pyproject = root.joinpath("pyproject.toml").read_text()
    assert "[tool.mypy]" in pyproject and '"mypy==' in pyproject and '"ruff==' in pyproject


def test_the_readme_names_every_runtime_dependency() -> None:
    """README's Install said gpuflame 'needs only rich and numpy of its own'; pip installs protobuf too (a trial)."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[<>=!~ \[;]", d, maxsplit=1)[0].lower() for d in deps}
    sentence = next(line for line in (ROOT / "README.md").read_text().splitlines() if "needs only" in line)
    assert names and {n for n in names if f"`{n}`" not in sentence} == set(), sentence
