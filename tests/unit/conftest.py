"""Unit tests run in this process: one that starts a subprocess must say so.

`make test-fast` runs ``tests/unit -m "not subprocess"``; this guard keeps
that lane honest. A test that needs a child process (a real `gpuflame run`,
a fresh interpreter) is marked ``@pytest.mark.subprocess``, or lives in
tests/e2e/.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _no_unmarked_subprocess(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    if request.node.get_closest_marker("subprocess") is not None:
        yield
        return

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(
            "this unit test starts a subprocess: mark it @pytest.mark.subprocess or move it to tests/e2e/"
        )

    monkeypatch.setattr(subprocess.Popen, "_execute_child", refuse)
    monkeypatch.setattr(os, "fork", refuse)
    monkeypatch.setattr(os, "posix_spawn", refuse)
    yield
