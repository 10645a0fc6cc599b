"""The torch-cuda backend on a real GPU: allocator history, OOM capture, NVML.

Skipped where there is no CUDA device (see conftest.py). On a GPU machine:

    pytest tests/gpu -q
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpuflame.capture.recorders.torch_cuda import TorchCudaRecorder
from gpuflame.formats import load, loads
from gpuflame.model.filter import ignore
from gpuflame.symbols.names import CACHED_FREE

MiB = 1 << 20


class Weights:
    def __init__(self, torch, mib: int) -> None:
        self.w = torch.empty(mib * MiB, dtype=torch.uint8, device="cuda")


class Activations:
    def spike(self, torch, mib: int) -> None:
        tmp = torch.empty(mib * MiB, dtype=torch.uint8, device="cuda")
        del tmp


def leaf_total(profile, name: str, type_name: str) -> int:
    idx = profile.type_index(type_name)
    return sum(s.values[idx] for s in profile.samples if s.stack and profile.frames[s.stack[0]].name == name)


def test_history_gives_peak_inuse_alloc_with_class_names() -> None:
    import torch

    rec = TorchCudaRecorder()
    rec.start()
    try:
        weights = Weights(torch, 64)
        Activations().spike(torch, 256)
        torch.cuda.synchronize()
        profile = rec.snapshot()
    finally:
        rec.stop()
    assert not rec.errors
    assert leaf_total(profile, "Weights > __init__", "inuse_space") >= 64 * MiB
    assert leaf_total(profile, "Activations > spike", "inuse_space") == 0
    assert leaf_total(profile, "Activations > spike", "peak_space") >= 256 * MiB
    assert leaf_total(profile, "Activations > spike", "alloc_space") >= 256 * MiB
    reserved = sum(torch.cuda.memory_reserved(i) for i in range(torch.cuda.device_count()))
    outside = leaf_total(profile, "<outside framework>", "inuse_space")
    assert profile.totals()["inuse_space"] - outside == reserved
    live = ignore(profile, CACHED_FREE).totals()["inuse_space"] - outside
    assert live == sum(torch.cuda.memory_allocated(i) for i in range(torch.cuda.device_count()))
    del weights


def test_outside_framework_matches_nvml_when_available() -> None:
    pynvml = pytest.importorskip("pynvml")
    import torch

    rec = TorchCudaRecorder()
    rec.start()
    try:
        x = torch.ones(8 * MiB, device="cuda")
        torch.cuda.synchronize()
        profile = rec.snapshot()
    finally:
        rec.stop()
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        used = sum(
            p.usedGpuMemory or 0 for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle) if p.pid == os.getpid()
        )
    finally:
        pynvml.nvmlShutdown()
    device0 = [s for s in profile.samples if s.label("device") == "cuda:0"]
    idx = profile.type_index("inuse_space")
    assert sum(s.values[idx] for s in device0) == used
    del x


def test_an_oom_writes_the_profile_and_the_workload_sees_its_oom(tmp_path: Path) -> None:
    script = tmp_path / "oom.py"
    script.write_text(
        textwrap.dedent("""
        import torch
        class KVCache:
            def allocate(self):
                free, total = torch.cuda.mem_get_info()
                return torch.empty(total * 2, dtype=torch.uint8, device="cuda")
        try:
            KVCache().allocate()
        except torch.OutOfMemoryError:
            print("caught oom", flush=True)
            raise SystemExit(9)
    """)
    )
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuflame",
            "run",
            "--backend",
            "torch-cuda",
            "-o",
            str(tmp_path / "oom.pb.gz"),
            str(script),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 9, result.stderr
    assert "caught oom" in result.stdout
    profile = load(tmp_path / "oom.pb.gz")
    assert any("out of memory" in c for c in profile.comments)


def test_save_a_real_snapshot_fixture(tmp_path: Path) -> None:
    """A real allocator snapshot of a small model, converted with the same code as files are.

    Set GPUFLAME_SAVE_FIXTURE=DIR to keep it (a few hundred KB) as a test fixture.
    """
    import torch

    torch.cuda.memory._record_memory_history(max_entries=20_000)
    try:
        model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512)).cuda()
        out = model(torch.randn(64, 512, device="cuda"))
        out.sum().backward()
        torch.cuda.synchronize()
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    data = pickle.dumps(snapshot)
    profile = loads(data)
    assert leaf_total(profile, "Linear > __init__", "inuse_space") > 0
    keep = os.environ.get("GPUFLAME_SAVE_FIXTURE")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        (Path(keep) / "real_cuda_snapshot_small_mlp.pickle").write_bytes(data)


def test_stacks_all_read_into_the_python_chain_with_the_op() -> None:
    """--native records stacks="all": the C++ chain above the Python caller, in order, nothing of the recorder."""
    import torch

    from gpuflame.formats.torch_snapshot import from_snapshot

    rec = TorchCudaRecorder(native=True)
    rec.start()
    try:
        Activations().spike(torch, 32)
        torch.cuda.synchronize()
        profile = rec.snapshot()
        default = from_snapshot(torch.cuda.memory._snapshot())
    finally:
        rec.stop()
    for p, native in ((profile, True), (default, False)):
        idx = p.type_index("alloc_space")
        chains = [[f.name for f in reversed(p.stack_frames(s))] for s in p.samples if s.values[idx]]
        spike = [c for c in chains if "Activations > spike" in c]
        assert spike, chains
        for c in spike:
            assert c[0] in ("<module>", "_run_module_as_main"), c  # python -m pytest starts in runpy
            above = c[c.index("Activations > spike") + 1 :]
            if native:
                assert any(n.startswith("at::_ops::empty") for n in above), above
            else:
                assert above and above[-1].startswith("aten::empty"), above
            assert not any(
                "CUDACachingAllocator" in n or "unwind::" in n or n in ("_start", "__libc_start_main") for n in c
            )


def test_categories_of_an_adamw_step_on_the_gpu() -> None:
    """The object graph marks the snapshot's blocks: parameters and AdamW's moments exactly (steps stay on the CPU)."""
    import torch

    from gpuflame.model.categories import LABEL

    rec = TorchCudaRecorder()
    rec.start()
    try:
        model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256)).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x = torch.randn(32, 256, device="cuda")
        model(x).square().mean().backward()
        opt.step()
        torch.cuda.synchronize()
        profile = rec.snapshot()
    finally:
        rec.stop()
    idx = profile.type_index("inuse_space")
    inuse: dict[str, int] = {}
    for s in profile.samples:
        inuse[s.label(LABEL) or ""] = inuse.get(s.label(LABEL) or "", 0) + s.values[idx]
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    state_on_gpu = sum(
        t.untyped_storage().nbytes()
        for st in opt.state.values()
        for t in st.values()
        if torch.is_tensor(t) and t.is_cuda
    )
    assert inuse["parameter"] == params
    assert inuse["gradient"] == params
    assert inuse["optimizer_state"] == state_on_gpu >= 2 * params


def test_phases_on_a_real_trace() -> None:
    """The marks (time.time_ns) and PyTorch's trace clock (time_us) agree: each phase's own peak is exact."""
    import torch

    import gpuflame
    from gpuflame.capture.books import phases

    rec = TorchCudaRecorder()
    rec.start()
    try:
        with gpuflame.phase("load_model"):
            weights = Weights(torch, 64)
        with gpuflame.phase("serve"):
            Activations().spike(torch, 256)
        torch.cuda.synchronize()
        profile = rec.snapshot()
    finally:
        rec.stop()
        phases.switch(0)
    assert not rec.errors and weights.w.numel() == 64 * MiB
    rows = {r.phase: r for r in profile.phases}
    assert (rows["load_model"].peak, rows["load_model"].inuse_end) == (64 * MiB, 64 * MiB)
    assert (rows["serve"].peak, rows["serve"].inuse_end) == (320 * MiB, 64 * MiB)
    assert rows["serve"].top == "Activations > spike"
    idx = profile.type_index("alloc_space")
    by_phase = {}
    for s in profile.samples:
        by_phase[s.label("phase")] = by_phase.get(s.label("phase"), 0) + s.values[idx]
    assert by_phase["load_model"] == 64 * MiB and by_phase["serve"] == 256 * MiB
