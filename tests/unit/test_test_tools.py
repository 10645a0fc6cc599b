"""The suite's own set-up: one script installs the tools, and a run says what it skipped.

`make test` and CI's `.ci/run` reach the same `.ci/install-tools`; where it cannot install
(not root, no apt-get) it names what is missing, and the suite's summary repeats it with
the skips grouped by reason.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytest_plugins = ("pytester",)

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / ".ci" / "install-tools"


def test_make_test_and_ci_install_through_the_one_script() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^test: .*\btools\b", makefile, re.M), "make test must install the tools first"
    assert re.search(r"^tools:\n\t@?sh \.ci/install-tools$", makefile, re.M)
    ci = (ROOT / ".ci" / "run").read_text()
    assert "apt-get" not in ci, "CI installs through make test's script, not its own list"
    assert "make test" in ci


def bare_path(tmp_path: Path) -> str:
    """A PATH with only what the script itself runs: every tool it checks for is missing."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sh", "ls", "id", "tr", "sort", "printf", "echo"):
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    return str(bin_dir)


@pytest.mark.subprocess
def test_check_names_each_missing_tool_with_the_tests_it_costs(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": bare_path(tmp_path)}
    done = subprocess.run(
        ["/bin/sh", str(SCRIPT), "--check"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "chromium: tests/browser/" in out
    assert "kubectl: tests/deploy/" in out
    assert "go: tests/unit/formats" in out
    assert out.rstrip().endswith("'make tools' installs them (sh .ci/install-tools)")
    assert "installing" not in out, "--check installs nothing"


@pytest.mark.subprocess
def test_the_summary_groups_skips_by_reason_and_names_the_missing_tools(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    pytester.makeconftest(
        f"import sys\nsys.path.insert(0, {str(ROOT)!r})\nfrom tests.conftest import pytest_terminal_summary\n"
    )
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.parametrize("n", range(3))
        def test_browser(n):
            pytest.skip("no chromium installed (apt-get install chromium)")

        def test_agent():
            pytest.skip("the agent needs root (BPF and uprobes)")

        def test_runs():
            assert True
        """
    )
    with pytest.MonkeyPatch.context() as patch:  # the script, run by the child, sees a bare PATH
        patch.setenv("PATH", bare_path(tmp_path))
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, skipped=4)
    result.stdout.fnmatch_lines(
        [
            "*4 skipped, by reason*",
            "    3  no chromium installed (apt-get install chromium)",
            "    1  the agent needs root (BPF and uprobes)",
            "tools: missing here, so these tests will skip:",
            "*chromium: tests/browser/*",
        ]
    )
