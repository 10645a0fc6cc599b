"""gpuflame run's last lines for a run of several processes: a line per rank, bounded, then the spread."""

from __future__ import annotations

from pathlib import Path

from gpuflame.launch.outcome import MAX_PROCESS_LINES, note_processes, say_where
from gpuflame.launch.store import RunMeta
from gpuflame.model import Frame, Profile, memory_sample_types
from gpuflame.model.processes import ProcessInfo


def ranked_run(count: int) -> Profile:
    """*count* ranks, rank r holding (r + 1) KiB at the joint peak and its own peak."""
    p = Profile(sample_types=memory_sample_types(inuse=False, alloc=False))
    for r in range(count):
        p.add([Frame("train", "t.py", 1)], [(r + 1) * 1024, 1], {"pid": str(100 + r), "rank": str(r), "device": "cpu"})
        p.processes.append(
            ProcessInfo(str(100 + r), rank=str(r), argv=("/venv/bin/python3", "t.py"), peak=(r + 1) * 1024)
        )
    return p


def lines_of(profile: Profile, capsys, tmp_path: Path) -> list[str]:
    meta = RunMeta(command=["torchrun", "t.py"], started=0.0, processes=[int(i.pid) for i in profile.processes])
    meta.totals = profile.totals()
    note_processes(meta, profile)
    say_where(tmp_path / "run.pb.gz", meta, {}, "")
    return capsys.readouterr().err.splitlines()


def test_a_line_per_rank_then_the_spread(capsys, tmp_path: Path) -> None:
    lines = lines_of(ranked_run(2), capsys, tmp_path)
    assert lines[1:4] == [
        "gpuflame: rank 0 (pid 100): own peak 1.00 KiB, 1.00 KiB at the joint peak: python3 t.py",
        "gpuflame: rank 1 (pid 101): own peak 2.00 KiB, 2.00 KiB at the joint peak: python3 t.py",
        "gpuflame: ranks uneven: rank 1 (pid 101) peaked at 2.00 KiB, rank 0 (pid 100) at 1.00 KiB: "
        "the largest peak is 2.00x the smallest",
    ]


def test_many_ranks_are_bounded_and_the_rest_counted(capsys, tmp_path: Path) -> None:
    lines = lines_of(ranked_run(MAX_PROCESS_LINES + 5), capsys, tmp_path)
    ranks = [line for line in lines if line.startswith("gpuflame: rank ")]
    assert len(ranks) == MAX_PROCESS_LINES
    assert "gpuflame: ... 5 more processes: see gpuflame report" in lines
    assert any(line.startswith("gpuflame: ranks uneven: rank 20 (pid 120)") for line in lines)


def test_one_process_without_a_rank_gets_no_line(capsys, tmp_path: Path) -> None:
    p = ranked_run(1)
    p.processes = [ProcessInfo("100", peak=1024)]
    assert not [line for line in lines_of(p, capsys, tmp_path) if "pid 100" in line]


def test_a_counted_process_that_held_nothing_is_named(capsys, tmp_path: Path) -> None:
    """torchrun's launcher records and allocates nothing: the run counts it, so a line names it."""
    p = ranked_run(2)
    meta = RunMeta(command=["torchrun", "t.py"], started=0.0, processes=[99, 100, 101])
    meta.totals = p.totals()
    note_processes(meta, p)
    say_where(tmp_path / "run.pb.gz", meta, {}, "")
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("gpuflame: profile of 3 processes")
    assert "gpuflame: pid 99: recorded, but held no memory at any moment (a launcher, a worker given no task)" in (
        lines
    )
    assert not [line for line in lines_of(ranked_run(2), capsys, tmp_path) if "held no memory" in line]


def test_ranks_with_equal_peaks_are_said_even_not_uneven(capsys, tmp_path: Path) -> None:
    """Two DDP ranks with the same 641.5 KiB peak were said 'ranks uneven: ... 1.00x the smallest'."""
    p = Profile(sample_types=memory_sample_types(inuse=False, alloc=False))
    for r, peak in enumerate([656_896, 656_900]):  # 4 B apart: 1.00x as printed
        p.add([Frame("train", "t.py", 1)], [peak, 1], {"pid": str(100 + r), "rank": str(r), "device": "cpu"})
        p.processes.append(ProcessInfo(str(100 + r), rank=str(r), argv=("python3", "t.py"), peak=peak))
    spread = [line for line in lines_of(p, capsys, tmp_path) if "the largest peak is" in line]
    assert spread == [
        "gpuflame: ranks even: rank 1 (pid 101) peaked at 641.5 KiB, rank 0 (pid 100) at 641.5 KiB: "
        "the largest peak is 1.00x the smallest"
    ]


def test_a_jax_process_whose_samples_saw_nothing_is_not_said_to_have_held_nothing(capsys, tmp_path: Path) -> None:
    """JAX samples live buffers: a worker that made and freed its arrays between samples held memory."""
    p = Profile(sample_types=memory_sample_types(alloc=False))  # the jax recorder's types
    for pid in ("100", "101"):
        p.add([Frame("step", "t.py", 1)], [1024, 1, 1024, 1], {"pid": pid, "device": "cpu:0"})
    meta = RunMeta(command=["python3", "t.py"], started=0.0, processes=[99, 100, 101])
    meta.totals = p.totals()
    note_processes(meta, p)
    say_where(tmp_path / "run.pb.gz", meta, {}, "")
    lines = capsys.readouterr().err.splitlines()
    assert not [line for line in lines if "held no memory" in line]
    (said,) = [line for line in lines if line.startswith("gpuflame: pid 99:")]
    assert "no live buffers at any sample" in said and "between samples are not seen" in said
