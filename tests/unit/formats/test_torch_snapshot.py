"""PyTorch memory snapshots -> profiles, checked against independent computations.

The snapshots are the HAND-WRITTEN STAND-INS built by
``tests/fixtures/make_snapshots.py`` (no GPU here), generated afresh for this
test session so their frames point at the installed torch's real lines.
Numbers are compared with torch's own ``_memory_viz`` accounting on the same
dict, with a brute-force replay written here (backwards from the end state,
unlike the converter), and with sums over the raw dict.
"""

from __future__ import annotations

import copy
import gzip
import pickle
import random
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from gpuflame.errors import ProfileFormatError
from gpuflame.formats import loads, torch_snapshot
from gpuflame.model import Profile
from gpuflame.model import filter as pfilter
from gpuflame.model.profile import NATIVE, PYTHON, SYNTHETIC, TRAMPOLINE_KIND
from gpuflame.symbols.names import ALLOCATOR_ROUNDING, CACHED_FREE, display_name
from gpuflame.units import format_bytes
from tests.helpers.paths import DATA, FIXTURES

make_snapshots = pytest.importorskip("tests.fixtures.make_snapshots")  # needs torch (a test dependency)

ACTIVE = ("active_allocated", "active_pending_free")


@pytest.fixture(scope="session")
def snapshots() -> dict[str, dict[str, Any]]:
    return make_snapshots.build_all()


@pytest.fixture(scope="session")
def profiles(snapshots: dict[str, dict[str, Any]]) -> dict[str, Profile]:
    return {name: torch_snapshot.from_snapshot(snap) for name, snap in snapshots.items()}


def values(profile: Profile, type_name: str, device: str | None = None) -> int:
    i = profile.type_index(type_name)
    return sum(s.values[i] for s in profile.samples if device is None or s.label("device") == device)


def devices(snap: dict[str, Any]) -> list[int]:
    return sorted({seg["device"] for seg in snap["segments"]} | {i for i, t in enumerate(snap["device_traces"]) if t})


def is_cached(profile: Profile, sample: Any) -> bool:
    return profile.frames[sample.stack[0]].name == CACHED_FREE


# -- in use ------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(make_snapshots.FIXTURES))
def test_inuse_total_is_what_the_allocator_reserved(snapshots, profiles, name: str) -> None:
    snap, profile = snapshots[name], profiles[name]
    for dev in devices(snap):
        reserved = sum(seg["total_size"] for seg in snap["segments"] if seg["device"] == dev)
        assert values(profile, "inuse_space", f"cuda:{dev}") == reserved


@pytest.mark.parametrize("name", list(make_snapshots.FIXTURES))
def test_inuse_matches_torch_memory_viz(snapshots, profiles, name: str) -> None:
    memory_viz = pytest.importorskip("torch.cuda._memory_viz")
    snap, profile = snapshots[name], profiles[name]
    for render in (memory_viz.memory, memory_viz.segments):
        by_state: Counter[str] = Counter()
        for line in render(snap, lambda text: text).splitlines():
            stack, size = line.rsplit(" ", 1)
            state = stack.split(";")[1 if render is memory_viz.memory else 2]
            by_state[state] += int(size)
        active = sum(by_state[s] for s in ACTIVE)
        inuse = profile.type_index("inuse_space")
        ours_active = sum(s.values[inuse] for s in profile.samples if not is_cached(profile, s))
        ours_cached = sum(s.values[inuse] for s in profile.samples if is_cached(profile, s))
        assert ours_active == active
        assert ours_cached == by_state["inactive"]


def test_inuse_per_allocating_line_matches_memory_viz(snapshots, profiles) -> None:
    memory_viz = pytest.importorskip("torch.cuda._memory_viz")
    snap, profile = snapshots["handwritten_small_trace"], profiles["handwritten_small_trace"]
    theirs: Counter[tuple[str, int]] = Counter()
    leaf = None
    for line in memory_viz.memory(snap, lambda text: text).splitlines():
        stack, size = line.rsplit(" ", 1)
        parts = stack.split(";")
        if parts[1] not in ACTIVE:
            continue
        if parts[-1] == "<gaps>":  # the rounding of the block just written
            theirs[leaf] += int(size)  # type: ignore[index]
            continue
        file, lineno, _ = parts[-1].split(":")
        leaf = (file, int(lineno))
        theirs[leaf] += int(size)
    ours: Counter[tuple[str, int]] = Counter()
    inuse = profile.type_index("inuse_space")
    for s in profile.samples:
        top = profile.frames[s.stack[0]]
        if s.values[inuse] and not is_cached(profile, s):
            ours[(Path(top.file).name, top.line)] += s.values[inuse]
    assert ours == theirs


