"""The init container's payload: installed into an empty folder, it starts the profiler
in a fresh Python process that finds gpuflame only through PYTHONPATH, with the
environment the webhook gives a container."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

from gpuflame.errors import GpuflameError
from gpuflame.formats import load
from gpuflame.inject.payload import install, main
from tests.helpers.children import webhook_env

SCRIPT = """
import sys
sys.path.append({site!r})  # torch from the test's venv, with none of its .pth files (so no gpuflame)
import gpuflame, torch
assert gpuflame.__file__.startswith({lib!r}), gpuflame.__file__
from gpuflame.capture.autostart import current_session
assert current_session() is not None, "profiler not started"

def payload_allocation():
    return torch.empty(3 * 1024 * 1024, dtype=torch.uint8)

held = payload_allocation()
print("OK", gpuflame.__file__)
"""


def assert_recorded_the_workload(sessions: Path) -> None:
    """The one process wrote its profile, holding the workload's 3 MiB under its own function."""
    [profile_file] = sessions.glob("proc-*.pb.gz")
    profile = load(str(profile_file))
    names = {profile.frames[i].name for s in profile.samples for i in s.stack}
    assert "payload_allocation" in names
    assert max(profile.totals().values()) >= 3 * 1024 * 1024


def test_install_lays_out_lib_bootstrap_sessions(tmp_path: Path) -> None:
    dest = install(tmp_path / "gpuflame")
    assert (dest / "bootstrap" / "sitecustomize.py").is_file()
    assert (dest / "lib" / "gpuflame" / "capture" / "autostart.py").is_file()
    assert (dest / "lib" / "gpuflame" / "ship" / "pyroscope.py").is_file()
    assert (dest / "lib" / "gpuflame" / "boundary" / "settings.py").is_file()  # both sides' contract
    assert (dest / "lib" / "gpuflame" / "capture" / "recorders" / "allocator" / "native" / "cpu_hook.cpp").is_file()
    assert (dest / "sessions").stat().st_mode & 0o1777 == 0o1777
    assert not list(dest.rglob("*.new"))


@pytest.mark.slow
def test_install_is_idempotent(tmp_path: Path) -> None:
    install(tmp_path)
    (tmp_path / "lib" / "gpuflame" / "stale.py").write_text("x = 1\n")
    install(tmp_path)
    assert not (tmp_path / "lib" / "gpuflame" / "stale.py").exists()
    assert (tmp_path / "lib" / "gpuflame" / "__init__.py").is_file()


def test_unwritable_dest_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(GpuflameError, match="cannot install the gpuflame payload"):
        install(blocker / "dest")
    assert main([str(blocker / "dest")]) == 1
    assert "error: cannot install" in capsys.readouterr().err
    assert main([]) == 2


@pytest.mark.subprocess
@pytest.mark.slow
def test_payload_starts_the_profiler_in_a_fresh_process(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    dest = install(tmp_path / "gpuflame")
    sessions = tmp_path / "session"  # not made: the process makes its own, as in the pod
    site = sysconfig.get_paths()["purelib"]
    script = tmp_path / "workload.py"
    script.write_text(textwrap.dedent(SCRIPT).format(site=site, lib=str(dest / "lib")))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUFLAME_", "PYTHON", "VIRTUAL_ENV"))}
    env.update(webhook_env(dest, sessions))
    assert env["PYTHONPATH"] == f"{dest}/bootstrap:{dest}/lib"
    # the base interpreter, not the venv's: the venv's site-packages would put gpuflame on the path
    python = getattr(sys, "_base_executable", sys.executable)
    result = subprocess.run(
        [python, "-s", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240
    )
    assert result.returncode == 0, result.stderr
    assert "gpuflame:" not in result.stderr, result.stderr
    assert_recorded_the_workload(sessions)


@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.parametrize("hook", ["allocator", "dispatch"])
def test_the_payload_records_on_a_bare_interpreter_with_numpy_and_rich_blocked(tmp_path: Path, hook: str) -> None:
    """The payload ships no dependency: its bootstrap, started after a block on numpy and rich, still records."""
    pytest.importorskip("torch")
    from tests.helpers.blocking import BLOCK

    dest = install(tmp_path / "gpuflame")
    sessions = tmp_path / "session"
    script = tmp_path / "workload.py"
    script.write_text(textwrap.dedent(SCRIPT).format(site=sysconfig.get_paths()["purelib"], lib=str(dest / "lib")))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUFLAME_", "PYTHON", "VIRTUAL_ENV"))}
    env.update(webhook_env(dest, sessions), GPUFLAME_TORCH_HOOK=hook)
    # -S: no site, so the bootstrap's sitecustomize runs where this says, after the block
    start = (
        BLOCK + f"\nimport sitecustomize, runpy\nrunpy.run_path({str(script)!r}, run_name='__main__')\n"
        "print('BY_GPUFLAME', [a for a in attempts if ' -> ' in a])\n"
    )  # torch's own tries are its business
    python = getattr(sys, "_base_executable", sys.executable)
    result = subprocess.run(
        [python, "-S", "-s", "-c", start], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "BY_GPUFLAME []", result.stdout
    assert "gpuflame:" not in result.stderr, result.stderr
    assert_recorded_the_workload(sessions)
