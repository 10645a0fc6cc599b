"""``gpuflame simulate``: its answers on real inputs, its JSON shape, and bad input as one line, exit 2."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuflame.cli.main import main
from gpuflame.formats.load_save import load
from gpuflame.units import format_bytes
from tests.helpers.paths import DATA, FIXTURES, SRC

DECOMFL = str(DATA / "torch-snapshot-DeComFL-memory.pickle.gz")

CPU_RUN = """
import sys, torch, gpuflame
with gpuflame.profile(sys.argv[1], backend="torch"):
    kept = []
    with gpuflame.phase("train"):
        for step in range(6):
            kept.append(torch.zeros(300_000 * (step + 1)))
            tmp = torch.ones(2_000_000)
            del tmp
"""


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["simulate", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_json_shape_per_device(capsys):
    rc, out, _ = run(capsys, DECOMFL, "--json")
    assert rc == 0
    (dev,) = json.loads(out)["devices"]
    assert dev["device"] == "cuda:0" and dev["settings"] == "PyTorch defaults"
    assert dev["recorded"] == {"reserved_peak": 1897922560, "segments_allocated": 61}
    assert set(dev["simulated"]) >= {"reserved_peak", "allocated_peak", "segments_allocated", "fragmentation_at_peak"}
    assert dev["placed_same"] == 1.0 and dev["first_difference"] is None and dev["oom"] is None
    over = dev["over_time"]
    assert max(b for _, b in over["reserved"]) == dev["simulated"]["reserved_peak"]
    assert max(b for _, b in over["allocated"]) == dev["simulated"]["allocated_peak"]
    assert len(over["reserved"]) <= 300 and over["reserved"][0][0] < over["reserved"][-1][0]


@pytest.mark.slow
def test_terminal_answer_and_suggest(capsys):
    rc, out, _ = run(capsys, DECOMFL, "--suggest", "--gpu-memory", "A100-40GB")
    assert rc == 0
    assert "reserved peak 1.77 GiB (recorded 1.77 GiB)" in out
    assert "fits: headroom" in out and "expandable_segments:True: reserved peak" in out
    assert out.splitlines()[-3].startswith("verdict: expandable_segments:True helps most")
    assert out.splitlines()[-2] == "  to use it: `export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`"
    assert "garbage_collection_threshold:0.6 with a memory fraction set: " in out
    rc, out, _ = run(capsys, DECOMFL, "--suggest")
    assert "garbage_collection_threshold: not tried (the collector runs only where a memory fraction is set" in out
    assert "garbage_collection_threshold:0.6:" not in out


FRACTION = ("--gpu-memory", "1966MiB", "--memory-fraction", "1")


def test_the_garbage_collector_acts_only_with_a_memory_fraction(capsys):
    """DeComFL on 1.42 GiB usable (0.8 of its reserved peak): the threshold alone changes nothing."""

    def replay(*argv: str) -> dict:
        rc, out, _ = run(capsys, DECOMFL, "--gpu-memory", "1966MiB", "--json", *argv)
        assert rc in (0, 1)
        return json.loads(out)["devices"][0]

    plain = replay()
    threshold_only = replay("--alloc-conf", "garbage_collection_threshold:0.6")
    assert threshold_only["simulated"] == plain["simulated"] and threshold_only["oom"] == plain["oom"]
    collected = replay("--alloc-conf", "garbage_collection_threshold:0.6", "--memory-fraction", "1")
    assert collected["simulated"]["segments_freed"] > plain["simulated"]["segments_freed"]
    assert replay("--memory-fraction", "1")["simulated"] == plain["simulated"]  # 1.0 of the device: no lower limit
    rc, out, _ = run(capsys, DECOMFL, "--alloc-conf", "garbage_collection_threshold:0.6")
    assert "note: garbage_collection_threshold does nothing here: PyTorch runs the collector only where" in out
    rc, out, _ = run(capsys, DECOMFL, "--alloc-conf", "garbage_collection_threshold:0.6", *FRACTION)
    assert "does nothing here" not in out
    rc, _, err = run(capsys, DECOMFL, "--memory-fraction", "0.5")
    assert rc == 2 and "--memory-fraction: give the device's memory too (--gpu-memory)" in err
    rc, _, err = run(capsys, DECOMFL, "--gpu-memory", "L4", "--memory-fraction", "1.5")
    assert rc == 2 and "F is between 0 and 1" in err


def test_out_of_memory_on_a_smaller_gpu(capsys):
    rc, out, _ = run(capsys, DECOMFL, "--gpu-memory", "2GiB", "--json")
    oom = json.loads(out)["devices"][0]["oom"]
    assert rc == 1 and oom["stack"][0] == "<module>" and oom["size"] > 0


@pytest.mark.parametrize(
    "argv, message",
    [
        ([str(DATA / "go-1.19-heap.pb.gz")], "has no allocation history"),
        ([DECOMFL, "--alloc-conf", "colour:blue"], "unknown setting 'colour'"),
        ([DECOMFL, "--gpu-memory", "lots"], "not a size or a known GPU"),
        ([DECOMFL, "--device", "gpu0"], "expected cuda:N"),
        ([DECOMFL, "--alloc-conf", "backend:cudaMallocAsync"], "a different allocator (CUDA's own cudaMallocAsync"),
        ([DECOMFL, "--alloc-conf", "per_process_memory_fraction:0.5"], "give it as --memory-fraction F"),
        ([DECOMFL, "--gpu-memory=-24GiB"], "a device's memory cannot be negative: '-24GiB'"),
        ([DECOMFL, "--gpu-memory", "2PiB"], "'2PiB' is larger than any GPU (none has more than 1 TiB)"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, argv, message):
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and out == "" and message in err and err.count("\n") == 1


@pytest.mark.subprocess
def test_a_cpu_run_predicted_for_a_gpu(tmp_path: Path, capsys):
    """gpuflame's own profile of a real torch CPU run (the allocator hook's event history) on a GPU of 24 GiB."""
    profile = tmp_path / "run.pb.gz"
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    subprocess.run([sys.executable, "-c", CPU_RUN, str(profile)], check=True, env=env, timeout=120)
    rc, out, _ = run(capsys, str(profile), "--gpu-memory", "24GiB")
    assert rc == 0 and "fits: headroom" in out
    assert "a CPU run's operators may allocate differently than CUDA kernels" in out
    rc, out, _ = run(capsys, str(profile), "--json")
    (dev,) = json.loads(out)["devices"]
    assert dev["device"] == "cuda:0" and dev["recorded"] is None and dev["placed_same"] is None
    assert dev["simulated"]["reserved_peak"] >= 6 * 300_000 * 4  # at least the tensors kept
    rc, out, _ = run(capsys, str(profile), "--gpu-memory", "530MiB", "--json")  # 18 MiB past the CUDA context
    oom = json.loads(out)["devices"][0]["oom"]
    assert oom["phase"] == "train" and oom["size"] > 0 and oom["allocated"] + oom["cached"] <= 18 << 20


@pytest.mark.slow
def test_the_fragmentation_profile_opens_in_the_views(tmp_path: Path, capsys):
    frag = tmp_path / "frag.pb.gz"
    rc, out, _ = run(capsys, DECOMFL, "-o", str(frag), "--json")
    sim = json.loads(out)["devices"][0]["simulated"]
    profile = load(frag)
    assert profile.default_type == "fragmentation"
    assert profile.totals() == {"fragmentation": sim["fragmentation_at_peak"], "reserved": sim["reserved_peak"]}
    assert max(b for _, b in profile.timeline.series[(("device", "cuda:0"),)]) == sim["allocated_peak"]
    assert main(["flame", str(frag)]) == 0
    assert main(["report", str(frag), "--type", "reserved"]) == 0
    assert main(["view", str(frag), "-o", str(tmp_path / "frag.html")]) == 0
    capsys.readouterr()
    rc, _, err = run(capsys, DECOMFL, "-o", DECOMFL)
    assert rc == 2 and "is an input of this command" in err


def test_report_on_a_fragmented_snapshot_suggests_simulate(capsys):
    fragmented = str(DATA / "torch-snapshot-silmont2000-mem_snapshot.pickle.gz")  # 14% cached at the peak
    assert main(["report", fragmented]) == 0
    out = capsys.readouterr().out
    assert (
        f"reserved 3.52 GiB, allocated 3.03 GiB at the reserved peak: try `gpuflame simulate {fragmented} --suggest`"
    ) in out
    assert main(["report", DECOMFL, "--json"]) == 0  # 5.6%: no hint
    assert json.loads(capsys.readouterr().out)["fragmentation_hint"] is None


def test_suggest_on_a_gpu_too_small_for_the_recorded_settings(capsys):
    snap = str(DATA / "torch-snapshot-silmont2000-mem_snapshot.pickle.gz")
    rc, out, _ = run(capsys, snap, "--suggest", "--gpu-memory", "3.6GiB")
    assert rc == 1 and "OUT OF MEMORY at event 52: a request of 512.0 MiB from aten::mul.Tensor" in out
    assert out.splitlines()[-3].startswith("verdict: ")
    assert "fits (reserved peak" in out.splitlines()[-3] and "the recorded settings run out of memory" in out
    # replaying other settings, the verdict names those, not the recorded ones
    rc, out, _ = run(capsys, snap, "--suggest", "--gpu-memory", "3.6GiB", "--alloc-conf", "roundup_power2_divisions:4")
    assert rc == 1 and "the recorded settings" not in out
    assert "the settings given (roundup_power2_divisions:4) run out of memory" in out.splitlines()[-3]


def test_one_device_of_two(capsys):
    two = str(FIXTURES / "handwritten_two_devices.pickle")
    rc, out, _ = run(capsys, two, "--device", "cuda:1", "--json")
    assert rc == 0 and [d["device"] for d in json.loads(out)["devices"]] == ["cuda:1"]
    rc, _, err = run(capsys, two, "--device", "cuda:5")
    assert rc == 2 and "no allocation history on cuda:5" in err


def test_backend_native_is_the_allocator_modelled(capsys):
    rc, out, _ = run(capsys, DECOMFL, "--alloc-conf", "backend:native", "--json")
    assert rc == 0 and json.loads(out)["devices"][0]["placed_same"] == 1.0


@pytest.mark.parametrize(
    "where, value, message",
    [
        ("trace", -4096, "a size in the snapshot is negative: -4096 at trace entry 5 of cuda:0 (size)"),
        ("trace", 2 << 40, "is larger than any GPU (none has more than 1 TiB): 2,199,023,255,552 bytes at trace"),
        ("segment", -(20 << 20), "a size in the snapshot is negative: -20971520 at the segment at 0x"),
        ("block", 3 << 40, "larger than any GPU (none has more than 1 TiB): 3,298,534,883,328 bytes at a block"),
    ],
)
def test_an_impossible_size_in_a_snapshot_is_one_line(tmp_path: Path, capsys, where, value, message):
    import pickle

    from gpuflame.simulate.snapshot import read

    snap = read((DATA / "torch-snapshot-silmont2000-mem_snapshot.pickle.gz").read_bytes())
    if where == "trace":
        snap["device_traces"][0][5]["size"] = value
    elif where == "segment":
        snap["segments"][0]["total_size"] = value
    else:
        snap["segments"][0]["blocks"][0]["size"] = value
    bad = tmp_path / "bad.pickle"
    bad.write_bytes(pickle.dumps(snap))
    rc, out, err = run(capsys, str(bad), "--gpu-memory", "L4")
    assert rc == 2 and out == "" and message in err and err.count("\n") == 1, err
    assert err.startswith(f"gpuflame simulate: error: {bad}: "), err  # which file, as the other commands say


@pytest.mark.parametrize(
    "damage", ["segment without size", "size as text", "trace entry not a dict", "blocks not a list"]
)
def test_a_damaged_snapshot_is_one_line(tmp_path: Path, capsys, damage):
    import pickle

    from gpuflame.simulate.snapshot import read

    snap = read((DATA / "torch-snapshot-silmont2000-mem_snapshot.pickle.gz").read_bytes())
    if damage == "segment without size":
        del snap["segments"][0]["total_size"]
    elif damage == "size as text":
        snap["device_traces"][0][5]["size"] = "12"
    elif damage == "trace entry not a dict":
        snap["device_traces"][0][3] = ["alloc"]
    else:
        snap["segments"][0]["blocks"] = 7
    bad = tmp_path / "bad.pickle"
    bad.write_bytes(pickle.dumps(snap))
    rc, out, err = run(capsys, str(bad))
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"gpuflame simulate: error: {bad}: "), err


@pytest.mark.parametrize(
    "content", [b"", b"\x80\x04\x95", gzip.compress(b"\x80\x04}", mtime=0)[:-9]], ids=["empty", "cut", "cut-gzip"]
)
def test_an_empty_or_cut_input_names_the_file(tmp_path: Path, capsys, content: bytes) -> None:
    bad = tmp_path / "cut.pickle.gz"
    bad.write_bytes(content)
    rc, out, err = run(capsys, str(bad))
    assert rc == 2 and out == "" and err.count("\n") == 1, err
    assert err.startswith(f"gpuflame simulate: error: {bad}: "), err


def test_a_snapshot_without_allocator_settings_says_defaults_were_assumed(tmp_path: Path, capsys):
    import pickle

    from gpuflame.simulate.snapshot import read

    snap = read((DATA / "torch-snapshot-silmont2000-mem_snapshot.pickle.gz").read_bytes())
    del snap["allocator_settings"]
    old = tmp_path / "old.pickle"
    old.write_bytes(pickle.dumps(snap))
    rc, out, _ = run(capsys, str(old))
    assert rc == 0 and "(as recorded)" not in out
    assert "note: the snapshot does not record its allocator settings: PyTorch's defaults assumed" in out
    assert "agreement: 100.0% of 36 allocations" in out


def test_report_reserved_peak_is_not_the_reserved_at_the_allocations_peak(tmp_path: Path, capsys):
    """Hand-written (no real trace here has it): empty_cache() after the allocations' peak, then a larger
    segment for a smaller allocation. The allocations peak at 36 MiB with 40 MiB reserved; the allocator's
    reserved peak is 80 MiB, with 30 MiB allocated."""
    import pickle

    mib, a, b, c = 1 << 20, 0x7F00_0000_0000, 0x7F00_4000_0000, 0x7F00_8000_0000
    steps = [
        ("segment_alloc", a, 20),
        ("alloc", a, 18),
        ("segment_alloc", b, 20),
        ("alloc", b, 18),
        ("free_requested", a, 18),
        ("free_completed", a, 18),
        ("free_requested", b, 18),
        ("free_completed", b, 18),
        ("segment_free", a, 20),
        ("segment_alloc", c, 60),
        ("alloc", c, 30),
        ("free_requested", c, 30),
        ("free_completed", c, 30),
        ("segment_free", c, 60),
    ]
    trace = [
        {
            "action": x,
            "addr": addr,
            "size": n * mib,
            "stream": 0,
            "time_us": 1_700_000_000_000_000 + i,
            "frames": [{"filename": "train.py", "line": 3 + i, "name": "step"}],
        }
        for i, (x, addr, n) in enumerate(steps)
    ]
    segs = [
        {
            "device": 0,
            "address": b,
            "total_size": 20 * mib,
            "stream": 0,
            "segment_type": "large",
            "blocks": [{"address": b, "size": 20 * mib, "state": "inactive"}],
        }
    ]
    snap = tmp_path / "snap.pickle"
    snap.write_bytes(pickle.dumps({"segments": segs, "device_traces": [trace]}))
    assert main(["report", str(snap), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["reserved_peak"] == [
        {"device": "cuda:0", "reserved": 80 * mib, "allocated": 30 * mib, "at_ns": trace[9]["time_us"] * 1000}
    ]
    assert data["total"] == 40 * mib  # peak_space: what was reserved when the allocations peaked
    assert data["fragmentation_hint"].startswith("reserved 80.0 MiB, allocated 30.0 MiB at the reserved peak")
    assert main(["report", str(snap)]) == 0
    out = capsys.readouterr().out
    assert (
        "cuda:0: the allocator's reserved peak 80.0 MiB 0.000 s into the strip, 30.0 MiB of it allocated; "
        "40.0 MiB reserved when the allocations peaked (peak_space)"
    ) in out
    rc, out, _ = run(capsys, str(snap), "--json")
    assert json.loads(out)["devices"][0]["recorded"]["reserved_peak"] == 80 * mib


def test_every_suggestion_names_its_change_the_export_and_any_code(tmp_path: Path, capsys):
    """Over recorded settings of max_split_size_mb:256: each export string keeps them and adds the one change."""
    import pickle

    from gpuflame.simulate.snapshot import read

    snap = read((DATA / "torch-snapshot-silmont2000-mem_snapshot.pickle.gz").read_bytes())
    snap["allocator_settings"]["max_split_size"] = 256 << 20
    path = tmp_path / "split.pickle"
    path.write_bytes(pickle.dumps(snap))
    rc, out, _ = run(capsys, str(path), "--suggest", "--gpu-memory", "8GiB", "--json")
    tried = {t["settings"]: t for t in json.loads(out)["suggest"]}
    assert tried["expandable_segments:True"]["alloc_conf"] == "max_split_size_mb:256,expandable_segments:True"
    assert tried["expandable_segments:True"]["code"] is None
    gc = tried["garbage_collection_threshold:0.6 with a memory fraction set"]
    assert gc["alloc_conf"] == "max_split_size_mb:256,garbage_collection_threshold:0.6"
    assert gc["code"] == "torch.cuda.set_per_process_memory_fraction(1.0)"
    rc, out, _ = run(capsys, str(path), "--suggest", "--gpu-memory", "8GiB", "--memory-fraction", "0.5", "--json")
    tried = {t["settings"]: t for t in json.loads(out)["suggest"]}
    assert tried["garbage_collection_threshold:0.6"]["code"] is None  # the program sets its fraction already
    for t in tried.values():  # every setting tried under the program's limit: half of 8 GiB
        assert t["devices"][0]["capacity"] == 4 << 30, t["settings"]
    rc, out, _ = run(capsys, str(path), "--json")
    least = json.loads(out)["devices"][0]["min_gpu_memory"] >> 20
    rc, out, _ = run(capsys, str(path), "--suggest")  # over max_split_size_mb:256, neither 128 nor 512 lowers it
    assert out.splitlines()[-2] == "verdict: none of the settings tried lowers the reserved peak"
    smallest = f"  smallest device the settings replayed fit: {least} MiB, in steps of 64 MiB (--gpu-memory"
    assert out.splitlines()[-1].startswith(smallest)
    rc, out, _ = run(capsys, str(DATA / "torch-snapshot-silmont2000-mem_snapshot.pickle.gz"), "--suggest")
    assert out.splitlines()[-3].startswith("verdict: max_split_size_mb:128 helps most")
    assert out.splitlines()[-2] == "  to use it: `export PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128`"


def test_a_suggestion_that_needs_code_says_so_in_full():
    from gpuflame.simulate.replay import Input, candidates
    from gpuflame.simulate.settings import DEFAULTS

    (gc,) = [c for c in candidates(Input("<test>"), 4 << 30, None) if c.code]
    assert gc.advice == (
        "`export PYTORCH_CUDA_ALLOC_CONF=garbage_collection_threshold:0.6` and call "
        "`torch.cuda.set_per_process_memory_fraction(1.0)` in the program before its first CUDA allocation"
    )
    assert gc.fraction_limit == (4 << 30) + (512 << 20) and gc.settings != DEFAULTS
    assert not [c for c in candidates(Input("<test>"), None, None) if c.settings.garbage_collection_threshold]


@pytest.mark.parametrize(
    "name",
    [
        "torch-snapshot-silmont2000-mem_snapshot.pickle.gz",
        "torch-snapshot-silmont2000-memory_forward_fp32_128.pickle.gz",
        "torch-snapshot-DeComFL-memory.pickle.gz",
    ],
)
def test_min_gpu_memory_fits_and_64_mib_less_does_not(capsys, name):
    """The smallest device (64 MiB steps) proven both ways, with the exit code a CI job reads: 0 fits, 1 does not."""
    snap = str(DATA / name)
    rc, out, _ = run(capsys, snap, "--json")
    (dev,) = json.loads(out)["devices"]
    least = dev["min_gpu_memory"]
    assert least % (64 << 20) == 0 and least > dev["simulated"]["allocated_peak"] + (512 << 20)
    rc, out, _ = run(capsys, snap, "--gpu-memory", str(least), "--json")
    assert rc == 0 and json.loads(out)["devices"][0]["oom"] is None
    rc, out, _ = run(capsys, snap, "--gpu-memory", str(least - (64 << 20)), "--json")
    assert rc == 1 and json.loads(out)["devices"][0]["oom"] is not None
    rc, out, _ = run(capsys, snap, "--gpu-memory", str(least - (64 << 20)))  # the terminal answer: the same code
    assert rc == 1 and "OUT OF MEMORY" in out


def test_min_gpu_memory_of_a_handwritten_trace_and_the_gpus_named(tmp_path: Path, capsys):
    """One 3 GiB allocation: a 3 GiB segment, so 3 GiB + 512 MiB of context, a multiple of 64 MiB already."""
    import pickle

    mib = 1 << 20
    trace = [
        {"action": "segment_alloc", "addr": 1 << 40, "size": 3072 * mib, "stream": 0, "time_us": 1},
        {"action": "alloc", "addr": 1 << 40, "size": 3072 * mib - 4096, "stream": 0, "time_us": 2},
    ]
    blocks = [
        {"address": 1 << 40, "size": 3072 * mib, "requested_size": 3072 * mib - 4096, "state": "active_allocated"}
    ]
    seg = {"device": 0, "address": 1 << 40, "total_size": 3072 * mib, "stream": 0, "segment_type": "large"}
    path = tmp_path / "handwritten_one_alloc.pickle"
    path.write_bytes(pickle.dumps({"segments": [{**seg, "blocks": blocks}], "device_traces": [trace]}))
    rc, out, _ = run(capsys, str(path), "--json")
    (dev,) = json.loads(out)["devices"]
    assert dev["min_gpu_memory"] == (3072 + 512) * mib
    assert dev["gpus_that_fit"][0] == "T4" and "H200" in dev["gpus_that_fit"]
    rc, out, _ = run(capsys, str(path))
    assert "agreement: 100.0% of 1 allocation at the recorded segment and offset" in out  # singular
    rc, out, _ = run(capsys, str(path), "--gpu-memory", "3.4GiB")
    assert rc == 1
    assert "a request of 3.00 GiB from <no stack recorded> needed 3.00 GiB more from the device" in out
    assert "smallest device it fits: 3584 MiB, in steps of 64 MiB (--gpu-memory 3584MiB); every GPU of the table" in out


def test_out_of_memory_before_the_trace_blames_no_event(capsys):
    """MAGMA27's trace starts with its segments already reserved (13.2 GiB): on 10 GiB that is over before event 0."""
    from gpuflame.simulate.snapshot import read

    path = DATA / "torch-snapshot-MAGMA27-memory_snapshot.pickle.gz"
    snap = read(path.read_bytes())
    at_start = sum(s["total_size"] for s in snap["segments"])
    for e in reversed(snap["device_traces"][0]):  # the segments as they stood before the trace: its events undone
        at_start += {"segment_free": e["size"], "segment_alloc": -e["size"]}.get(e["action"], 0)
    assert at_start > 10 << 30
    rc, out, _ = run(capsys, str(path), "--gpu-memory", "10GiB", "--json")
    oom = json.loads(out)["devices"][0]["oom"]
    assert rc == 1 and oom["at_start"] is True and oom["event"] is None and oom["size"] is None
    assert oom["allocated"] + oom["cached"] == at_start
    rc, out, _ = run(capsys, str(path), "--gpu-memory", "10GiB")
    assert rc == 1 and "OUT OF MEMORY before the trace: it starts with 13.2 GiB reserved" in out
    assert "no event of the trace is to blame" in out and "  reserved peak" not in out