def test_one_filter_hides_the_cached_free_blocks(snapshots, profiles) -> None:
    snap, profile = snapshots["handwritten_small_trace"], profiles["handwritten_small_trace"]
    live = pfilter.ignore(profile, "<cached free blocks>")
    active = sum(b["size"] for seg in snap["segments"] for b in seg["blocks"] if b["state"] in ACTIVE)
    assert values(live, "inuse_space") == active
    assert values(profile, "inuse_space") > active  # there were cached blocks to hide
    cached = [f for f in profile.frames if f.name == CACHED_FREE]
    assert len(cached) == 1 and cached[0].kind == SYNTHETIC


def test_inuse_objects_count_live_blocks(snapshots, profiles) -> None:
    for name, snap in snapshots.items():
        blocks = sum(1 for seg in snap["segments"] for b in seg["blocks"] if b["state"] in ACTIVE)
        assert values(profiles[name], "inuse_objects") == blocks


# -- alloc ---------------------------------------------------------------------------


def test_alloc_is_every_alloc_in_the_trace(snapshots, profiles) -> None:
    for name, snap in snapshots.items():
        for dev, trace in enumerate(snap["device_traces"]):
            allocs = [e for e in trace if e["action"] == "alloc"]
            assert values(profiles[name], "alloc_space", f"cuda:{dev}") == sum(e["size"] for e in allocs)
            assert values(profiles[name], "alloc_objects", f"cuda:{dev}") == len(allocs)


# -- peak: a brute-force replay, backwards from the end state ---------------------------


def frames_key(frames: list[dict[str, Any]] | None) -> tuple:
    return tuple((f["filename"], f["line"]) for f in frames or [])


def brute_force_peak(snap: dict[str, Any], device: int) -> tuple[int, Counter, int, int]:
    """(live bytes at the peak, bytes per allocating stack then, reserved then, frees of unknown allocations).

    Walks the trace from its end back to its start, undoing each event on the
    set of live allocations known from the end state, and recomputes the
    total at every moment from scratch (quadratic, fine for fixtures).
    """
    trace = snap["device_traces"][device]
    end_live: dict[int, tuple[int, tuple | str]] = {}
    for seg in snap["segments"]:
        if seg["device"] != device:
            continue
        for b in seg["blocks"]:
            if b["state"] in ACTIVE:
                end_live[b["address"]] = (b["requested_size"], frames_key(b["frames"]))
    reserved_end = sum(seg["total_size"] for seg in snap["segments"] if seg["device"] == device)
    states = [None] * (len(trace) + 1)  # live set after k events
    reserved = [0] * (len(trace) + 1)
    live = dict(end_live)
    res = reserved_end
    states[len(trace)] = dict(live)
    reserved[len(trace)] = res
    unknown = 0
    for k in range(len(trace) - 1, -1, -1):
        e = trace[k]
        if e["action"] == "alloc":
            live.pop(e["addr"], None)
        elif e["action"] == "free_completed":
            live[e["addr"]] = (e["size"], "freed later")  # stack filled in below
        elif e["action"] in ("segment_alloc", "segment_map"):
            res -= e["size"]
        elif e["action"] in ("segment_free", "segment_unmap"):
            res += e["size"]
        states[k] = dict(live)
        reserved[k] = res
    totals = [sum(size for size, _ in s.values()) for s in states]
    peak = max(totals)
    at = totals.index(peak)  # the first moment of the highest total
    by_stack: Counter = Counter()
    for addr, (size, key) in states[at].items():
        if key == "freed later":  # find its alloc before the peak, if the trace has it
            key = "<allocated before the trace>"
            for e in reversed(trace[:at]):
                if e.get("addr") == addr and e["action"] == "alloc":
                    key = frames_key(e["frames"])
                    break
        by_stack[key] += size
    allocated = set()
    for e in trace:
        if e["action"] == "alloc":
            allocated.add(e["addr"])
        elif e["action"] == "free_completed":
            if e["addr"] not in allocated:
                unknown += 1
            allocated.discard(e["addr"])
    return peak, by_stack, reserved[at], unknown


