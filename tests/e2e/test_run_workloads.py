"""Real workloads under ``gpuflame run``: exact bytes, every process present, per-pid peaks.

Each script computes its own expected sizes from the tensors it made
(``untyped_storage().nbytes()``, ``Array.nbytes``) and prints them; the test
compares those with what the profile holds under the script's own
functions, per pid. Models are small and built from a config with random
weights (no downloads). ``multiprocessing.Pool`` (fork, spawn, forkserver)
is in tests/e2e/test_run_exit.py, with the signals its ``terminate()`` sends.

Only per-process (pid label) values are checked here: how the merged peak
of several processes is computed is tested with the merge itself.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from gpuflame.formats import load
from gpuflame.model import Profile
from tests.helpers.run_cli import gpuflame_run, write

pytestmark = pytest.mark.slow


def under(profile: Profile, function: str, type_name: str) -> dict[int, int]:
    """pid -> bytes of *type_name* in samples whose stack passes through *function*."""
    idx = profile.type_index(type_name)
    out: dict[int, int] = {}
    for s in profile.samples:
        if any(profile.frames[f].name == function for f in s.stack):
            pid = int(s.label("pid"))
            out[pid] = out.get(pid, 0) + s.values[idx]
    return out


def run_json(result: subprocess.CompletedProcess) -> tuple[list[dict], dict]:
    """(the script's JSON lines, gpuflame's --json summary)."""
    lines = [json.loads(line) for line in result.stdout.strip().splitlines()]
    return lines[:-1], lines[-1]


ADAMW = """
import json, os, torch
from transformers import GPT2Config, GPT2LMHeadModel

def build():
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=128, n_positions=32,
                        bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config)

def optimizer_step(opt):
    opt.step()

def train(model, opt, steps):
    for _ in range(steps):
        ids = torch.randint(0, 128, (2, 16))
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer_step(opt)
        opt.zero_grad(set_to_none=True)

model = build()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
train(model, opt, 3)
params = list(model.parameters())
storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in [*params, *model.buffers()]}
state = [t for s in opt.state.values() for t in s.values() if torch.is_tensor(t)]
print(json.dumps({"pid": os.getpid(), "model": sum(storages.values()),
                  "params": sum(p.untyped_storage().nbytes() for p in params), "n_params": len(params),
                  "state": sum(t.untyped_storage().nbytes() for t in state)}))
"""


MARKED = (
    ADAMW.replace("model = build()\n", "model = build()\nbuilt = time.time_ns()\n")
    .replace("train(model, opt, 3)\n", "train(model, opt, 3)\ntrained = time.time_ns()\n")
    .replace(
        'print(json.dumps({"pid": os.getpid(),',
        'print(json.dumps({"built": built, "trained": trained, "pid": os.getpid(),',
    )
    .replace("import json, os, torch", "import json, os, time, torch")
)


@pytest.fixture(scope="module")
def adamw_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, Path]:
    """ADAMW, stamped with the moments its model was built and trained, under ``gpuflame run --json``: once.

    The stamps (two ``time.time_ns()`` calls) allocate nothing; the tests only read the run's result and profile.
    """
    folder = tmp_path_factory.mktemp("adamw")
    script = write(folder / "marked.py", MARKED)
    result = gpuflame_run(
        "--json", "-o", "marked.pb.gz", script.name, cwd=folder, env={"TRANSFORMERS_VERBOSITY": "error"}
    )
    return result, folder / "marked.pb.gz"


def test_adamw_training_loop_on_a_transformers_model(adamw_run: tuple[subprocess.CompletedProcess, Path]) -> None:
    result, path = adamw_run
    assert result.returncode == 0, result.stderr
    (sizes,), run = run_json(result)
    pid = sizes["pid"]
    # AdamW keeps exp_avg and exp_avg_sq per parameter, and a float32 step count
    assert sizes["state"] == 2 * sizes["params"] + 4 * sizes["n_params"]
    assert run["processes"] == [pid] and run["lost"] == []
    profile = load(path)
    assert under(profile, "build", "inuse_space") == {pid: sizes["model"]}
    assert under(profile, "optimizer_step", "inuse_space") == {pid: sizes["state"]}
    assert profile.totals()["inuse_space"] == sizes["model"] + sizes["state"]  # gradients were set to None
    assert under(profile, "optimizer_step", "peak_space")[pid] == sizes["state"]


LOADER = """
import json, os, torch
from torch.utils.data import DataLoader, Dataset

