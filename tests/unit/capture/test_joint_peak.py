"""A merged peak is a moment that happened, or says precisely what it is instead.

Issue 10, item 3: a parent holding 4,000,000 B and two 2,000,000 B children
run one after the other never held more than 6,000,000 B, yet summing each
process's own peak said 8,000,000 B "live at the moment of the highest
total". These tests run real programs under ``gpuflame run`` (both torch
recorders; spawn, fork and forkserver children), real ``gpuflame.profile()``
windows, and the merge itself on profiles built by hand.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

import gpuflame
from gpuflame.formats import load, save
from gpuflame.model import Frame, Profile, merge
from gpuflame.model.peak import BOUND, JOINT, MAX, PARTIAL, PROCESS, SAMPLED, PeakUnit, is_exact
from gpuflame.model.sample_types import JOINT_PEAK_OBJECTS, JOINT_PEAK_SPACE, memory_sample_types
from tests.helpers.cli import run as cli
from tests.helpers.run_cli import gpuflame_run, write

MB = 1_000_000
SINGLE_MOMENT = "live at the moment of the highest total"


def peak_by(profile: Profile, key: str) -> dict[str, int]:
    """peak_space bytes per value of one label, or per leaf function name (key 'leaf')."""
    index = profile.type_index("peak_space")
    out: dict[str, int] = {}
    for s in profile.samples:
        if s.values[index]:
            k = profile.frames[s.stack[0]].name if key == "leaf" else s.label(key) or ""
            out[k] = out.get(k, 0) + s.values[index]
    return out


# -- through gpuflame run: real processes, real torch ------------------------------

SEQUENTIAL = """
import multiprocessing as mp, os, sys, torch

def child_block(n):
    return torch.empty(n, dtype=torch.uint8)

def child():
    x = child_block(2_000_000)
    del x

def parent_block(n):
    return torch.empty(n, dtype=torch.uint8)

if __name__ == "__main__":
    ctx = mp.get_context(sys.argv[1])
    held = parent_block(4_000_000)
    pids = []
    for _ in range(2):
        p = ctx.Process(target=child)
        p.start()
        p.join()
        pids.append(p.pid)
    print("pids", os.getpid(), *pids, flush=True)
"""

OVERLAPPING = """
import multiprocessing as mp, os, sys, torch

def first(n):
    return torch.empty(n, dtype=torch.uint8)

def second(n):
    return torch.empty(n, dtype=torch.uint8)

def child(barrier, big):
    x = first(2_000_000)
    barrier.wait()   # both children hold 2 MB while the parent holds 4 MB: 8 MB, the run's peak
    barrier.wait()
    del x
    barrier.wait()   # both freed
    if big:
        y = second(3_000_000)   # 4 + 3 = 7 MB: this child's own peak, not the run's
        del y

def parent_block(n):
    return torch.empty(n, dtype=torch.uint8)

if __name__ == "__main__":
    ctx = mp.get_context(sys.argv[1])
    held = parent_block(4_000_000)
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=child, args=(barrier, big)) for big in (True, False)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    print("pids", os.getpid(), *(p.pid for p in procs), flush=True)
"""


def run_script(tmp_path: Path, source: str, hook: str, method: str) -> tuple[Profile, list[int]]:
    script = write(tmp_path / "job.py", source)
    result = gpuflame_run("--torch-hook", hook, "-o", "run.pb.gz", script.name, method, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    pids = [int(w) for w in result.stdout.strip().splitlines()[-1].split()[1:]]
    return load(tmp_path / "run.pb.gz"), pids


def header(out: str) -> str:
    """The report's title lines (type, total, what the peak is), as one line whatever the terminal width."""
    return " ".join(out.split("note:")[0].split("Totals")[0].split())