def our_peak(profile: Profile, device: int) -> tuple[int, Counter, int]:
    i = profile.type_index("peak_space")
    by_stack: Counter = Counter()
    cached = 0
    for s in profile.samples:
        if s.label("device") != f"cuda:{device}" or not s.values[i]:
            continue
        frames = profile.stack_frames(s)
        if frames[0].name in (CACHED_FREE, ALLOCATOR_ROUNDING):
            cached += s.values[i]
        elif frames[0].name == "<allocated before the trace>":
            by_stack["<allocated before the trace>"] += s.values[i]
        else:
            by_stack[tuple((f.file, f.line) for f in frames)] += s.values[i]
    return sum(by_stack.values()), by_stack, cached


@pytest.mark.parametrize(
    "name",
    ["handwritten_small_trace", "handwritten_overflowed_trace", "handwritten_oom", "handwritten_two_devices"],
)
def test_peak_equals_a_brute_force_replay(snapshots, profiles, name: str) -> None:
    snap, profile = snapshots[name], profiles[name]
    for dev, trace in enumerate(snap["device_traces"]):
        if not trace:
            continue
        peak, stacks, reserved_then, _ = brute_force_peak(snap, dev)
        ours, our_stacks, cached = our_peak(profile, dev)
        assert ours == peak
        assert our_stacks == stacks
        assert cached == reserved_then - peak  # reserved at the peak, minus what was live
        assert values(profile, "peak_space", f"cuda:{dev}") == reserved_then


def test_the_small_trace_peaks_inside_the_forward_pass(snapshots, profiles) -> None:
    profile = profiles["handwritten_small_trace"]
    peak = values(pfilter.ignore(profile, "<cached free blocks>"), "peak_space")
    end = sum(
        b["requested_size"]
        for seg in snapshots["handwritten_small_trace"]["segments"]
        for b in seg["blocks"]
        if b["state"] in ACTIVE
    )
    assert peak > end  # the peak is not the end state
    forward = pfilter.focus(profile, "LlamaAttention > forward", trim=False)
    assert values(forward, "peak_space") > 0
    assert values(forward, "peak_space") > values(forward, "inuse_space")
    assert profile.default_type == "peak_space"


def test_overflowed_trace_says_so_with_the_window_and_the_count(snapshots, profiles) -> None:
    snap, profile = snapshots["handwritten_overflowed_trace"], profiles["handwritten_overflowed_trace"]
    _, _, _, unknown = brute_force_peak(snap, 0)
    assert unknown > 0
    notes = [c for c in profile.comments if "does not reach back" in c]
    assert len(notes) == 1
    note = notes[0]
    trace = snap["device_traces"][0]
    assert note.startswith("cuda:0: ")
    assert f"holds {len(trace):,} events" in note
    assert f"{unknown:,} frees in it are of allocations made before it began" in note
    assert "2026-01-01 00:00:00" in note and "UTC" in note
    assert "peak_* is the highest point within this recorded window only" in note
    # the other fixtures do not claim an overflow
    assert not any("does not reach back" in c for c in profiles["handwritten_small_trace"].comments)


def test_known_ring_buffer_size_marks_a_full_trace(snapshots) -> None:
    snap = snapshots["handwritten_small_trace"]
    n = len(snap["device_traces"][0])
    profile = torch_snapshot.from_snapshot(snap, max_entries=n)
    assert any(f"it is full ({n:,} of max_entries {n:,})" in c for c in profile.comments)
    assert not any("max_entries" in c for c in torch_snapshot.from_snapshot(snap, max_entries=n + 1).comments)


def test_oom_is_noted_with_device_sizes_and_place(profiles) -> None:
    notes = [c for c in profiles["handwritten_oom"].comments if "out of memory" in c]
    assert len(notes) == 1
    note = notes[0]
    assert note.startswith("cuda:0: out of memory at 2026-01-01")
    assert "asked for 40.0 GiB" in note
    assert "with 512.0 MiB free on the device" in note
    assert "allocated of" in note and "reserved" in note
    assert "in LlamaAttention > forward (" in note and "llama_like.py:" in note


