"""A row per process of a profile, and how uneven their peaks were (model/process_table.py)."""

from __future__ import annotations

from gpuflame.model import Frame, Profile, memory_sample_types
from gpuflame.model.process_table import process_rows, uneven
from gpuflame.model.processes import ProcessInfo

F = [Frame("forward", "m.py", 3)]


def profile_of(*rows: tuple[str, str, int]) -> Profile:
    """Samples of (pid, category, peak bytes)."""
    p = Profile(sample_types=memory_sample_types(inuse=False, alloc=False))
    for pid, category, peak in rows:
        p.add(F, [peak, 1], {"pid": pid, "device": "cpu", "category": category})
    return p


def test_rows_sum_each_process_by_category_and_sort_by_rank_then_pid() -> None:
    p = profile_of(("30", "parameter", 100), ("30", "gradient", 50), ("10", "parameter", 100), ("20", "other", 7))
    p.processes = [ProcessInfo("30", rank="0", peak=150), ProcessInfo("10", rank="1", peak=400)]
    rows = process_rows(p)
    assert [r.info.pid for r in rows] == ["30", "10", "20"]  # ranked first by rank, then the unranked by pid
    assert rows[0].by_category == [("parameter", 100), ("gradient", 50)] and rows[0].at_joint_peak == 150
    assert rows[2].info == ProcessInfo("20")  # described nothing (another tool's file): still a row


def test_uneven_is_of_the_ranks_and_never_of_unranked_processes() -> None:
    p = profile_of(("1", "x", 1), ("2", "x", 1), ("3", "x", 1))
    p.processes = [
        ProcessInfo("1", rank="0", peak=100),
        ProcessInfo("2", rank="1", peak=300),
        ProcessInfo("3", peak=900),
    ]
    spread = uneven(process_rows(p))
    assert spread is not None and spread.of == "ranks" and spread.ratio == 3.0
    assert (spread.largest.info.pid, spread.smallest.info.pid) == ("2", "1")
    # a main process and its DataLoader workers (no ranks) are no peers: no line
    p.processes = [ProcessInfo("1", peak=100), ProcessInfo("3", peak=900)]
    assert uneven(process_rows(p)) is None


def test_no_spread_under_two_known_peaks() -> None:
    p = profile_of(("1", "x", 1), ("2", "x", 1))
    p.processes = [ProcessInfo("1", rank="0", peak=100)]
    assert uneven(process_rows(p)) is None


def test_a_pid_label_that_is_no_number_stays_text() -> None:
    """Another tool's file may label samples pid=worker-a: its row and JSON keep the text, nothing fails."""
    p = profile_of(("worker-a", "x", 5), ("7", "x", 1))
    rows = process_rows(p)
    assert [r.to_dict()["pid"] for r in rows] == [7, "worker-a"]


def test_a_rank_s_worker_does_not_stand_for_the_rank() -> None:
    """DataLoader workers inherit RANK: rank 0's main process (900 B), not its worker (10 B), is rank 0's peak."""
    p = profile_of(("1", "x", 1), ("2", "x", 1), ("3", "x", 1))
    p.processes = [
        ProcessInfo("1", rank="0", peak=900),
        ProcessInfo("2", rank="1", peak=300),
        ProcessInfo("3", rank="0", peak=10),
    ]
    spread = uneven(process_rows(p))
    assert spread is not None and spread.of == "ranks" and spread.ratio == 3.0
    assert (spread.largest.info.pid, spread.smallest.info.pid) == ("1", "2")


def test_equal_peaks_name_two_processes() -> None:
    """Two ranks with the same peak: the line compares two processes, not one with itself."""
    p = profile_of(("1", "x", 1), ("2", "x", 1))
    p.processes = [ProcessInfo("1", rank="0", peak=1 << 20), ProcessInfo("2", rank="1", peak=1 << 20)]
    spread = uneven(process_rows(p))
    assert spread is not None and spread.ratio == 1.0
    assert {spread.largest.info.pid, spread.smallest.info.pid} == {"1", "2"}


def test_the_report_calls_equal_rank_peaks_even() -> None:
    """report's line under the rank tables: 'Ranks even' at 1.00x, 'Ranks uneven' from 1.01x."""
    from gpuflame.render.process_tables import uneven_line

    for peaks, word in (((1000, 1000), "Ranks even: "), ((1000, 1010), "Ranks uneven: ")):
        p = profile_of(("1", "x", peaks[0]), ("2", "x", peaks[1]))
        p.processes = [ProcessInfo("1", rank="0", peak=peaks[0]), ProcessInfo("2", rank="1", peak=peaks[1])]
        spread = uneven(process_rows(p))
        assert spread is not None and uneven_line(spread).startswith(word)


def test_a_narrow_process_table_keeps_its_own_peak_on_one_line(capsys) -> None:
    """A DataLoader worker's table (0 B at the joint peak) is narrow: its caption wrapped between 1.108 and 's'."""
    from gpuflame.render.console import make_console
    from gpuflame.render.process_tables import process_table

    p = profile_of(("7", "other", 0))
    p.processes = [ProcessInfo("7", peak=2056)]
    row = process_rows(p)[0]
    row.peak_s = 1.108
    make_console().print(process_table(row, joint=True))
    lines = capsys.readouterr().out.splitlines()
    assert any("its own peak: 2.01 KiB, 1.108 s into the strip" in line for line in lines)
