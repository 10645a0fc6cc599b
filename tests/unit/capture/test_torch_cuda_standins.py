"""The ``torch-cuda`` recorder's plumbing, with PyTorch's CUDA entry points replaced by stand-ins.

There is no GPU where these tests run, so what CUDA would answer is played by
stand-ins, and says so: ``torch.cuda.memory._snapshot()`` returns the
HAND-WRITTEN snapshots of tests/fixtures/make_snapshots.py (a simulation of
the caching allocator, see its README), NVML is a small fake ``pynvml``
module, and the OOM observer is called by the test as the allocator would
call it. What is checked is gpuflame's side: what it asks PyTorch for, that a
live snapshot gives the numbers ``gpuflame convert`` gives for the same
dict, ``<outside framework>`` from NVML (pid and CUDA_VISIBLE_DEVICES
honoured), the ``gpu_model`` label, and the profile written at an OOM. The
same recorder against a real GPU is tests/gpu/test_torch_cuda.py.
"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
make_snapshots = pytest.importorskip("tests.fixtures.make_snapshots")

from gpuflame.boundary.settings import Settings  # noqa: E402
from gpuflame.capture import recorders  # noqa: E402
from gpuflame.capture.recorders import torch_cuda  # noqa: E402
from gpuflame.capture.recorders.torch_cuda import TorchCudaRecorder  # noqa: E402
from gpuflame.capture.session import Session  # noqa: E402
from gpuflame.errors import GpuflameError  # noqa: E402
from gpuflame.formats import load, save  # noqa: E402
from gpuflame.formats.torch_snapshot import from_snapshot  # noqa: E402
from gpuflame.model import Profile, ignore, moment  # noqa: E402
from gpuflame.symbols.names import CACHED_FREE, OUTSIDE_FRAMEWORK  # noqa: E402

MiB = 1 << 20


class StandInCuda:
    """What the recorder calls in torch.cuda, answered from a hand-written snapshot."""

    def __init__(self, snapshot: dict[str, Any]) -> None:
        self.snapshot = snapshot
        self.history_calls: list[dict[str, Any]] = []
        self.observers: list[Any] = []

    def reserved(self, device: int = 0) -> int:
        return sum(s["total_size"] for s in self.snapshot["segments"] if s["device"] == device)

    def devices(self) -> int:
        return len(self.snapshot["device_traces"])

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", lambda **kw: self.history_calls.append(kw))
        monkeypatch.setattr(torch.cuda.memory, "_snapshot", lambda: self.snapshot)
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", self.devices)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H200")
        monkeypatch.setattr(torch.cuda, "memory_reserved", self.reserved)
        monkeypatch.setattr(torch._C, "_cuda_attach_out_of_memory_observer", self.observers.append, raising=False)


def fake_nvml(used: dict[int, list[tuple[int, int]]]) -> types.ModuleType:
    """A stand-in ``pynvml``: physical GPU index -> [(pid, used bytes)]."""
    nvml = types.ModuleType("pynvml")
    nvml.nvmlInit = lambda: None  # type: ignore[attr-defined]
    nvml.nvmlShutdown = lambda: None  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetHandleByIndex = lambda index: index  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetComputeRunningProcesses = lambda handle: [  # type: ignore[attr-defined]
        types.SimpleNamespace(pid=pid, usedGpuMemory=size) for pid, size in used.get(handle, [])
    ]
    return nvml


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch) -> Iterator[StandInCuda]:
    stand_in = StandInCuda(make_snapshots.build_all()["handwritten_small_trace"])
    stand_in.install(monkeypatch)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # no NVML unless a test installs one
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    yield stand_in


def outside(profile: Profile, type_name: str) -> dict[str, int]:
    idx = profile.type_index(type_name)
    out: dict[str, int] = {}
    for s in profile.samples:
        if profile.frames[s.stack[0]].name == OUTSIDE_FRAMEWORK:
            device = s.label("device") or ""
            out[device] = out.get(device, 0) + s.values[idx]
    return out


def test_start_asks_for_history_with_python_stacks_or_native(cuda: StandInCuda) -> None:
    TorchCudaRecorder(max_entries=1234).start()
    TorchCudaRecorder(native=True).start()
    assert cuda.history_calls[0] == {"enabled": "all", "context": "all", "stacks": "python", "max_entries": 1234}
    assert cuda.history_calls[1]["stacks"] == "all"
    assert len(cuda.observers) == 2  # each recorder listens for OOMs


def test_a_live_snapshot_gives_what_convert_gives_for_the_same_dict(cuda: StandInCuda) -> None:
    rec = TorchCudaRecorder()
    rec.start()
    live = rec.snapshot()
    rec.stop()
    assert cuda.history_calls[-1] == {"enabled": None}  # stop turns the history off
    offline = from_snapshot(cuda.snapshot)
    assert live.totals() == offline.totals() and live.totals()["peak_space"] > live.totals()["inuse_space"] > 0
    assert {s.label("gpu_model") for s in live.samples} == {"NVIDIA H200"}
    assert rec.errors == []


def test_outside_framework_is_this_process_nvml_usage_beyond_reserved(
    cuda: StandInCuda, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    reserved = cuda.reserved(0)
    # physical GPU 3 is torch's cuda:0; another process on it must not count
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    nvml = fake_nvml({3: [(os.getpid(), reserved + 300 * MiB), (os.getpid() + 1, 5000 * MiB)], 0: [(os.getpid(), 1)]})
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    profile = TorchCudaRecorder().snapshot()
    assert outside(profile, "inuse_space") == {"cuda:0": 300 * MiB}
    assert outside(profile, "peak_space") == {"cuda:0": 300 * MiB}
    assert any("<outside framework>" in c and "NVML" in c for c in profile.comments)
    # in use now adds up to what NVML says the process holds, less PyTorch's cached free blocks
    assert profile.totals()["inuse_space"] == from_snapshot(cuda.snapshot).totals()["inuse_space"] + 300 * MiB


def test_without_nvml_there_is_no_outside_frame_and_no_error(cuda: StandInCuda) -> None:
    rec = TorchCudaRecorder()
    profile = rec.snapshot()
    assert outside(profile, "inuse_space") == {} and rec.errors == []


def test_an_oom_writes_the_profile_at_that_moment(cuda: StandInCuda, tmp_path: Path) -> None:
    cuda.snapshot = make_snapshots.build_all()["handwritten_oom"]
    out = tmp_path / "oom.pb.gz"
    session = Session(Settings(session_dir=str(tmp_path), backend="torch-cuda", follow=False), path=out)
    session.add(recorders.create("torch-cuda", session))
    assert cuda.observers and not out.exists()
    cuda.observers[-1](0, 40 << 30, 79 << 30, 512 * MiB)  # the allocator, on an out-of-memory error
    profile = load(out)
    assert any("CUDA out of memory on cuda:0: asked for 42949672960 bytes" in c for c in profile.comments)
    assert profile.totals() == {**from_snapshot(cuda.snapshot).totals()}
    session.finish()


def test_a_failing_oom_write_does_not_reach_the_workload(cuda: StandInCuda, capsys: pytest.CaptureFixture[str]) -> None:
    def broken() -> None:
        raise OSError(28, "No space left on device")

    rec = TorchCudaRecorder(on_oom=broken)
    rec.start()
    cuda.observers[-1](0, 1 << 30, 2 << 30, 0)  # must not raise: the OOM error itself is the workload's
    assert len(rec.errors) == 1 and "No space left on device" in capsys.readouterr().err
    assert not rec.degraded  # later snapshots still work
    assert rec.snapshot().totals()["inuse_space"] > 0


@pytest.mark.parametrize("native", [False, True])
def test_torch_cuda_native_reads_stacks_as_convert_does(monkeypatch: pytest.MonkeyPatch, native: bool) -> None:
    """``torch-cuda --native`` and ``gpuflame convert --native`` share one reading of stacks="all"."""
    stand_in = StandInCuda(make_snapshots.build_all()["handwritten_native_frames_py311"])
    stand_in.install(monkeypatch)
    monkeypatch.setitem(sys.modules, "pynvml", None)
    live = TorchCudaRecorder(native=native).snapshot()
    offline = from_snapshot(stand_in.snapshot, native=native)

    def chains(p: Profile) -> set[tuple[str, ...]]:
        return {tuple(f.name for f in p.stack_frames(s)) for s in p.samples}

    assert chains(live) == chains(offline)
    cpp = any("torch::autograd::THPVariable_zeros" in chain for chain in chains(live))
    assert cpp == native
    assert any(chain[-1] == "<backward pass>" for chain in chains(live))


def test_categories_from_the_object_graph_and_the_stacks(cuda: StandInCuda, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stand-in: CUDA blocks cannot exist here, so the hand-written snapshot's blocks are moved (with their
    trace events) to the addresses of real CPU tensors: two become a module's parameters, one a parameter's
    ``.grad``; the graph walk is the real one. The rest are classed by their stacks."""
    from gpuflame.capture.books.categories import CATEGORIES, LABEL

    model = torch.nn.Linear(4, 4)
    model.weight.grad = torch.zeros_like(model.weight)
    targets = [model.weight, model.bias, model.weight.grad]
    blocks = [b for seg in cuda.snapshot["segments"] for b in seg["blocks"] if b["state"] == "active_allocated"]
    moved = dict(zip((b["address"] for b in blocks[:3]), (t.data_ptr() for t in targets), strict=True))
    for b in blocks[:3]:
        b["address"] = moved[b["address"]]
    for event in cuda.snapshot["device_traces"][0]:
        event["addr"] = moved.get(event["addr"], event["addr"])
    monkeypatch.setattr(torch_cuda, "outside_framework_bytes", lambda torch: {0: 300 * MiB})
    rec = TorchCudaRecorder()
    rec.start()
    profile = rec.snapshot()

    def by(type_name: str, of: Profile = profile) -> dict[str, int]:
        idx, out = of.type_index(type_name), {}
        for s in of.samples:
            assert s.label(LABEL) in CATEGORIES, s
            out[s.label(LABEL)] = out.get(s.label(LABEL), 0) + s.values[idx]
        return out

    inuse = by("inuse_space")
    # the other weights the simulated model made in torch.nn's Linear.__init__ are parameters by their stack
    leaf = [b["frames"][0] for b in blocks[3:]]
    by_stack = sum(
        b["requested_size"]
        for b, f in zip(blocks[3:], leaf, strict=True)
        if f["name"] == "__init__" and f["filename"].endswith("nn/modules/linear.py")
    )
    assert by_stack > 0
    assert inuse["parameter"] == blocks[0]["requested_size"] + blocks[1]["requested_size"] + by_stack
    assert inuse["gradient"] == blocks[2]["requested_size"]
    kv = sum(b["requested_size"] for b in blocks if b["frames"][1]["name"] == "_allocate_kv_cache_tensors")
    assert kv > 0 and inuse["kv_cache"] == kv  # vLLM's KV-cache allocation, by its stack
    assert inuse["outside_framework"] == 300 * MiB
    cached = sum(b["size"] for seg in cuda.snapshot["segments"] for b in seg["blocks"] if b["state"] == "inactive")
    assert inuse["cached_free"] == cached
    assert by("peak_space")["parameter"] == inuse["parameter"]  # alive from before the peak to the end
    # any moment (the event history): at the trace's last event, the live blocks as the end classes them
    end = moment.at(profile, (cuda.snapshot["device_traces"][0][-1]["time_us"] * 1000 - moment.origin(profile)) / 1e9)
    allocated = {k: v for k, v in inuse.items() if k not in ("cached_free", "outside_framework")}
    assert {k: v for k, v in by("inuse_space", end).items() if v} == allocated