def test_many_oom_events_are_described_twenty_times_and_counted(snapshots) -> None:
    """A trace can hold millions of oom events (a crafted file): one comment each made the report that long."""
    import copy

    snap = copy.deepcopy(snapshots["handwritten_oom"])
    trace = snap["device_traces"][0]
    oom = next(e for e in trace if e["action"] == "oom")
    trace += [dict(oom) for _ in range(100)]
    notes = [c for c in torch_snapshot.from_snapshot(snap).comments if "out of memory" in c or "out-of-memory" in c]
    assert len(notes) == 21 and notes[-1] == "cuda:0: 81 more out-of-memory events in the trace"


@pytest.mark.parametrize("line", [1 << 63, -5])
def test_a_frame_line_pprof_cannot_store_is_unknown(snapshots, line: int) -> None:
    """Found by the fuzz target of snapshot values: line 2**63 made a profile that could not be written."""
    import copy

    from gpuflame.formats import pprof

    snap = copy.deepcopy(snapshots["handwritten_oom"])
    block = next(b for seg in snap["segments"] for b in seg["blocks"] if b.get("frames"))
    block["frames"][0]["line"] = line
    profile = torch_snapshot.from_snapshot(snap)
    assert all(0 <= f.line < 1 << 63 for f in profile.frames)
    pprof.decode(pprof.encode(profile))


def test_two_devices_are_kept_apart(snapshots, profiles) -> None:
    profile = profiles["handwritten_two_devices"]
    assert profile.label_values("device") == ["cuda:0", "cuda:1"]
    for s in profile.samples:
        assert s.label("device") in ("cuda:0", "cuda:1")
    assert values(profile, "alloc_space", "cuda:0") != values(profile, "alloc_space", "cuda:1")


# -- frames ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(make_snapshots.FIXTURES))
def test_every_python_frame_has_cpythons_qualified_name(profiles, name: str) -> None:
    if sys.version_info < (3, 11):
        pytest.skip("the expected names come from co_qualname (3.11+)")
    profile = profiles[name]
    expected: defaultdict[tuple[str, int], set[str]] = defaultdict(set)
    for (file, line, _), q in make_snapshots.EXPECTED.items():
        expected[(file, line)].add(display_name(q))  # a comprehension shares its line with its function
    python = [f for f in profile.frames if f.kind == PYTHON]
    assert python
    for frame in python:
        assert frame.name in expected[(frame.file, frame.line)], frame


def test_each_snapshot_frame_resolves_to_its_co_qualname(snapshots) -> None:
    if sys.version_info < (3, 11):
        pytest.skip("the expected names come from co_qualname (3.11+)")
    from gpuflame.symbols.qualnames import Resolver

    resolver = Resolver()
    checked = 0
    for (file, line, co_name), want in make_snapshots.EXPECTED.items():
        assert resolver.display(file, line, co_name) == display_name(want), (file, line, co_name)
        checked += 1
    assert checked > 30


def test_methods_show_their_class(profiles) -> None:
    names = {f.name for f in profiles["handwritten_small_trace"].frames}
    for wanted in (
        "Linear > __init__",
        "Linear > forward",
        "LlamaMLP > __init__",
        "LlamaMLP > forward",
        "LlamaAttention > forward",
        "LlamaDecoderLayer > forward",
        "LlamaForCausalLM > generate",
        "StaticCache > update",
        "GPUModelRunner > initialize_kv_cache",
        "Module > _call_impl",
        "rotate_half",
        "main",
        "<module>",
    ):
        assert wanted in names, wanted
    assert any(n.startswith("GPUModelRunner > _allocate_kv_cache_tensors") for n in names)


def test_native_frames_with_stacks_all(profiles) -> None:
    """stacks="all": the op above the Python caller; the C++ and CPython frames go (test_torch_frames.py)."""
    profile = profiles["handwritten_native_frames"]
    names = [f.name for f in profile.frames]
    assert not any("unwind::unwind" in n or "CapturedTraceback" in n or "CUDACachingAllocator" in n for n in names)
    for s in profile.samples:
        frames = profile.stack_frames(s)
        if frames[-1].kind == SYNTHETIC:  # <backward pass>, <cached free blocks>, ...
            continue
        assert frames[0].name == "aten::empty.memory_format" and frames[0].kind == NATIVE
        assert all(f.kind == PYTHON for f in frames[1:])
        assert frames[-1].name == "<module>"
    assert not [f for f in profile.frames if f.kind == TRAMPOLINE_KIND]
    assert "Linear > __init__" in names and "LlamaAttention > __init__" in names