@pytest.mark.subprocess
@pytest.mark.parametrize(
    ("hook", "method"), [("allocator", "spawn"), ("allocator", "fork"), ("dispatch", "forkserver")]
)
def test_children_one_after_the_other_peak_at_6_not_8_mb(tmp_path: Path, capsys, hook: str, method: str) -> None:
    profile, (parent, first, second) = run_script(tmp_path, SEQUENTIAL, hook, method)
    assert profile.totals()["peak_space"] == 6 * MB
    # what was live at that moment, and in which process: the parent's block and ONE child's
    assert peak_by(profile, "pid") == {str(parent): 4 * MB, str(first): 2 * MB}
    assert peak_by(profile, "leaf") == {"parent_block": 4 * MB, "child_block": 2 * MB}
    assert [u.kind for u in profile.peaks] == [JOINT] and profile.peaks[0].processes == 3
    assert JOINT_PEAK_SPACE.type not in profile.type_names()
    # each process's own file keeps its own exact peak
    own = {
        pid: load(tmp_path / f"run.pb.gz.processes/proc-{pid}.pb.gz").totals()["peak_space"]
        for pid in (parent, first, second)
    }
    assert own == {parent: 4 * MB, first: 2 * MB, second: 2 * MB}
    if method == "fork":
        report_says_one_moment_of_the_run(tmp_path / "run.pb.gz", parent, capsys)


@pytest.mark.subprocess
@pytest.mark.parametrize(("hook", "method"), [("allocator", "forkserver"), ("dispatch", "fork")])
def test_children_at_the_same_time_peak_at_their_real_joint_total(tmp_path: Path, hook: str, method: str) -> None:
    profile, (parent, big, small) = run_script(tmp_path, OVERLAPPING, hook, method)
    # own peaks 4 + 7 - 4 + 2 would sum to 9 MB; together they held 8 MB at most
    assert profile.totals()["peak_space"] == 8 * MB
    assert peak_by(profile, "pid") == {str(parent): 4 * MB, str(big): 2 * MB, str(small): 2 * MB}
    assert peak_by(profile, "leaf") == {"parent_block": 4 * MB, "first": 4 * MB}  # not `second`
    # the big child's own peak (7 MB) was another moment; its blocks at the joint one keep their own categories
    assert {s.label("category") for s in profile.samples if s.values[profile.type_index("peak_space")]} == {"other"}


def report_says_one_moment_of_the_run(path: Path, parent: int, capsys) -> None:
    rc, out, err = cli(capsys, "report", path)
    assert rc == 0, err
    title = header(out)
    assert "peak_space 5.72 MiB live at one moment: the highest total of the 3 processes on cpu together" in title
    data = json.loads(cli(capsys, "report", path, "--json")[1])
    assert data["total"] == 6 * MB
    assert data["peak"]["exact"] is True and data["peak"]["devices"][0]["kind"] == JOINT
    one = json.loads(cli(capsys, "report", path, "--json", "--label", f"pid={parent}")[1])
    assert one["total"] == 4 * MB and one["peak"]["description"].startswith(f"pid {parent}'s share of one moment")


CHURN = """
import multiprocessing as mp, os, random, sys, threading, torch

def churn(seed):
    r = random.Random(seed)
    keep = []
    for _ in range(1500):
        if keep and r.random() < 0.5:
            keep.pop(r.randrange(len(keep)))
        else:
            keep.append(torch.empty(r.randrange(1, 200_000), dtype=torch.uint8))

def proc(seed):
    threads = [threading.Thread(target=churn, args=(seed * 10 + i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

if __name__ == "__main__":
    ctx = mp.get_context(sys.argv[1])
    procs = [ctx.Process(target=proc, args=(i,)) for i in range(3)]
    for p in procs:
        p.start()
    churn(99)
    for p in procs:
        p.join()
    print("pids", os.getpid(), *(p.pid for p in procs), flush=True)
"""


@pytest.mark.subprocess
@pytest.mark.parametrize("hook", ["allocator", "dispatch"])
def test_threads_and_processes_churning_at_once_still_add_up_to_one_moment(tmp_path: Path, hook: str) -> None:
    """The shares at the joint peak must add up to the total the table saw, exactly, or the kind says so."""
    profile, pids = run_script(tmp_path, CHURN, hook, "fork")
    (unit,) = profile.peaks
    assert unit.kind == JOINT and unit.processes == 4
    own = [load(tmp_path / f"run.pb.gz.processes/proc-{pid}.pb.gz").totals()["peak_space"] for pid in pids]
    assert max(own) <= profile.totals()["peak_space"] <= sum(own)


