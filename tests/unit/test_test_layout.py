"""The tests' own layout rule (CONTRIBUTING.md): shared test code lives in ``tests/helpers``.

A test module that imports another test module couples two files a
newcomer reads apart, and moving or renaming the one breaks the other; what
both need belongs in the helpers package.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.helpers.paths import REPO, TESTS


def imported_test_modules(path: Path) -> list[str]:
    """Modules named ``test_*`` that *path* imports from."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    names += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    return [m for m in names if m.split(".")[-1].startswith("test_")]


@pytest.mark.slow
def test_no_test_module_imports_another() -> None:
    found = {str(p.relative_to(REPO)): imported_test_modules(p) for p in sorted(TESTS.rglob("*.py"))}
    assert {path: mods for path, mods in found.items() if mods} == {}


def test_the_check_sees_both_forms_of_import(tmp_path: Path) -> None:
    path = tmp_path / "test_x.py"
    path.write_text(
        "from tests.unit.cli.test_view import run\nimport tests.unit.test_api\nfrom tests.helpers import cli\n"
    )
    assert imported_test_modules(path) == ["tests.unit.cli.test_view", "tests.unit.test_api"]