# -- shapes of input --------------------------------------------------------------------


def test_decode_reads_pickles_in_every_protocol_and_gzip(snapshots, profiles) -> None:
    snap = snapshots["handwritten_small_trace"]
    want = profiles["handwritten_small_trace"].totals()
    for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
        data = pickle.dumps(snap, protocol=protocol)
        assert torch_snapshot.decode(data).totals() == want
        assert torch_snapshot.decode(gzip.compress(data)).totals() == want
        assert loads(data).totals() == want  # through format detection


def test_committed_fixture_files_load() -> None:
    for path in sorted(FIXTURES.glob("handwritten_*.pickle")):
        profile = torch_snapshot.decode(path.read_bytes())
        assert profile.samples and profile.default_type == "peak_space"


def test_snapshot_without_a_trace_has_only_inuse(snapshots) -> None:
    snap = dict(snapshots["handwritten_small_trace"], device_traces=[[]])
    profile = torch_snapshot.from_snapshot(snap)
    assert profile.type_names() == ["inuse_space", "inuse_objects"]
    assert profile.default_type == "inuse_space"
    snap.pop("device_traces")
    assert torch_snapshot.from_snapshot(snap).type_names() == ["inuse_space", "inuse_objects"]


def test_bare_segment_list_is_accepted(snapshots) -> None:
    segments = snapshots["handwritten_small_trace"]["segments"]
    profile = torch_snapshot.decode(pickle.dumps(segments))
    assert values(profile, "inuse_space") == sum(s["total_size"] for s in segments)


def test_device_without_trace_next_to_one_with(snapshots) -> None:
    snap = copy.deepcopy(snapshots["handwritten_two_devices"])
    snap["device_traces"][1] = []
    profile = torch_snapshot.from_snapshot(snap)
    assert values(profile, "peak_space", "cuda:1") == values(profile, "inuse_space", "cuda:1")
    assert any(c.startswith("cuda:1: no allocation trace") for c in profile.comments)


def test_trace_without_free_completed_releases_on_request(snapshots) -> None:
    snap = copy.deepcopy(snapshots["handwritten_small_trace"])
    full = torch_snapshot.from_snapshot(snap)
    trace = snap["device_traces"][0]
    # skip_actions=["free_completed"]: the pending free at the end has no completion either way
    snap["device_traces"][0] = [e for e in trace if e["action"] != "free_completed"]
    assert values(torch_snapshot.from_snapshot(snap), "peak_space") == values(full, "peak_space")


def test_out_of_order_trace_is_replayed_in_time_order(snapshots) -> None:
    snap = copy.deepcopy(snapshots["handwritten_small_trace"])
    want = torch_snapshot.from_snapshot(snap).totals()
    random.Random(3).shuffle(snap["device_traces"][0])
    assert torch_snapshot.from_snapshot(snap).totals() == want


def test_profile_time_window(snapshots, profiles) -> None:
    trace = snapshots["handwritten_small_trace"]["device_traces"][0]
    profile = profiles["handwritten_small_trace"]
    assert profile.time_nanos == trace[0]["time_us"] * 1000
    assert profile.duration_nanos == (trace[-1]["time_us"] - trace[0]["time_us"]) * 1000


def test_context_none_gives_a_visible_no_stack_frame(snapshots) -> None:
    snap = copy.deepcopy(snapshots["handwritten_small_trace"])
    for seg in snap["segments"]:
        for b in seg["blocks"]:
            b["frames"] = []
    for e in snap["device_traces"][0]:
        e.pop("frames", None)
    profile = torch_snapshot.from_snapshot(snap)
    assert {f.name for f in profile.frames} >= {"<no stack recorded>"}
    assert values(profile, "inuse_space") == sum(s["total_size"] for s in snap["segments"])