KILLED = """
import multiprocessing as mp, os, signal, sys, torch

def child(ready):
    x = torch.empty(2_000_000, dtype=torch.uint8)
    ready.set()
    signal.pause()

if __name__ == "__main__":
    ctx = mp.get_context("fork")
    held = torch.empty(4_000_000, dtype=torch.uint8)
    ready = ctx.Event()
    p = ctx.Process(target=child, args=(ready,))
    p.start()
    ready.wait()
    os.kill(p.pid, signal.SIGKILL)   # its profile is lost, and its 2 MB were part of the run's peak
    p.join()
    print("pids", os.getpid(), p.pid, flush=True)
"""


@pytest.mark.subprocess
def test_a_process_lost_at_the_peak_is_said_not_hidden(tmp_path: Path) -> None:
    profile, (parent, _child) = run_script(tmp_path, KILLED, "allocator", "fork")
    assert peak_by(profile, "pid") == {str(parent): 4 * MB}  # what the profiles that exist held then
    (unit,) = profile.peaks
    assert unit.kind == PARTIAL and unit.table_max == 6 * MB and not is_exact(profile.peaks)
    words = profile.peak_description("peak_space")
    assert "held 5.72 MiB (6,000,000 B) together" in words and "profile is missing" in words
    assert "the 1 profile here shows what its process held then" in words  # not "the 1 profiles ... each"


def test_a_partial_peak_of_several_profiles_says_each() -> None:
    words = PeakUnit("cpu", kind=PARTIAL, processes=2, table_max=5_000_000).describe()
    assert "the 2 profiles here show what each held then" in words and "held 4.77 MiB (5,000,000 B)" in words


# -- the Python API: windows one after the other ------------------------------------


def test_two_sequential_api_windows_merge_to_the_larger_not_the_sum(tmp_path: Path, capsys) -> None:
    with gpuflame.profile(tmp_path / "a.pb.gz", backend="torch"):
        a = torch.empty(3 * MB, dtype=torch.uint8)
        del a
    with gpuflame.profile(tmp_path / "b.pb.gz", backend="torch"):
        b = torch.empty(2 * MB, dtype=torch.uint8)
        del b
    data = json.loads(cli(capsys, "report", tmp_path / "a.pb.gz", tmp_path / "b.pb.gz", "--json")[1])
    assert data["total"] == 3 * MB
    assert data["peak"]["exact"] is True and data["peak"]["devices"][0]["kind"] == MAX
    assert "2 recording windows on cpu that did not overlap in time" in data["peak"]["description"]
    # in use at the end adds up both windows' ends, which no moment held together: a note says so
    assert any("never held that total at one moment" in c for c in data["comments"]), data["comments"]


# -- where exactness is impossible: the number says it is a bound --------------------


def window(pid: int, nbytes: int, start: int, end: int, leaf: str, device: str = "cpu") -> Profile:
    p = Profile(sample_types=memory_sample_types(), default_type="peak_space")
    p.add([Frame(leaf, "job.py", 1)], [nbytes, 1, 0, 0, nbytes, 1], {"device": device, "pid": pid})
    p.time_nanos, p.duration_nanos = start, end - start
    p.peaks = [PeakUnit(device, PROCESS, start, end, pid=str(pid))]
    return p