MiB = 1 << 20
A, B = 0x7F00_0000_0000, 0x7F00_4000_0000


def handwritten(tmp_path: Path, trace: list[tuple[str, int, int, int]], segments: list[dict]) -> str:
    """A snapshot written by hand in _snapshot()'s layout: (action, addr, size, stream) per trace entry."""
    import pickle

    entries = [
        {"action": a, "addr": addr, "size": size, "stream": stream, "time_us": 1000 + i, "frames": []}
        for i, (a, addr, size, stream) in enumerate(trace)
    ]
    path = tmp_path / "handwritten.pickle"
    path.write_bytes(pickle.dumps({"segments": segments, "device_traces": [entries]}))
    return str(path)


def test_fragmentation_at_both_peaks_each_labelled(tmp_path: Path, capsys):
    """Two 8 MiB blocks in a 20 MiB segment (the allocated peak: 16 of 20 MiB), both freed, then 12 MiB on
    stream 1, which cannot use stream 0's cached segment: a new 12 MiB one (the reserved peak: 12 of 32 MiB)."""
    trace = [
        ("segment_alloc", A, 20 * MiB, 0),
        ("alloc", A, 8 * MiB, 0),
        ("alloc", A + 8 * MiB, 8 * MiB, 0),
        ("free_requested", A, 8 * MiB, 0),
        ("free_completed", A, 8 * MiB, 0),
        ("free_requested", A + 8 * MiB, 8 * MiB, 0),
        ("free_completed", A + 8 * MiB, 8 * MiB, 0),
        ("segment_alloc", B, 12 * MiB, 1),
        ("alloc", B, 12 * MiB, 1),
    ]
    segments = [
        {"device": 0, "address": A, "total_size": 20 * MiB, "stream": 0, "segment_type": "large",
         "blocks": [{"address": A, "size": 20 * MiB, "state": "inactive"}]},
        {"device": 0, "address": B, "total_size": 12 * MiB, "stream": 1, "segment_type": "large",
         "blocks": [{"address": B, "size": 12 * MiB, "requested_size": 12 * MiB, "state": "active_allocated"}]},
    ]  # fmt: skip
    path = handwritten(tmp_path, trace, segments)
    rc, out, _ = run(capsys, path, "--json")
    sim = json.loads(out)["devices"][0]["simulated"]
    assert (sim["reserved_peak"], sim["fragmentation_at_peak"]) == (32 * MiB, 20 * MiB)
    assert (sim["allocated_peak"], sim["reserved_at_allocated_peak"]) == (16 * MiB, 20 * MiB)
    assert sim["fragmentation_at_allocated_peak"] == 4 * MiB
    rc, out, _ = run(capsys, path)
    assert "  reserved but unused: 20.0 MiB (62.5%) at the reserved peak; 4.00 MiB (20.0%) at the allocated peak" in out


