"""A distributed job's process is named by its rank, and describes itself for the table per process.

The launchers' variables have one owner (``boundary/ranks.py``); the
session puts its labels on every sample and timeline series, the node agent
reads them from ``/proc/PID/environ`` of a real process, the Pyroscope push
makes them series labels; each process's own peak and command line ride
in its profile (``model/processes.py``) and through a merge.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuflame.agent import procs
from gpuflame.boundary.ranks import rank_labels
from gpuflame.boundary.settings import Settings
from gpuflame.capture.session import Session
from gpuflame.formats import dumps, load, loads
from gpuflame.model import Profile, merge
from gpuflame.model.processes import MAX_ARGS, PREFIX, ProcessInfo, bounded_argv, to_comment
from gpuflame.ship.pyroscope import split_series
from tests.helpers.standin_recorder import StandInRecorder


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8"}, {"rank": "3", "local_rank": "1", "world_size": "8"}),
        (  # torchrun inside an srun allocation: torchrun's rank, not the SLURM task that started torchrun
            {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "SLURM_PROCID": "1", "SLURM_NTASKS": "2"},
            {"rank": "5", "local_rank": "1", "world_size": "8"},
        ),
        (
            {"SLURM_PROCID": "2", "SLURM_LOCALID": "0", "SLURM_NTASKS": "4"},
            {"rank": "2", "local_rank": "0", "world_size": "4"},
        ),
        (
            {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"},
            {"rank": "1", "local_rank": "1", "world_size": "2"},
        ),
        ({"PMI_RANK": "0", "PMI_SIZE": "2"}, {"rank": "0", "world_size": "2"}),
        ({"LOCAL_RANK": "1", "WORLD_SIZE": "2"}, {"rank": "1", "local_rank": "1", "world_size": "2"}),  # Lightning
        ({"LOCAL_RANK": "1", "NODE_RANK": "0", "WORLD_SIZE": "4"}, {"rank": "1", "local_rank": "1", "world_size": "4"}),
        ({"LOCAL_RANK": "1", "NODE_RANK": "1", "WORLD_SIZE": "4"}, {"local_rank": "1", "world_size": "4"}),
        ({"RANK": "01"}, {"rank": "1"}),
        ({"RANK": "-1", "WORLD_SIZE": "2"}, {}),  # not a rank: nothing (and no SLURM fallback to mislead)
        ({"RANK": "1e9"}, {}),
        ({"RANK": "1" * 12}, {}),
        ({"PATH": "/bin"}, {}),
    ],
)
def test_rank_labels_from_each_launcher(env: dict[str, str], expected: dict[str, str]) -> None:
    assert rank_labels(env) == expected


def session(tmp_path: Path) -> Session:
    return Session(Settings(session_dir=str(tmp_path)))


def test_every_sample_and_series_carries_the_rank_and_the_process_describes_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)
    s = session(tmp_path)
    s.add(StandInRecorder())
    s.finish()
    p = load(s.path)
    wanted = {("pid", str(os.getpid())), ("rank", "1"), ("local_rank", "1"), ("world_size", "2")}
    assert p.samples and all(wanted <= set(x.labels) for x in p.samples)
    assert [info.pid for info in p.processes] == [str(os.getpid())]
    info = p.processes[0]
    assert (info.rank, info.local_rank, info.world_size) == ("1", "1", "2")
    assert info.argv == bounded_argv(sys.orig_argv)  # a pytest command line may pass MAX_ARGS words (the rule: below)
    assert info.peak == p.totals()["peak_space"] == 4096


def test_a_process_without_a_rank_has_no_rank_label(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        monkeypatch.delenv(name, raising=False)
    s = session(tmp_path)
    s.add(StandInRecorder())
    s.finish()
    p = load(s.path)
    assert p.label_keys() == sorted({"pid", *p.label_keys()} - {"rank", "local_rank", "world_size"})
    assert p.processes[0].rank == ""


@pytest.mark.subprocess
def test_the_agent_reads_the_rank_a_launcher_gave_a_real_process() -> None:
    env = {"PATH": os.environ.get("PATH", "/usr/bin"), "RANK": "7", "LOCAL_RANK": "3", "WORLD_SIZE": "16"}
    script = "import sys; print('ready', flush=True); sys.stdin.read()"
    child = subprocess.Popen([sys.executable, "-c", script], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"ready\n"  # exec'd: its own environment
        assert procs.ranks(child.pid) == {"rank": "7", "local_rank": "3", "world_size": "16"}
    finally:
        child.communicate(b"")
    assert procs.ranks(child.pid) == {}  # gone: nothing, no error


def test_the_agent_reads_a_bounded_environment(tmp_path: Path) -> None:
    """A hostile environment of many megabytes is read up to its bound: a rank past it is not seen."""
    fake = tmp_path / "proc" / "42"
    fake.mkdir(parents=True)
    (fake / "environ").write_bytes(b"RANK=1\0WORLD_SIZE=2\0")
    assert procs.ranks(42, proc=str(tmp_path / "proc")) == {"rank": "1", "world_size": "2"}
    (fake / "environ").write_bytes(b"X=" + b"y" * procs.ENVIRON_BYTES + b"\0RANK=1\0")
    assert procs.ranks(42, proc=str(tmp_path / "proc")) == {}


def test_the_pyroscope_push_makes_the_rank_a_series_label() -> None:
    p = Profile(sample_types=[("inuse_space", "bytes")])
    p.add([], [10], {"pid": "1", "rank": "0", "world_size": "2"})
    p.add([], [20], {"pid": "2", "rank": "1", "world_size": "2"})
    series = sorted((labels["rank"], part.totals()["inuse_space"]) for labels, part in split_series(p, {}))
    assert series == [("0", 10), ("1", 20)]


def test_processes_ride_in_the_file_and_through_a_merge_one_per_pid() -> None:
    a, b = (Profile(sample_types=[("inuse_space", "bytes")]) for _ in range(2))
    a.processes = [ProcessInfo("20", rank="1", argv=("python", "my train.py"), peak=5, peak_ns=7)]
    b.processes = [ProcessInfo("10", rank="0", world_size="2", peak=9, devices=("cpu",))]
    merged = loads(dumps(merge([a, b])))
    assert merged.processes == [b.processes[0], a.processes[0]]  # by rank
    assert merged.processes[1].command() == 'python "my train.py"'
    assert not any(c.startswith(PREFIX) for c in merged.comments)


@pytest.mark.parametrize(
    "payload",
    ['{"pid":"1"}', '[{"rank":"1"}]', '[{"pid":1}]', "[", '[{"pid":"1x"}]'],
)
def test_a_damaged_process_list_is_left_out_with_a_note(payload: str) -> None:
    p = Profile(sample_types=[("inuse_space", "bytes")], comments=[PREFIX + payload])
    back = loads(dumps(p))
    assert back.processes == []
    assert back.comments == ["the description of this profile's processes is damaged and was left out"]


def test_a_hostile_entry_keeps_only_what_it_may() -> None:
    entry = '[{"pid":"3","rank":"x","peak":-4,"peak_ns":"5","argv":' + str(["a"] * 1000).replace("'", '"') + "}]"
    back = loads(dumps(Profile(sample_types=[("inuse_space", "bytes")], comments=[PREFIX + entry])))
    assert back.processes == [ProcessInfo("3", argv=bounded_argv(["a"] * 1000))]
    assert len(back.processes[0].argv) == MAX_ARGS + 1 and back.processes[0].argv[-1] == f"… ({1000 - MAX_ARGS} more)"
    assert to_comment(back.processes).startswith(PREFIX)