BROKEN = [
    {"segments": 5},
    {"segments": [5]},
    {"segments": [{"blocks": []}]},
    {"segments": [{"total_size": 10, "blocks": [{"size": "x", "state": "inactive"}]}]},
    {"segments": [{"total_size": 10, "blocks": [{"size": -1, "state": "inactive"}]}]},
    {"segments": [{"total_size": 10, "blocks": [{"size": 10, "state": ("deep",)}]}]},
    {"segments": [{"total_size": 10, "blocks": [{"size": 10, "state": "active_allocated", "frames": "abc"}]}]},
    {"segments": [{"total_size": 10, "blocks": [{"size": 10, "state": "active_allocated", "frames": [5]}]}]},
    {"segments": [], "device_traces": 3},
    {"segments": [], "device_traces": [[{"action": "alloc"}]]},
    {"segments": [], "device_traces": [[{"action": "alloc", "addr": (1,), "size": 1}]]},
    {"segments": [], "device_traces": [[{"action": "alloc", "addr": 1, "size": 1.5}]]},
    {"segments": [], "device_traces": [[{"action": "free_completed", "addr": 1, "size": "big"}]]},
    {"segments": [], "device_traces": [[5]]},
    {"segments": [{"total_size": 1 << 62, "blocks": []}, {"total_size": 1 << 62, "blocks": []}]},
]


@pytest.mark.parametrize("snap", BROKEN)
def test_broken_snapshots_are_format_errors(snap: dict[str, Any]) -> None:
    with pytest.raises(ProfileFormatError):
        torch_snapshot.from_snapshot(snap)
    with pytest.raises(ProfileFormatError):
        torch_snapshot.decode(pickle.dumps(snap))


def test_not_a_snapshot_pickle_is_a_format_error() -> None:
    for obj in ([1, 2], {"a": 1}, "text", 5):
        with pytest.raises(ProfileFormatError):
            torch_snapshot.decode(pickle.dumps(obj))


def test_random_damage_to_the_dict_fails_plainly(snapshots) -> None:
    rng = random.Random("dict-damage")
    junk = [None, -1, 1.5, "x", [], {}, (1,), [[[]]], 2**70, True]
    base = snapshots["handwritten_oom"]
    outcomes = Counter()
    for _ in range(300):
        snap = copy.deepcopy(base)
        for _ in range(rng.randint(1, 3)):
            target = rng.choice(["segment", "block", "entry", "frame"])
            if target == "segment":
                d = rng.choice(snap["segments"])
            elif target == "block":
                d = rng.choice(rng.choice(snap["segments"])["blocks"])
            elif target == "entry":
                d = rng.choice(snap["device_traces"][0])
            else:
                d = rng.choice(snap["device_traces"][0][0]["frames"])
            key = rng.choice(list(d))
            if rng.random() < 0.3:
                del d[key]
            else:
                d[key] = rng.choice(junk)
        try:
            torch_snapshot.from_snapshot(snap)
            outcomes["loaded"] += 1
        except ProfileFormatError:
            outcomes["rejected"] += 1
    assert outcomes["loaded"] and outcomes["rejected"], outcomes


def test_unpickled_snapshot_shares_frames_as_torch_does(snapshots) -> None:
    # the identity memo depends on it; check the stand-ins keep torch's sharing
    snap = pickle.loads(pickle.dumps(snapshots["handwritten_small_trace"]))
    seen: defaultdict[tuple, set[int]] = defaultdict(set)
    for e in snap["device_traces"][0]:
        for f in e.get("frames", []):
            seen[(f["filename"], f["line"], f["name"])].add(id(f))
    assert all(len(ids) == 1 for ids in seen.values())
    block_lists = {id(b["frames"]) for seg in snap["segments"] for b in seg["blocks"] if b["frames"]}
    entry_lists = {id(e["frames"]) for e in snap["device_traces"][0] if e["action"] == "alloc"}
    assert block_lists <= entry_lists


# -- the timeline -------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(make_snapshots.FIXTURES))
def test_timeline_peaks_at_the_peak_and_ends_at_the_end_state(snapshots, profiles, name) -> None:
    """Max = peak_space's live allocations (the reserved rest is not in the timeline);
    last point = the end state's active blocks at their requested sizes, as the peak counts them."""
    snap, profile = snapshots[name], profiles[name]
    live_at_peak = pfilter.ignore(pfilter.ignore(profile, CACHED_FREE), ALLOCATOR_ROUNDING)
    traced = [d for d, t in enumerate(snap["device_traces"]) if t]
    assert profile.timeline is not None
    assert sorted(profile.timeline.series) == [(("device", f"cuda:{d}"),) for d in traced]
    for dev in traced:
        points = profile.timeline.series[(("device", f"cuda:{dev}"),)]
        assert max(b for _, b in points) == values(live_at_peak, "peak_space", f"cuda:{dev}")
        end = sum(
            b["requested_size"]
            for seg in snap["segments"]
            if seg["device"] == dev
            for b in seg["blocks"]
            if b["state"] in ACTIVE
        )
        assert points[-1][1] == end
        times = [e["time_us"] * 1000 for e in snap["device_traces"][dev]]
        every = [e["time_us"] * 1000 for t in snap["device_traces"] for e in t]  # the devices' one clock
        assert points[0][0] == min(times) and points[-1][0] == max(every)
        assert [t for t, _ in points] == sorted(t for t, _ in points)


