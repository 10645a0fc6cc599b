"""One interval check (``units.interval_seconds``, bounds in ``defaults.py``) at every entry point.

``--interval``, the API's ``interval``, ``GPUFLAME_INTERVAL`` and the webhook's
``gpuflame.io/interval`` all took 0, 1e-10 s and inf; 1e-10 s halved the
program's throughput. Now: the CLI says one line and exits 2, the API raises
ValueError, the in-process reader ignores the value with one line (never
raising into the program), the webhook ignores the annotation with a reason
and still admits the pod.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import gpuflame
from gpuflame.boundary.settings import Settings
from gpuflame.cli.main import main
from gpuflame.defaults import MAX_INTERVAL_S, MIN_INTERVAL_S
from gpuflame.units import interval_seconds
from gpuflame.webhook import admission
from tests.helpers.paths import REPO

ROOT = REPO
SRC = ROOT / "src"
BOOTSTRAP = SRC / "gpuflame" / "inject" / "bootstrap"
TOO_SHORT = ("0.0000000001s", "0.0000000001", "99ms")
TOO_LONG = ("25h", "100000000000000000000")
UNREADABLE = ("inf", "nan", "1e-10", "-5s")


def test_the_bounds_are_the_documented_ones() -> None:
    assert (interval_seconds("100ms"), interval_seconds("24h"), interval_seconds("0")) == (
        MIN_INTERVAL_S,
        MAX_INTERVAL_S,
        0.0,
    )
    for value in (1e-10, float("inf"), float("nan"), MAX_INTERVAL_S * 2, -1.0, True):
        with pytest.raises(ValueError):
            interval_seconds(value)
    with pytest.raises(ValueError, match="out of range: from 100ms to 24h$"):
        interval_seconds("0", allow_off=False)


@pytest.mark.parametrize("value", TOO_SHORT + TOO_LONG + UNREADABLE)
def test_run_refuses_an_interval_out_of_bounds_in_one_line(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["run", "--interval", value, "--", "true"])
    assert stop.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "--interval" in line and "Traceback" not in line
    if value in TOO_SHORT + TOO_LONG:
        assert "out of range: from 100ms to 24h, or 0 for only at exit" in line


@pytest.mark.parametrize("value", TOO_SHORT + TOO_LONG + UNREADABLE + ("0",))
def test_the_agent_refuses_a_push_interval_out_of_bounds_in_one_line(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The node agent pushes every --interval: the same bounds, and never 0 (it has no exit write to fall to)."""
    with pytest.raises(SystemExit) as stop:
        main(["agent", "--interval", value, "--duration", "1s"])
    assert stop.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "--interval" in line and "Traceback" not in line


@pytest.mark.parametrize("value", [1e-10, float("inf"), float("nan"), "0.0000000001s", "25h", 90000])
def test_the_api_refuses_an_interval_out_of_bounds(value: object, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUFLAME_INTERVAL", raising=False)
    with pytest.raises(ValueError, match="^interval: "):
        gpuflame.start(interval=value)  # type: ignore[arg-type]
    assert gpuflame.stop() is None  # nothing was started


@pytest.mark.parametrize("raw", ["1e-10", "inf", "nan", "0.00001", "999999999", "-3", "soon"])
def test_the_environment_reader_ignores_a_bad_interval_with_one_line(
    raw: str, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = Settings.from_env({"GPUFLAME_INTERVAL": raw, "GPUFLAME_BACKEND": "jax"})
    assert settings.interval == 0.0 and settings.backend == "jax"  # the rest is still read
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"gpuflame: GPUFLAME_INTERVAL={raw!r} ignored (") and "the default is used" in line
    assert Settings.from_env({"GPUFLAME_INTERVAL": "2.5"}).interval == 2.5
    assert Settings.from_env({"GPUFLAME_INTERVAL": "0"}).interval == 0.0
    assert capsys.readouterr().err == ""


@pytest.mark.subprocess
def test_a_profiled_program_with_an_infinite_interval_runs_as_without_gpuflame(tmp_path: Path) -> None:
    """The bootstrap reads GPUFLAME_INTERVAL=inf inside the program: one line, exit 0, the profile written."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLAME_")}
    env.update(
        PYTHONPATH=f"{BOOTSTRAP}{os.pathsep}{SRC}",
        GPUFLAME_ENABLED="1",
        GPUFLAME_INTERVAL="inf",
        GPUFLAME_SESSION_DIR=str(tmp_path / "s"),
        GPUFLAME_BACKEND="jax",
    )
    done = subprocess.run([sys.executable, "-c", "print('ran')"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout == "ran\n"
    assert "Traceback" not in done.stderr and "Exception" not in done.stderr, done.stderr
    assert [line for line in done.stderr.splitlines() if "GPUFLAME_INTERVAL" in line] == [
        "gpuflame: GPUFLAME_INTERVAL='inf' ignored (not a duration: 'inf' (examples: 15s, 500ms, 2m)); "
        "the default is used"
    ]


@pytest.mark.parametrize("value", ["0", "0.0000000001s", "25h", "inf", "fast", "-5s", "9" * 200, "9" * 300])
def test_the_webhook_ignores_a_bad_interval_annotation_and_admits_the_pod(value: str) -> None:
    jsonpatch = pytest.importorskip("jsonpatch")
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "p",
            "labels": {"gpuflame.io/inject": "true"},
            "annotations": {"gpuflame.io/interval": value},
        },
        "spec": {"containers": [{"name": "main", "image": "x"}]},
    }
    body = {
        "kind": "AdmissionReview",
        "apiVersion": "admission.k8s.io/v1",
        "request": {"uid": "u", "kind": {"kind": "Pod"}, "operation": "CREATE", "object": pod},
    }
    response = admission.review(body)["response"]
    assert response["allowed"] is True
    (warning,) = response["warnings"]
    assert warning.startswith("gpuflame: gpuflame.io/interval: ") and warning.endswith("; ignored")
    assert len(warning) < 200
    patched = jsonpatch.apply_patch(pod, json.loads(base64.b64decode(response["patch"])))
    env = {v["name"]: v.get("value") for v in patched["spec"]["containers"][0]["env"]}
    assert env["GPUFLAME_INTERVAL"] == "15"  # the default push interval
    assert patched["metadata"]["annotations"]["gpuflame.io/ignored"] == warning.removeprefix("gpuflame: ")