def test_the_out_of_memory_line_names_the_segment_the_request_needed(tmp_path: Path, capsys):
    """A 1.56 MiB request is a large-pool one under 10 MiB: it needs a 20 MiB segment, more than 18 MiB allows."""
    size = 1_638_400
    segments = [
        {"device": 0, "address": A, "total_size": 20 * MiB, "stream": 0, "segment_type": "large",
         "blocks": [{"address": A, "size": size, "requested_size": size, "state": "active_allocated"},
                    {"address": A + size, "size": 20 * MiB - size, "state": "inactive"}]},
    ]  # fmt: skip
    path = handwritten(tmp_path, [("segment_alloc", A, 20 * MiB, 0), ("alloc", A, size, 0)], segments)
    rc, out, _ = run(capsys, path, "--gpu-memory", "530MiB")
    assert rc == 1
    assert "a request of 1.56 MiB from <no stack recorded> needed 20.0 MiB more from the device" in out
    assert "allocated 0 B, cached 0 B then, 18.0 MiB allowed" in out
    rc, out, _ = run(capsys, path, "--gpu-memory", "530MiB", "--json")
    assert json.loads(out)["devices"][0]["oom"]["segment_size"] == 20 * MiB


def test_why_a_setting_raises_the_peak_is_measured_and_a_device_size_answers_it(tmp_path: Path, capsys):
    """A 40 MiB block freed, then 30 MiB asked for: the defaults split the cached block (10 MiB rest, 40 MiB
    reserved); max_split_size_mb:32 never splits a 40 MiB block for a smaller request, so it makes a 30 MiB
    segment and keeps the 40 MiB one (70 MiB) unless a cudaMalloc fails and releases it (48 MiB usable).
    The defaults' reserved peak is the first moment, 40 MiB all allocated: nothing free then."""
    trace = [
        ("segment_alloc", A, 40 * MiB, 0),
        ("alloc", A, 40 * MiB, 0),
        ("free_requested", A, 40 * MiB, 0),
        ("free_completed", A, 40 * MiB, 0),
        ("alloc", A, 30 * MiB, 0),
    ]
    segments = [
        {"device": 0, "address": A, "total_size": 40 * MiB, "stream": 0, "segment_type": "large",
         "blocks": [{"address": A, "size": 30 * MiB, "requested_size": 30 * MiB, "state": "active_allocated"},
                    {"address": A + 30 * MiB, "size": 10 * MiB, "state": "inactive"}]},
    ]  # fmt: skip
    path = handwritten(tmp_path, trace, segments)
    rc, out, _ = run(capsys, path, "--alloc-conf", "max_split_size_mb:32")
    assert "reserved peak 70.0 MiB (recorded 40.0 MiB)" in out
    assert (
        "  why (beside the recorded settings): at the reserved peak, 40.0 MiB in free segments (or free pages) "
        "never released (was 0 B); the replay never had to release memory (no device size known): "
        "--gpu-memory gives the answer on a real card"
    ) in out
    rc, out, _ = run(capsys, path, "--alloc-conf", "max_split_size_mb:32", "--gpu-memory", "560MiB", "--json")
    dev = json.loads(out)["devices"][0]
    assert rc == 0 and dev["oom"] is None and dev["simulated"]["reserved_peak"] == 40 * MiB
    assert dev["simulated"]["segments_freed"] == 1