def test_overlapping_windows_without_a_common_table_are_an_upper_bound(tmp_path: Path, capsys) -> None:
    now = time.time_ns()
    parent, child = window(1, 4 * MB, now, now + 100, "parent"), window(2, 2 * MB, now + 10, now + 20, "child")
    save(parent, tmp_path / "p.pb.gz")
    save(child, tmp_path / "c.pb.gz")
    rc, out, err = cli(capsys, "report", tmp_path / "p.pb.gz", tmp_path / "c.pb.gz")
    assert rc == 0, err
    title = header(out)
    assert "5.72 MiB sum of each process's own peak on cpu" in title and "an upper bound" in title
    assert SINGLE_MOMENT not in out
    data = json.loads(cli(capsys, "report", tmp_path / "p.pb.gz", tmp_path / "c.pb.gz", "--json")[1])
    assert data["total"] == 6 * MB and data["peak"]["exact"] is False
    assert data["peak"]["devices"][0]["kind"] == BOUND
    merged = merge([parent, child])
    save(merged, tmp_path / "m.pb.gz")
    assert load(tmp_path / "m.pb.gz").peaks == merged.peaks  # the profile itself says it
    rc, _, err = cli(capsys, "view", tmp_path / "m.pb.gz", "-o", tmp_path / "m.html")
    assert rc == 0, err
    assert "an upper bound, not a moment that happened" in viewer_data(tmp_path / "m.html")["peak"]


def viewer_data(path: Path) -> dict:
    from tests.helpers.viewer_profiles import embedded

    return embedded(path.read_text(encoding="utf-8"))


def test_windows_apart_in_time_merge_by_max_per_device() -> None:
    now = time.time_ns()
    a = window(1, 3 * MB, now, now + 10, "a")
    b = window(1, 5 * MB, now + 20, now + 30, "b")
    gpu = window(1, 7 * MB, now + 20, now + 30, "g", device="cuda:0")
    m = merge([a, b, gpu])
    assert peak_by(m, "leaf") == {"b": 5 * MB, "g": 7 * MB}
    kinds = {u.device: (u.kind, u.windows) for u in m.peaks}
    assert kinds == {"cpu": (MAX, 2), "cuda:0": (PROCESS, 1)}
    assert is_exact(m.peaks)


@pytest.mark.slow
def test_jax_peak_says_it_is_sampled_and_how_to_sharpen_it() -> None:
    import jax.numpy as jnp

    from gpuflame.capture.recorders.jax_memory import take_profile

    kept = jnp.ones((1000,))
    profile = take_profile()
    assert kept is not None and {u.kind for u in profile.peaks} == {SAMPLED}
    words = profile.peak_description("peak_space")
    assert "samples of live buffers" in words and "--interval" in words and SINGLE_MOMENT not in words


def test_cpu_devices_are_not_said_to_have_memory_of_their_own() -> None:
    """torch's "cpu" and JAX's "cpu:0" in one process: the header said "(every GPU has its own memory)"
    over a 20 MiB sum of a process that never held more than 12 MiB."""
    from gpuflame.model.timeline import Timeline

    MIB = 1 << 20

    def two(devices: tuple[str, str]) -> str:
        p = Profile(sample_types=memory_sample_types(inuse=False, alloc=False))
        for device, size in zip(devices, (8 * MIB, 12 * MIB), strict=True):
            p.add([Frame("f", "a.py", 1)], [size, 1], {"device": device, "pid": "1"})
        t0 = 1_767_225_600_000_000_000
        p.timeline = Timeline(
            {
                (("device", devices[0]), ("pid", "1")): [(t0, 8 * MIB), (t0 + 10, 0)],
                (("device", devices[1]), ("pid", "1")): [(t0, 4 * MIB), (t0 + 20, 12 * MIB)],
            }
        )
        return p.peak_description("peak_space")

    cpu = two(("cpu", "cpu:0"))
    assert "GPU" not in cpu and "share the host's memory" in cpu and "together peaked at 12.0 MiB" in cpu
    assert "every GPU has its own memory" in two(("cuda:0", "cuda:1"))


def shares(pid: int, own: int, share: int, epoch: int, table_max: int, start: int, end: int) -> Profile:
    """A run's per-process file: its own peak, and its share at the table's epoch."""
    p = Profile(sample_types=[*memory_sample_types(), JOINT_PEAK_SPACE, JOINT_PEAK_OBJECTS])
    p.add(
        [Frame(f"f{pid}", "job.py", 1)], [own, 1, 0, 0, own, 1, share, 1 if share else 0], {"device": "cpu", "pid": pid}
    )
    p.peaks = [PeakUnit("cpu", PROCESS, start, end, pid=str(pid), table="ab", epoch=epoch, table_max=table_max)]
    return p