class Squares(Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        return torch.full((64,), float(i * i)), os.getpid()

if __name__ == "__main__":
    loader = DataLoader(Squares(), batch_size=4, num_workers=2)
    items = {}
    for batch, pids in loader:
        for pid in pids.tolist():
            items[pid] = items.get(pid, 0) + 1
    print(json.dumps({"items": items, "item": torch.full((64,), 0.0).untyped_storage().nbytes(),
                      "batch_size": loader.batch_size, "parent": os.getpid()}))
"""


def test_dataloader_workers_each_have_their_profile(tmp_path: Path) -> None:
    script = write(tmp_path / "loader.py", LOADER)
    result = gpuflame_run("--json", "-o", "loader.pb.gz", script.name, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    (sizes,), run = run_json(result)
    workers = {int(pid): n for pid, n in sizes["items"].items()}
    assert len(workers) == 2 and sum(workers.values()) == 16
    assert set(run["processes"]) == {sizes["parent"], *workers} and run["lost"] == []
    profile = load(tmp_path / "loader.pb.gz")
    made = "Squares > __getitem__"
    assert under(profile, made, "alloc_space") == {pid: n * sizes["item"] for pid, n in workers.items()}
    # a worker holds one batch of items at a time (collate copies them into shared memory): its own peak,
    # in its own file; the merged peak is one moment of the run, when a worker may be between batches or
    # part way through making one (CI saw 256 B: one item of the next batch)
    batch = sizes["batch_size"] * sizes["item"]
    for pid in workers:
        own = load(tmp_path / "loader.pb.gz.processes" / f"proc-{pid}.pb.gz")
        assert under(own, made, "peak_space") == {pid: batch}
    joint = under(profile, made, "peak_space")
    assert all(v % sizes["item"] == 0 and 0 <= v <= batch for v in joint.values()), joint
    assert batch <= sum(joint.values()) <= 2 * batch, joint


DDP = """
import json, os, sys, torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

def build_model():
    torch.manual_seed(0)
    return torch.nn.Linear(32, 16)

def make_batch(rank):
    return torch.full((8, 32), float(rank))

def worker(rank, world, rendezvous):
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    model = DistributedDataParallel(build_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batch = make_batch(rank)
    model(batch).sum().backward()
    opt.step()
    line = json.dumps({"rank": rank, "pid": os.getpid(), "batch": batch.untyped_storage().nbytes(),
                       "params": sum(p.untyped_storage().nbytes() for p in model.parameters())})
    os.write(1, (line + "\\n").encode())  # one write: the two ranks share stdout (print writes the newline apart)
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(worker, args=(2, sys.argv[1]), nprocs=2)
"""


def test_ddp_with_gloo_on_two_processes(tmp_path: Path) -> None:
    script = write(tmp_path / "ddp.py", DDP)
    result = gpuflame_run("--json", "-o", "ddp.pb.gz", script.name, str(tmp_path / "rendezvous"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    ranks, run = run_json(result)
    assert sorted(r["rank"] for r in ranks) == [0, 1]
    pids = {r["pid"] for r in ranks}
    assert pids <= set(run["processes"]) and run["lost"] == []
    profile = load(tmp_path / "ddp.pb.gz")
    params = {r["pid"]: r["params"] for r in ranks}
    batch = {r["pid"]: r["batch"] for r in ranks}
    assert under(profile, "build_model", "alloc_space") == params
    assert under(profile, "make_batch", "alloc_space") == batch
    # each rank's own peak (its backward) holds its parameters and its batch
    assert under(profile, "build_model", "peak_space") == params
    assert under(profile, "make_batch", "peak_space") == batch


JAX_JIT = """
import json, os
import jax, jax.numpy as jnp

@jax.jit
def affine(x):
    return x * 2.0 + 1.0

def make_input():
    return jnp.ones((128, 64), dtype=jnp.float32)

def step(x):
    return affine(x)

x = make_input()
y = step(x)
y.block_until_ready()
print(json.dumps({"pid": os.getpid(), "x": x.nbytes, "y": y.nbytes}))
"""


def test_jax_jit(tmp_path: Path) -> None:
    script = write(tmp_path / "jit.py", JAX_JIT)
    result = gpuflame_run("--json", "-o", "jit.pb.gz", script.name, cwd=tmp_path, env={"JAX_PLATFORMS": "cpu"})
    assert result.returncode == 0, result.stderr
    (sizes,), run = run_json(result)
    pid = sizes["pid"]
    assert run["processes"] == [pid] and run["lost"] == []
    profile = load(tmp_path / "jit.pb.gz")
    for type_name in ("inuse_space", "peak_space"):
        assert under(profile, "make_input", type_name) == {pid: sizes["x"]}
        assert under(profile, "step", type_name) == {pid: sizes["y"]}


def test_any_moment_of_a_run_from_the_command_line(
    adamw_run: tuple[subprocess.CompletedProcess, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """``gpuflame run``, then ``report --at`` at moments the script stamped: exactly what it held then."""
    from gpuflame.cli.main import main
    from gpuflame.model import moment

    result, path = adamw_run
    assert result.returncode == 0, result.stderr
    (sizes,), _ = run_json(result)
    start = moment.origin(load(path))
    for mark, held in (("built", sizes["model"]), ("trained", sizes["model"] + sizes["state"])):
        capsys.readouterr()
        assert main(["report", str(path), "--at", f"{(sizes[mark] - start) / 1e9:.9f}", "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["sample_type"] == "inuse_space" and report["total"] == held, mark
