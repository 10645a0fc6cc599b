"""Categories of distributed training, through ``gpuflame run`` and its merge: DDP and FSDP2 under torchrun.

Two ranks on the CPU (gloo), as a user runs them. Each rank writes what it
expects, computed from its model, its optimizer and DDP's own reducer
(``_get_zeros_like_grad_buckets``: a copy of each gradient bucket), never
from the recorder. The merged file must agree with each process's own
view: its gradients are ``gradient`` and its buckets ``comm_buffer`` at the
run's joint peak and at the end, whichever process set the peak.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from gpuflame.formats import load  # noqa: E402
from gpuflame.model import Profile, moment  # noqa: E402
from tests.helpers.cli import run_json  # noqa: E402
from tests.helpers.run_cli import gpuflame_run, write  # noqa: E402

DDP_SCRIPT = """
import json, os, sys, time, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

view = sys.argv[2] == "view"
dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
ddp = DDP(model, gradient_as_bucket_view=view)
buckets = sum(b.buffer().numel() * b.buffer().element_size() for b in ddp.reducer._get_zeros_like_grad_buckets())
opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
ddp(torch.randn(8, 64)).sum().backward()
opt.step()
stepped = time.time_ns()  # every rank holds its parameters, gradients, buckets and state from here on
spike = torch.empty(4 << 20, dtype=torch.uint8)  # both ranks hold it across the barrier: the run's joint peak
dist.barrier()
del spike
dist.barrier()
params = sum(p.numel() * p.element_size() for p in model.parameters())
steps = sum(s["step"].numel() * s["step"].element_size() for s in opt.state.values())
views = all(p.grad.untyped_storage().nbytes() == buckets for p in model.parameters())
with open(os.path.join(sys.argv[1], f"{os.getpid()}.json"), "w") as f:
    json.dump({"params": params, "buckets": buckets, "steps": steps, "views": views, "stepped": stepped}, f)
dist.destroy_process_group()  # the model, its gradients and DDP's reducer live on to the end of the process
"""


FSDP2_SCRIPT = """
import json, os, sys, torch, torch.distributed as dist
from torch.distributed.fsdp import fully_shard

def storages(tensors):
    \"\"\"Bytes of the distinct storages of each tensor's local shard (a DTensor's _local_tensor).\"\"\"
    found = {}
    for t in tensors:
        local = getattr(t, "_local_tensor", t)
        found[local.untyped_storage().data_ptr()] = local.untyped_storage().nbytes()
    return sum(found.values())

dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
unsharded = sum(p.numel() * p.element_size() for p in model.parameters())
for layer in (model[0], model[2]):
    fully_shard(layer)