def test_shares_that_do_not_add_up_say_what_is_missing_or_fall_back_to_a_bound() -> None:
    now = time.time_ns()
    parent = shares(1, 4 * MB, 4 * MB, 2, 8 * MB, now, now + 100)  # a process of 4 MB at epoch 2 is missing
    child = shares(2, 2 * MB, 0, 1, 6 * MB, now + 10, now + 20)
    m = merge([parent, child], peaks="final")
    (unit,) = m.peaks
    assert unit.kind == PARTIAL and unit.table_max == 8 * MB and m.totals()["peak_space"] == 4 * MB
    assert JOINT_PEAK_SPACE.type not in m.type_names()
    broken = shares(1, 4 * MB, 4 * MB, 2, 3 * MB, now, now + 100)  # more than the table held: not trusted
    (unit,) = merge([broken, child], peaks="final").peaks
    assert unit.kind == BOUND and "more than the 3,000,000 B" in unit.why


def test_sums_stay_sums_for_arithmetic_on_profiles() -> None:
    now = time.time_ns()
    a, b = window(1, 3 * MB, now, now + 10, "a"), window(1, 5 * MB, now + 20, now + 30, "b")
    assert merge([a, b], peaks="sum").totals()["peak_space"] == 8 * MB


def test_a_damaged_peak_description_is_dropped_with_a_note(tmp_path: Path) -> None:
    from gpuflame.model.peak import DAMAGED_NOTE, PREFIX

    p = window(1, MB, 1, 2, "a")
    p.peaks = []
    p.comments.append(PREFIX + "{not json")
    save(p, tmp_path / "d.pb.gz")
    loaded = load(tmp_path / "d.pb.gz")
    assert loaded.peaks == [] and DAMAGED_NOTE in loaded.comments


def test_pushes_to_pyroscope_carry_no_run_bookkeeping() -> None:
    from gpuflame.ship.window import IntervalWindow

    now = time.time_ns()
    pushed = IntervalWindow().next(shares(1, 4 * MB, 4 * MB, 2, 4 * MB, now, now + 100))
    assert JOINT_PEAK_SPACE.type not in pushed.type_names() and pushed.peaks == []
    assert pushed.totals()["peak_space"] == 4 * MB


def test_a_note_for_the_end_of_a_run_when_the_peak_is_sampled_or_a_bound() -> None:
    from gpuflame.model.peak import run_note

    assert run_note([PeakUnit("cpu", JOINT, processes=3)]) == ""
    assert "--interval" in run_note([PeakUnit("cpu:0", SAMPLED, samples=2)])
    assert "an upper bound" in run_note([PeakUnit("cuda:0", BOUND, processes=2)])


def test_a_run_at_the_shortest_interval_is_not_told_to_take_it() -> None:
    """`gpuflame run --interval 100ms` of a JAX program ended '--interval 100ms samples more often'."""
    from gpuflame.model.peak import run_note

    sampled = [PeakUnit("cpu:0", SAMPLED, samples=17)]
    assert run_note(sampled, 0.5).endswith("--interval 100ms samples more often")
    at_shortest = run_note(sampled, 0.1)
    assert "--interval" not in at_shortest and "gpuflame.phase" in at_shortest


def test_jax_processes_at_once_are_not_called_an_upper_bound() -> None:
    now = time.time_ns()
    a, b = window(1, 3 * MB, now, now + 10, "a", "cpu:0"), window(2, 2 * MB, now + 5, now + 30, "b", "cpu:0")
    a.peaks = [PeakUnit("cpu:0", SAMPLED, now, now + 10, pid="1", samples=2)]
    (unit,) = merge([a, b]).peaks
    assert unit.kind == BOUND and unit.samples == 2
    assert "the true peak may be higher or lower" in unit.describe() and "upper bound" not in unit.describe()