def test_phases_replayed_against_the_trace(cuda: StandInCuda, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stand-in: the hand-written snapshot's trace runs on its own clock, so the phase marks are stamped on
    it (``phases._clock``) at three of its moments; the expected peaks come from a naive replay here."""
    from gpuflame.capture.books import phases
    from gpuflame.model.phases import LABEL

    trace = cuda.snapshot["device_traces"][0]
    cuts = [trace[0]["time_us"] - 5, trace[50]["time_us"] + 1, trace[110]["time_us"] + 1]
    clock = [t * 1000 for t in cuts]
    monkeypatch.setattr(phases, "_clock", lambda: clock.pop(0) if clock else 0)
    monkeypatch.setattr(torch_cuda, "outside_framework_bytes", lambda torch: {0: 300 * MiB})
    rec = TorchCudaRecorder()
    rec.start()
    try:
        for name in ("load_model", "train", "generate"):
            phases.switch(phases.intern(name))
        profile = rec.snapshot()
    finally:
        rec.stop()
        phases.switch(0)

    def live_after(i: int) -> int:  # naive: every allocation up to event i, less those freed by then
        live: dict[int, int] = {}
        for e in trace[: i + 1]:
            if e["action"] == "alloc":
                live[e["addr"]] = e["size"]
            elif e["action"] == "free_completed":
                live.pop(e["addr"], None)
        return sum(live.values())

    spans = {"load_model": (cuts[0], cuts[1]), "train": (cuts[1], cuts[2]), "generate": (cuts[2], 1 << 62)}
    rows = {r.phase: r for r in profile.phases}
    assert list(rows) == ["load_model", "train", "generate"]
    for name, (a, b) in spans.items():
        inside = [i for i, e in enumerate(trace) if a <= e["time_us"] < b]
        entry = live_after(inside[0] - 1) if inside[0] else 0
        assert rows[name].peak == max([entry] + [live_after(i) for i in inside]), name
        assert rows[name].inuse_end == live_after(inside[-1]), name
        assert rows[name].start == a * 1000 and rows[name].pid == str(os.getpid())
        allocated = sum(e["size"] for e in trace if e["action"] == "alloc" and a <= e["time_us"] < b)
        labelled = sum(s.values[profile.type_index("alloc_space")] for s in profile.samples if s.label(LABEL) == name)
        assert labelled == allocated, name
    peak_phase = max(rows.values(), key=lambda r: r.peak)
    assert peak_phase.peak == sum(
        s.values[profile.type_index("peak_space")]
        for s in profile.samples
        if not profile.frames[s.stack[0]].name.startswith("<")
    )
    assert rec.errors == []
    assert all(s.label(LABEL) is not None for s in profile.samples)  # <outside framework> too: <none>


# -- any moment: the trace ring buffer is the event history -------------------------------


def _at(profile: Profile, time_us: int) -> dict[str, int]:
    """moment.at at a trace time (the strip's 0 is the trace's first event)."""
    shown = moment.at(profile, (time_us * 1000 - moment.origin(profile)) / 1e9)
    return shown.totals()


def test_any_moment_of_the_stand_in_trace_is_what_the_allocator_held(cuda: StandInCuda, tmp_path: Path) -> None:
    """Weights, then a KV cache, then a step: at each mark, exactly the requested bytes alive then."""
    st = make_snapshots.Stacks()
    dev = make_snapshots.Device(0)
    weights = [dev.malloc(512 * 512 * 4, st.attn_init) for _ in range(3)]
    loaded = dev.clock
    kv = [dev.malloc(1024 * 16 * 128 * 2, st.kv_cache) for _ in range(2)]
    cached = dev.clock
    scores = dev.malloc(3 * MiB, st.attn_scores)
    dev.free(scores, st.attn_scores)
    done = dev.clock
    cuda.snapshot = make_snapshots.snapshot([dev])
    rec = TorchCudaRecorder()
    rec.start()
    path = tmp_path / "cuda.pb.gz"
    save(rec.snapshot(), path)
    rec.stop()
    profile = load(path)
    w, k = 3 * 512 * 512 * 4, 2 * 1024 * 16 * 128 * 2
    assert _at(profile, loaded) == {"inuse_space": w, "inuse_objects": 3}
    assert _at(profile, cached) == {"inuse_space": w + k, "inuse_objects": 5}
    assert _at(profile, done) == {"inuse_space": w + k, "inuse_objects": 5}
    window = moment.between(
        profile, (cached * 1000 - moment.origin(profile)) / 1e9 + 1e-6, (done * 1000 - moment.origin(profile)) / 1e9
    )
    assert window.totals() == {"alloc_space": 3 * MiB, "alloc_objects": 1}
    assert moment.at(profile, "peak").totals()["inuse_space"] == w + k + 3 * MiB
    assert len(weights) + len(kv) == 5


def test_a_wrapped_ring_buffer_answers_from_its_first_event_on(cuda: StandInCuda) -> None:
    """Before the trace's first event the state is not known: said, not guessed; from it on, exact."""
    cuda.snapshot = make_snapshots.build_all()["handwritten_overflowed_trace"]
    rec = TorchCudaRecorder()
    rec.start()
    profile = rec.snapshot()
    rec.stop()
    first = cuda.snapshot["device_traces"][0][0]["time_us"]
    assert moment.origin(profile) == first * 1000
    end = moment.at(profile, (moment.end_ns(profile, profile.history) - moment.origin(profile)) / 1e9)
    no_cache = ignore(profile, CACHED_FREE)
    assert end.totals()["inuse_space"] == no_cache.totals()["inuse_space"]  # the blocks, read independently
    assert moment.at(profile, "peak").totals()["inuse_space"] == no_cache.totals()["peak_space"]
    with pytest.raises(GpuflameError, match="not available: the history begins at 0.000 s, where the allocator"):
        moment.between(profile, 0, 0.001)
