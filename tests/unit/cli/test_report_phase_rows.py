"""``report``'s by-phase table: which rank each row is in a multi-process run, and whether its peak is exact.

``samples`` is JAX's field (how many samples of live buffers its peak is the
largest of); the torch backends see every allocation and had it read 0 with
no word: ``exact`` says which. A merged run's rows carry each process's rank
where it said one (model/processes.py), in ``--json`` and as a column.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuflame.formats import save
from gpuflame.model import Frame, Profile, memory_sample_types
from gpuflame.model.phases import PhaseStat
from gpuflame.model.processes import ProcessInfo
from tests.helpers.cli import run, run_json

T0 = 1_767_225_600_000_000_000


def two_ranks() -> Profile:
    """Two processes (rank 1 has the lower pid) each with a phase row; a third process with none."""
    p = Profile(sample_types=memory_sample_types(inuse=False, alloc=False))
    for pid in ("700", "800", "900"):
        p.add([Frame("step", "train.py", 3)], [1000, 1], {"pid": pid, "device": "cpu"})
    p.processes = [ProcessInfo("700", rank="1"), ProcessInfo("800", rank="0"), ProcessInfo("900")]
    p.phases = [
        PhaseStat("train", "cpu", "700", T0, T0 + 10**9, 5000, T0 + 5, 1000, "step", 5000, 0),
        PhaseStat("train", "cpu", "800", T0, T0 + 10**9, 7000, T0 + 6, 1000, "step", 7000, 0),
        PhaseStat("train", "cpu", "900", T0, T0 + 10**9, 900, 0, 100, "step", 900, 0, samples=3),
    ]
    return p


def test_json_rows_say_their_rank_and_whether_exact(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    save(two_ranks(), tmp_path / "m.pb.gz")
    rows = run_json(capsys, "report", tmp_path / "m.pb.gz")["by_phase"]
    got = {r["pid"]: (r["rank"], r["exact"], r["samples"]) for r in rows}
    assert got == {"700": (1, True, 0), "800": (0, True, 0), "900": (None, False, 3)}


def test_the_table_has_a_rank_column_where_processes_have_ranks(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    save(two_ranks(), tmp_path / "m.pb.gz")
    rc, out, err = run(capsys, "report", tmp_path / "m.pb.gz")
    assert rc == 0, err
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("By phase"))
    header = lines[start + 1].split()
    assert header[:4] == ["phase", "rank", "pid", "device"], header
    rows = {tuple(line.split()[:4]) for line in lines[start + 3 : start + 6]}
    # the unranked process: an empty rank cell
    assert rows == {("train", "1", "700", "cpu"), ("train", "0", "800", "cpu"), ("train", "900", "cpu", "0.000s")}


def test_one_process_without_ranks_keeps_the_short_table(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    p = two_ranks()
    p.processes = []
    save(p, tmp_path / "m.pb.gz")
    rc, out, _ = run(capsys, "report", tmp_path / "m.pb.gz")
    header = next(line for line in out.splitlines() if line.lstrip().startswith("phase"))
    assert rc == 0 and "rank" not in header.split() and "pid" in header.split()


def test_a_real_torch_recording_s_phases_are_exact(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    import gpuflame
    from gpuflame.capture.books import phases
    from tests.helpers.torch_helpers import RECORDERS

    rec = RECORDERS["dispatch"]()
    rec.start()
    try:
        with gpuflame.phase("load"):
            kept = torch.zeros(1024)
    finally:
        rec.stop()
        phases.switch(0)
    save(rec.snapshot(), tmp_path / "t.pb.gz")
    rows = {r["phase"]: r for r in run_json(capsys, "report", tmp_path / "t.pb.gz")["by_phase"]}
    assert rows["load"]["exact"] is True and rows["load"]["samples"] == 0
    assert rows["load"]["peak"] == kept.numel() * kept.element_size()