def test_a_torch_2_0_one_entry_trace_is_named_for_what_it_is(tmp_path: Path, capsys):
    """torch 2.0's default ring buffer keeps 1 entry: the program did record a history, too short to replay."""
    import pickle

    from gpuflame.simulate.snapshot import read

    snap = read((DATA / "torch-snapshot-silmont2000-mem_snapshot.pickle.gz").read_bytes())
    snap["device_traces"][0] = [{"action": "snapshot", "addr": 0, "size": 0, "stream": 0, "frames": []}]
    path = tmp_path / "torch20.pickle"
    path.write_bytes(pickle.dumps(snap))
    rc, out, err = run(capsys, str(path))
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert "the trace holds 1 entry and no allocation to replay (torch 2.0 keeps 1 entry by default" in err
    assert "trace_alloc_max_entries=N" in err and "max_entries=N from torch 2.1" in err
    snap["device_traces"][0] = []
    path.write_bytes(pickle.dumps(snap))
    rc, out, err = run(capsys, str(path))
    assert rc == 2 and "has no allocation history to replay" in err


def test_a_trace_started_part_way_says_how_many_entries_it_holds(capsys):
    from gpuflame.simulate.snapshot import read

    path = DATA / "torch-snapshot-MAGMA27-memory_snapshot.pickle.gz"
    n = len(read(path.read_bytes())["device_traces"][0])
    rc, out, _ = run(capsys, str(path))
    assert f"  the trace starts part way through the run (it holds {n:,} entries): replayed from" in out