fully_shard(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
model(torch.randn(8, 64)).sum().backward()
opt.step()
state = [t for s in opt.state.values() for t in s.values()]
with open(os.path.join(sys.argv[1], f"{os.getpid()}.json"), "w") as f:
    json.dump({
        "params": storages(model.parameters()),
        "grads": storages(p.grad for p in model.parameters()),
        "state": storages(state),
        "unsharded": unsharded,
    }, f)
dist.destroy_process_group()
"""


def torchrun(tmp_path: Path, script: str, *args: str, hook: str = "allocator") -> tuple[Profile, dict[int, dict]]:
    """``gpuflame run -- torchrun --nproc_per_node=2 script`` in *tmp_path*: the merged profile, each rank's json."""
    write(tmp_path / "job.py", script)
    (tmp_path / "out").mkdir()
    run = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "job.py", "out", *args]
    result = gpuflame_run("--torch-hook", hook, "-o", "run.pb.gz", "--", sys.executable, *run, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    ranks = {int(p.stem): json.loads(p.read_text()) for p in (tmp_path / "out").glob("*.json")}
    assert len(ranks) == 2
    return load(tmp_path / "run.pb.gz"), ranks


def by_category(profile: Profile, type_name: str, pid: int, leaf: str | None = None) -> dict[str, int]:
    """Bytes per category of one process (of the samples whose leaf function is *leaf*, if given)."""
    col = profile.type_index(type_name)
    out: dict[str, int] = {}
    for s in profile.samples:
        if s.label("pid") != str(pid) or not s.values[col]:
            continue
        if leaf is not None and profile.frames[s.stack[0]].name != leaf:
            continue
        out[s.label("category") or ""] = out.get(s.label("category") or "", 0) + s.values[col]
    return out


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize(("hook", "view"), [("allocator", False), ("allocator", True), ("dispatch", False)])
def test_ddp_gradients_and_buckets_keep_each_rank_s_categories_through_the_merge(
    tmp_path: Path, hook: str, view: bool
) -> None:
    merged, ranks = torchrun(tmp_path, DDP_SCRIPT, "view" if view else "copy", hook=hook)
    for pid, want in ranks.items():
        params, buckets = want["params"], want["buckets"]
        assert params > 100_000 and buckets == params  # one bucket: every parameter's gradient, flat
        assert want["views"] is view  # with gradient_as_bucket_view the gradients are the bucket itself
        # at the bucket-as-gradient view, the bucket counts once: as the gradients, with no comm_buffer beside it
        comm = 0 if view else buckets
        own = load(tmp_path / f"run.pb.gz.processes/proc-{pid}.pb.gz")
        # the run's joint peak (the merged file's peak) and this process's own peak, then the end
        for profile, column in ((merged, "peak_space"), (own, "peak_space"), (merged, "inuse_space")):
            got = by_category(profile, column, pid)
            # gloo's barrier keeps a one-element tensor while it waits: a collective's staging buffer
            barrier = by_category(profile, column, pid, leaf="barrier")
            assert set(barrier) <= {"comm_buffer"} and barrier.get("comm_buffer", 0) <= 8, (column, barrier)
            assert got["parameter"] == params, (column, got)
            assert got["gradient"] == params, (column, got)
            assert got.get("comm_buffer", 0) - barrier.get("comm_buffer", 0) == comm, (column, got)
            assert got["optimizer_state"] == 2 * params + want["steps"], (column, got)
            assert "activation" not in got or got["activation"] < params // 4, (column, got)
    assert not [c for c in merged.comments if "come from the allocating stacks" in c]


@pytest.mark.slow
@pytest.mark.subprocess
def test_fsdp2_shards_are_parameters_and_gradients_its_gathers_comm_buffers(tmp_path: Path) -> None:
    """FSDP2's ``fully_shard`` on the CPU (gloo): each rank's shards, read through the DTensors, are exact."""
    merged, ranks = torchrun(tmp_path, FSDP2_SCRIPT)
    for pid, want in ranks.items():
        assert 0 < want["params"] < want["unsharded"]  # a shard: about half of the model on each of 2 ranks
        end = by_category(merged, "inuse_space", pid)
        assert end["parameter"] == want["params"], end
        assert end["gradient"] == want["grads"], end  # views of the reduce-scatter's output
        assert end["optimizer_state"] == want["state"], end
        assert not {"activation", "comm_buffer"} & set(end), end
        # every parameter was gathered whole at least once, into FSDP's all-gather buffers
        assert by_category(merged, "alloc_space", pid)["comm_buffer"] >= want["unsharded"]


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize(("hook", "view"), [("allocator", False), ("allocator", True), ("dispatch", False)])
def test_ddp_any_moment_of_the_merged_run_gives_each_rank_s_categories(
    tmp_path: Path, hook: str, view: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--at`` and ``--between`` on the merged file: each block is what the process holding it classed it.

    With ``gradient_as_bucket_view`` the bucket is the gradients: made when DDP is built (a ``comm_buffer``
    by its stack), classed ``gradient`` later, so ``gradient`` from its allocation on, and counted once."""
    merged, ranks = torchrun(tmp_path, DDP_SCRIPT, "view" if view else "copy", hook=hook)
    # both ranks are past their optimizer step and short of the first barrier's end: both hold everything
    after_step = (max(want["stepped"] for want in ranks.values()) - moment.origin(merged)) / 1e9
    for when in (after_step, moment.PEAK):  # the strip's peak: the run's joint peak, the spike on both ranks
        at = moment.at(merged, when)
        for pid, want in ranks.items():
            params, buckets = want["params"], 0 if view else want["buckets"]
            got = by_category(at, "inuse_space", pid)
            barrier = by_category(at, "inuse_space", pid, leaf="barrier").get("comm_buffer", 0)
            assert got["parameter"] == params, (when, got)
            assert got["gradient"] == params, (when, got)
            assert got.get("comm_buffer", 0) - barrier == buckets, (when, got)
            assert got["optimizer_state"] == 2 * params + want["steps"], (when, got)
    window = moment.between(merged, 0.0, after_step)
    for pid, want in ranks.items():
        got = by_category(window, "alloc_space", pid)
        assert got["parameter"] == want["params"], got  # made once, after the recording started
        # one backward pass; with views, autograd's own gradients too: each is the parameter's .grad until
        # DDP copies it into the bucket and puts the bucket's view there
        assert got["gradient"] == (2 if view else 1) * want["params"], got
        assert got["optimizer_state"] == 2 * want["params"] + want["steps"], got
    # the command a user runs: gpuflame top --at on the merged file, one rank
    pid = min(ranks)
    top = run_json(capsys, "top", tmp_path / "run.pb.gz", "--at", "peak", "--by", "category", "--label", f"pid={pid}")
    shown = {row["category"]: row["total"] for row in top["categories"]}
    assert shown["gradient"] == shown["parameter"] == ranks[pid]["params"], shown