def test_timeline_survives_pprof_and_stays_out_of_the_comments(profiles) -> None:
    profile = profiles["handwritten_two_devices"]
    back = loads(save_bytes(profile))
    assert back.timeline == profile.timeline
    assert back.comments == profile.comments


def test_no_timeline_without_a_trace_or_without_times(snapshots) -> None:
    snap = copy.deepcopy(snapshots["handwritten_small_trace"])
    assert torch_snapshot.from_snapshot({"segments": snap["segments"]}).timeline is None
    for e in snap["device_traces"][0]:
        e.pop("time_us")
    assert torch_snapshot.from_snapshot(snap).timeline is None


def test_a_trace_without_times_says_why_no_moment_can_be_shown(snapshots) -> None:
    """PyTorch snapshots of older versions (a real one: Maphsge4/select_n, Dec. 2023) have a trace whose
    events carry no ``time_us``: the peak and the end are exact, there is no history, and both the
    profile and ``--at``'s refusal say so instead of blaming gpuflame's older files, JAX or other tools."""
    from gpuflame.errors import GpuflameError
    from gpuflame.model import moment

    snap = copy.deepcopy(snapshots["handwritten_small_trace"])
    for e in snap["device_traces"][0]:
        e.pop("time_us")
    profile = torch_snapshot.from_snapshot(snap)
    assert profile.history is None
    assert any("carry no times" in c and "--at" in c for c in profile.comments)
    with pytest.raises(GpuflameError, match="PyTorch snapshots without a timed trace"):
        moment.at(profile, moment.PEAK)
    with_times = torch_snapshot.from_snapshot(snapshots["handwritten_small_trace"])
    assert not any("carry no times" in c for c in with_times.comments)


def save_bytes(profile: Profile) -> bytes:
    from gpuflame.formats import pprof

    return pprof.encode(profile)


def test_memory_without_a_stack_is_explained_with_its_share(snapshots, profiles) -> None:
    """``<allocated before the trace>`` and ``<no stack recorded>`` each get one note: how much, and why."""
    profile = profiles["handwritten_overflowed_trace"]
    i = profile.pick_type()
    before = sum(
        s.values[i]
        for s in profile.samples
        if s.stack and profile.frames[s.stack[0]].name == "<allocated before the trace>"
    )
    assert before > 0
    [note] = [c for c in profile.comments if c.startswith("<allocated before the trace>: ")]
    assert format_bytes(before) in note and "ring buffer had wrapped" in note and "max_entries" in note


def test_a_real_snapshot_of_weights_loaded_before_recording_says_why_they_have_no_stack() -> None:
    profile = torch_snapshot.decode((DATA / "torch-snapshot-Wedsonlin-medium_128_inference.pickle.gz").read_bytes())
    i = profile.pick_type()
    held = sum(
        s.values[i] for s in profile.samples if s.stack and profile.frames[s.stack[0]].name == "<no stack recorded>"
    )
    total = sum(s.values[i] for s in profile.samples)
    [note] = [c for c in profile.comments if c.startswith("<no stack recorded>: ")]
    assert f"{format_bytes(held)} of peak_space ({100 * held / total:.0f}%)" in note
    assert "_record_memory_history" in note