TWO_RANKS = """
import os, subprocess, sys
CHILD = '''
import os, torch
kept = [torch.zeros(2_000_000 * (3 * int(os.environ["RANK"]) + 1)) for step in range(4)]
'''
procs = [
    subprocess.Popen([sys.executable, "-c", CHILD], env={**os.environ, "RANK": str(r), "WORLD_SIZE": "2"})
    for r in (0, 1)
]
sys.exit(max(p.wait() for p in procs))
"""


@pytest.mark.subprocess
def test_each_process_of_a_merged_run_is_replayed_on_a_device_of_its_own(tmp_path: Path, capsys):
    """Two ranks under gpuflame run (torch on the CPU): rank 1 keeps four times rank 0's tensors (4 x 30.5 MiB
    against 4 x 7.63 MiB), so on a device that fits rank 0 exactly, rank 1 is the one that runs out of memory."""
    from tests.helpers.run_cli import gpuflame_run

    (tmp_path / "two.py").write_text(TWO_RANKS)
    done = gpuflame_run("--backend", "torch", "-o", "run.pb.gz", "--", sys.executable, "two.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    merged = str(tmp_path / "run.pb.gz")
    rc, out, _ = run(capsys, merged, "--json")
    devices = json.loads(out)["devices"]
    assert [d["rank"] for d in devices] == [0, 1] and len({d["pid"] for d in devices}) == 2
    assert [d["device"] for d in devices] == [f"cuda:0 (pid {d['pid']}, rank {d['rank']})" for d in devices]
    for d, rank in zip(devices, (0, 1), strict=True):  # each alone: its own tensors, not the two summed
        assert d["simulated"]["allocated_peak"] >= 4 * 4 * 2_000_000 * (3 * rank + 1)
        assert d["simulated"]["reserved_peak"] < 4 * 4 * 2_000_000 * (3 * rank + 1) + (20 << 20)
    least = devices[0]["min_gpu_memory"]
    assert devices[1]["min_gpu_memory"] > least
    rc, out, _ = run(capsys, merged, "--gpu-memory", str(least), "--json")
    data = json.loads(out)
    assert rc == 1 and data["first_oom"] == devices[1]["device"]
    assert [d["oom"] is None for d in data["devices"]] == [True, False]
    rc, out, _ = run(capsys, merged, "--gpu-memory", str(least), "--suggest")
    pid0, pid1 = devices[0]["pid"], devices[1]["pid"]
    assert f"first to run out of memory: rank 1 (pid {pid1}) on cuda:0; 1 of 2 fit" in out
    lines = out.splitlines()
    for d in devices:  # the settings tried and the verdict, per process, beside that process's own peak
        at = lines.index(f"settings tried for {d['device']}:")
        was = format_bytes(d["simulated"]["reserved_peak"]) if d is devices[0] else None
        block = lines[at + 1 : at + 12]
        assert any(line.startswith("  verdict: ") for line in block)
        if was:
            assert "expandable_segments:True: reserved peak " in block[0] and f", was {was}" in block[0]
    assert "settings tried:" not in lines and f"pid {pid0}" in out


def test_an_out_of_memory_the_recording_had_too_says_so(capsys):
    """The hand-written trace asks for 40 GiB where its oom entry says the device had far less free."""
    rc, out, _ = run(capsys, str(FIXTURES / "handwritten_oom.pickle"), "--json")
    oom = json.loads(out)["devices"][0]["oom"]
    assert rc == 0 and oom["recorded"] is True and oom["size"] == 40 << 30  # no --gpu-memory: no CI verdict
    rc, out, _ = run(capsys, str(FIXTURES / "handwritten_oom.pickle"))
    assert "OUT OF MEMORY at event 74 (as recorded): a request of 40.0 GiB" in out
