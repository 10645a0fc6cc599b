"""gpuflame simulate against a real CUDA run: the replay, the CPU-recorded prediction and a what-if setting.

Skipped where there is no CUDA device (see conftest.py). One small
training loop (a two-layer MLP, AdamW, growing batches) runs in a fresh
interpreter three ways: on CUDA with the allocator's history recorded
(a real snapshot), on CUDA with ``expandable_segments:True``, and on the
CPU under gpuflame's torch backend. Then:

- the real snapshot replayed under its recorded settings makes the
  recorded segments, reaches the recorded reserved peak (which is
  ``torch.cuda.max_memory_reserved()``) and places >= 99% of allocations
  where the GPU did;
- the CPU run predicted for a GPU lands near the real reserved peak (CPU
  operators allocate differently: no cuBLAS workspace, other temporaries,
  so within 25% + 40 MiB);
- the what-if ``expandable_segments:True`` from the default run's snapshot
  lands near the real expandable run's reserved peak (within 10% + 40 MiB:
  two 20 MiB pages).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuflame.simulate.replay import Run, read_input, settings_for

MiB = 1 << 20

LOOP = """
import json, sys, torch
device, out = sys.argv[1], sys.argv[2]
if device == "cuda":
    torch.cuda.memory._record_memory_history(max_entries=1_000_000)
else:
    import gpuflame
    session = gpuflame.profile(out, backend="torch")
    session.__enter__()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).to(device)
opt = torch.optim.AdamW(model.parameters())
for step in range(6):
    x = torch.randn(256 + 96 * step, 1024, device=device)
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
if device == "cuda":
    torch.cuda.synchronize()
    torch.cuda.memory._dump_snapshot(out)
    print(json.dumps({"reserved_peak": torch.cuda.max_memory_reserved()}))
else:
    session.__exit__(None, None, None)
"""


def _run(tmp: Path, device: str, name: str, conf: str = "") -> tuple[Path, int | None]:
    out = tmp / name
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src"), "PYTORCH_CUDA_ALLOC_CONF": conf}
    done = subprocess.run(
        [sys.executable, "-c", LOOP, device, str(out)], env=env, capture_output=True, text=True, timeout=300, check=True
    )
    peak = json.loads(done.stdout.strip().splitlines()[-1])["reserved_peak"] if device == "cuda" else None
    return out, peak


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, int | None]]:
    tmp = tmp_path_factory.mktemp("simulate")
    return {
        "cuda": _run(tmp, "cuda", "default.pickle"),
        "expandable": _run(tmp, "cuda", "expandable.pickle", "expandable_segments:True"),
        "cpu": _run(tmp, "cpu", "cpu.pb.gz"),
    }


def test_the_real_snapshot_replays_as_recorded(runs):
    path, real_peak = runs["cuda"]
    inp = read_input(str(path))
    (out,) = Run(inp, settings_for(inp, None)).outcomes()
    assert out.segment_events_equal, out.notes
    assert out.simulated["reserved_peak"] == out.recorded["reserved_peak"] == real_peak
    assert out.placed_same >= 0.99, out.first_difference


def test_a_cpu_run_predicts_the_gpu_reserved_peak(runs):
    path, _ = runs["cpu"]
    _, real_peak = runs["cuda"]
    inp = read_input(str(path))
    (out,) = Run(inp, settings_for(inp, None)).outcomes()
    predicted = out.simulated["reserved_peak"]
    assert abs(predicted - real_peak) <= 0.25 * real_peak + 40 * MiB, (predicted, real_peak)


def test_expandable_segments_what_if_matches_the_real_expandable_run(runs):
    path, _ = runs["cuda"]
    _, real_expandable_peak = runs["expandable"]
    inp = read_input(str(path))
    (out,) = Run(inp, settings_for(inp, "expandable_segments:True")).outcomes()
    predicted = out.simulated["reserved_peak"]
    assert abs(predicted - real_expandable_peak) <= 0.10 * real_expandable_peak + 40 * MiB, (
        predicted,
        real_expandable_peak,
    )


def test_the_real_expandable_snapshot_replays_its_reserved_peak(runs):
    path, real_peak = runs["expandable"]
    inp = read_input(str(path))
    assert inp.recorded.expandable_segments
    (out,) = Run(inp, settings_for(inp, None)).outcomes()
    assert out.simulated["reserved_peak"] == real_peak, out.notes