def test_a_real_snapshot_with_cuda_graph_pools_and_frees_waiting_for_their_stream() -> None:
    """verl's mem.pickle (tests/data/README.md): vLLM's KV cache and CUDA graphs' private pools
    (segment_pool_id (0, 1) and (0, 2) beside (0, 0)), 9 blocks active_pending_free, no trace. In use
    counts every active block, waiting or not; the rest of what the segments reserve is rounding and
    cached free blocks, summed here from the raw segments."""
    from gpuflame.formats import safe_pickle

    data = (DATA / "torch-untraced-snapshot-verl-mem.pickle.gz").read_bytes()
    snap = safe_pickle.loads(gzip.decompress(data))
    assert len({tuple(s["segment_pool_id"]) for s in snap["segments"]}) == 3
    blocks = [b for s in snap["segments"] for b in s["blocks"]]
    active = [b for b in blocks if b["state"] in ACTIVE]
    assert any(b["state"] == "active_pending_free" for b in active)
    profile = torch_snapshot.decode(data)
    assert profile.history is None and profile.pick_type() == profile.type_index("inuse_space")
    assert values(profile, "inuse_space") == sum(s["total_size"] for s in snap["segments"])
    assert values(profile, "inuse_objects") == len(active)
    i = profile.type_index("inuse_space")
    by_leaf: Counter = Counter()
    for sample in profile.samples:
        by_leaf[profile.frames[sample.stack[0]].name] += sample.values[i]
    assert by_leaf[CACHED_FREE] == sum(b["size"] for b in blocks if b["state"] == "inactive")
    assert by_leaf[ALLOCATOR_ROUNDING] == sum(b["size"] - b["requested_size"] for b in active)
    assert by_leaf["aten::zeros"] == sum(
        b["requested_size"] for b in active if any("at::_ops::zeros::call(" in f["name"] for f in b["frames"])
    )


def test_a_device_whose_trace_ends_first_still_holds_its_memory_on_the_strip(profiles) -> None:
    """Devices share one clock: cuda:1's last event comes 0.9 ms before cuda:0's, and what it holds then
    stays held (the strip dropped it to 0 and undercounted a real multi-GPU peak by a whole device)."""
    timeline = profiles["handwritten_two_devices"].timeline
    series = {dict(labels)["device"]: points for labels, points in timeline.series.items()}
    end = max(points[-1][0] for points in series.values())
    assert all(points[-1][0] == end for points in series.values())
    total = timeline.total()
    assert total[-1] == (end, sum(points[-1][1] for points in series.values()))
    # every moment of the strip counts each device at its last value so far
    for t, b in dict(total).items():  # the last point of each instant
        held = sum(max((p for p in points if p[0] <= t), default=(0, 0))[1] for points in series.values())
        assert b == held, t


def test_a_multi_gpu_headline_is_per_device_and_not_called_one_moment(capsys) -> None:
    """Each device's peak is its own moment: the sum is named as such, --json says it is not exact, and the
    devices' joint moment (one clock) is computed from the strip."""
    import json as json_module

    from gpuflame.cli.main import main

    path = str(FIXTURES / "handwritten_two_devices.pickle")
    assert main(["report", path, "--json"]) == 0
    peak = json_module.loads(capsys.readouterr().out)["peak"]
    profile = torch_snapshot.from_snapshot(pickle.loads(Path(path).read_bytes()))
    i = profile.type_index("peak_space")
    each = {d: sum(s.values[i] for s in profile.samples if s.label("device") == d) for d in ("cuda:0", "cuda:1")}
    assert peak["exact"] is False
    assert {d["device"]: d["peak"] for d in peak["devices"]} == each
    joint = max(profile.timeline.total(), key=lambda p: p[1])
    assert peak["devices_together"] == {"allocated": joint[1], "at_ns": joint[0]}
    assert joint[1] < sum(each.values())
    assert "2 devices, each at its own peak" in peak["description"]
    assert "the sum is not one moment" in peak["description"]
    assert main(["report", path, "--json", "--label", "device=cuda:1"]) == 0
    one = json_module.loads(capsys.readouterr().out)["peak"]
    assert one["exact"] is True and "devices_together" not in one


@pytest.mark.slow
def test_the_same_file_gives_the_same_samples_in_the_same_order() -> None:
    """Rows were grouped by a key made of addresses, and a stack whose key clashed came last:
    the sample order (and so a page made from the snapshot) changed from one read to the next."""
    data = gzip.decompress((DATA / "torch-snapshot-DeComFL-memory.pickle.gz").read_bytes())
    kept = [loads(data) for _ in range(6)]  # all alive at once, so each read's objects have other addresses
    orders = {tuple((s.stack, s.values, s.labels) for s in p.samples) for p in kept}
    assert len(orders) == 1
