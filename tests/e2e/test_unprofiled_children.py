"""Processes gpuflame cannot start in are named, with the fix, instead of "no process imported torch or jax".

gpuflame starts through PYTHONPATH: a child started with an environment that
lost it, or any Python run with -I, -E or -S, goes unprofiled. Before, the
run said nothing of them (and blamed the program for never importing torch).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuflame.boundary.contract import BOOTSTRAP_DIR, unprofiled_reason
from gpuflame.inject.payload import install
from tests.helpers.children import SRC, said_lost, webhook_env

PARENT = """\
import subprocess, sys
subprocess.run([sys.executable, "-I", "child.py"], check=True)
for _ in range(2):
    subprocess.run([sys.executable, "child.py"], env={}, check=True)
subprocess.run([sys.executable, "child.py"], check=True)  # inherits the environment: followed
print("parent ok")
"""


def gpuflame_run(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    (cwd / "child.py").write_text("print('child ok')\n")
    (cwd / "parent.py").write_text(PARENT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLAME_")} | {"PYTHONPATH": SRC}
    return subprocess.run(
        [sys.executable, "-m", "gpuflame", "run", *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["python3", "-I", "x.py"], "-I"),
        (["/usr/bin/python3.12", "-sE", "x.py"], "-E"),
        (["python", "-W", "ignore", "-S", "x.py"], "-S"),
        (["python", "-Xdev", "-I", "-m", "m"], "-I"),
        (["python", "-c", "pass", "-I"], ""),  # the program's own arguments
        (["python", "x.py", "-E"], ""),
        (["bash", "-I"], ""),  # not Python: taken on trust
    ],
)
def test_the_interpreter_flags_that_skip_the_bootstrap(argv, flag):
    reason = unprofiled_reason(argv, {"PYTHONPATH": BOOTSTRAP_DIR})
    assert (f"start it without {flag}" in reason) if flag else reason == ""


def test_an_environment_without_the_bootstrap():
    assert "pass the environment on" in unprofiled_reason(["python", "x.py"], {"PYTHONPATH": "/elsewhere"})
    assert unprofiled_reason(["python", "x.py"], {"PYTHONPATH": os.pathsep.join(["/a", BOOTSTRAP_DIR])}) == ""


def test_a_pods_bootstrap_is_the_payloads_own():
    pod = {"PYTHONPATH": "/gpuflame/bootstrap:/gpuflame/lib"}
    assert unprofiled_reason(["python", "x.py"], pod, bootstrap="/gpuflame/bootstrap") == ""
    assert "pass the environment on" in unprofiled_reason(["python", "x.py"], {}, bootstrap="/gpuflame/bootstrap")


def test_in_a_pod_only_the_child_that_cannot_be_followed_is_named(tmp_path):
    dest = install(tmp_path / "gpuflame")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLAME_") and k != "PYTHONPATH"}
    env |= webhook_env(dest, tmp_path / "sessions" / "main")
    parent = (
        "import subprocess, sys\nfor flags in ([], ['-I']):\n    subprocess.run([sys.executable, *flags, '-c', ''])\n"
    )
    done = subprocess.run([sys.executable, "-c", parent], env=env, capture_output=True, text=True, timeout=120)
    said = [line for line in done.stderr.splitlines() if "goes unprofiled" in line]
    assert done.returncode == 0 and len(said) == 1 and "start it without -I" in said[0], done.stderr


def test_children_that_cannot_be_followed_are_named_once_each_with_the_fix(tmp_path):
    done = gpuflame_run("--json", "-o", "p.pb.gz", "parent.py", cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.startswith("child ok\n" * 4 + "parent ok\n"), done.stderr
    summary = json.loads(done.stdout.splitlines()[-1])
    assert said_lost(done.stderr) == summary["lost"] and len(summary["lost"]) == 2, done.stderr
    isolated, cleared = summary["lost"]
    assert "a child process goes unprofiled" in isolated and "start it without -I" in isolated
    assert "pass the environment on" in cleared
    assert "imported" not in done.stderr


def test_a_program_run_with_minus_i_is_named(tmp_path):
    done = gpuflame_run("--json", "-o", "c.pb.gz", "--", sys.executable, "-I", "child.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (lost,) = json.loads(done.stdout.splitlines()[-1])["lost"]
    assert lost.startswith("the program goes unprofiled") and "start it without -I" in lost
    assert "imported" not in done.stderr


def test_no_follow_asks_for_unprofiled_children(tmp_path):
    done = gpuflame_run("--json", "--no-follow", "-o", "n.pb.gz", "parent.py", cwd=tmp_path)
    assert done.returncode == 0 and json.loads(done.stdout.splitlines()[-1])["lost"] == [], done.stderr
