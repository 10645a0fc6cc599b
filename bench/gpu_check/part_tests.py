"""tests/gpu under pytest: a plain summary (tests.txt) and a JUnit XML file (tests.xml).

pytest's lines are echoed as they come, so a run stopped at its time limit
still leaves the tests that finished in tests.txt (the driver keeps the part's
last output).
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys

from .common import ROOT, Context, cuda_available, part_env, write_status

NAME = "tests"
FILE = "tests.txt"
FILES = ["tests.txt", "tests.xml"]
TITLE = "tests/gpu under pytest"
LIMIT_S = 110.0
RESULT = re.compile(r"^(tests/gpu/\S+::\S+) (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)")


def pytest_argv(ctx: Context) -> list[str]:
    return [
        sys.executable, "-m", "pytest", "tests/gpu", "-v", "-rA", "-p", "no:cacheprovider",
        "--junitxml", str(ctx.out / "tests.xml"),
    ]  # fmt: skip


def main(ctx: Context) -> None:
    if importlib.util.find_spec("pytest") is None:
        write_status(ctx.out / FILE, TITLE, "skipped: pytest is not installed here")
        return
    argv = pytest_argv(ctx)
    proc = subprocess.Popen(argv, cwd=ROOT, env=part_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        sys.stdout.write(line)
        sys.stdout.flush()
        lines.append(line.rstrip("\n"))
    rc = proc.wait()
    results = [m.groups() for m in map(RESULT.match, lines) if m]
    last = next((ln.strip("= ") for ln in reversed(lines) if ln.startswith("=")), f"pytest exited {rc}")
    counts = {k: sum(1 for _, r in results if r == k) for k in ("PASSED", "FAILED", "ERROR", "SKIPPED")}
    if rc == 0 and counts["PASSED"] == 0 and not cuda_available():
        status = f"skipped: no CUDA ({counts['SKIPPED']} tests collected, all skipped)"
    elif rc == 0:
        status = f"ok: {last}"
    else:
        status = f"failed: pytest exited {rc}: {last}"
    summary = "\n".join(f"{r:8} {t}" for t, r in results)
    short = [ln for ln in lines if ln.startswith(("FAILED ", "ERROR ", "SKIPPED "))]
    body = f"command: {' '.join(argv[1:])}\n\n## per test\n\n{summary}\n\n## pytest's short summary\n\n" + "\n".join(
        short
    )
    failures = _failure_text(lines) if rc else ""
    write_status(ctx.out / FILE, TITLE, status, body + (f"\n\n## failures\n\n```\n{failures}\n```" if failures else ""))


def _failure_text(lines: list[str], keep: int = 300) -> str:
    """The FAILURES/ERRORS section of pytest's output, its last *keep* lines."""
    start = next((i for i, ln in enumerate(lines) if re.match(r"^=+ (FAILURES|ERRORS) =+$", ln)), len(lines))
    return "\n".join(lines[start:][-keep:])
