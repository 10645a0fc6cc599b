"""DDP with two ranks under torchrun (gloo, on the CPU) under ``gpuflame run``: ranks, a table per rank.

The script computes what it expects from its own model (parameters x
element size) and from the one tensor only rank 1 keeps, and prints it with
its pid and rank; the test checks the profile, ``report`` and ``report
--json`` (and ``--label rank=N``) against those numbers, never against
gpuflame's own output. One run serves every check (two ranks on two cores).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuflame.formats import load
from tests.helpers.run_cli import gpuflame_run, write

pytestmark = pytest.mark.slow

TORCHRUN = str(Path(sys.executable).parent / "torchrun")

DDP = """
import json, os, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

def build():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))

def rank_extra(rank):
    return torch.zeros(rank * 64 * 1024)  # rank 1 keeps 256 KiB more than rank 0: uneven ranks

def train(ddp, opt):
    for _ in range(2):
        ddp(torch.randn(4, 32)).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

dist.init_process_group("gloo")
rank = dist.get_rank()
model = build()
ddp = DDP(model)
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
extra = rank_extra(rank)
train(ddp, opt)
said = {"pid": os.getpid(), "rank": rank, "world": dist.get_world_size(),
        "params": sum(p.numel() * p.element_size() for p in model.parameters()),
        "extra": extra.numel() * extra.element_size()}
# one write of the whole line: print's text and newline can be two writes, and the two ranks share the pipe
os.write(1, (json.dumps(said) + "\\n").encode())
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, dict[str, Any]], dict[str, Any]]:
    """(the merged profile, rank -> what that rank's script printed, gpuflame run's --json summary)."""
    if not Path(TORCHRUN).exists():
        pytest.skip("torchrun is not installed beside this Python")
    cwd = tmp_path_factory.mktemp("ddp")
    write(cwd / "ddp.py", DDP)
    env = {"OMP_NUM_THREADS": "1"}
    done = gpuflame_run(
        "-o", "ddp.pb.gz", "--json", "--", TORCHRUN, "--standalone", "--nproc_per_node=2", "ddp.py", cwd=cwd, env=env
    )
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    ranks = {line["rank"]: line for line in lines if "rank" in line}
    summary = next(line for line in lines if "profile" in line)
    assert sorted(ranks) == [0, 1] and all(r["world"] == 2 for r in ranks.values())
    return cwd / "ddp.pb.gz", ranks, summary


def report(path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpuflame", "report", str(path), *args], capture_output=True, text=True, timeout=120
    )


def test_each_rank_s_samples_carry_its_rank_and_the_world_size(ddp_run) -> None:
    path, ranks, _ = ddp_run
    profile = load(path)
    for rank, said in ranks.items():
        own = [s for s in profile.samples if s.label("pid") == str(said["pid"])]
        assert own
        assert {(s.label("rank"), s.label("local_rank"), s.label("world_size")) for s in own} == {
            (str(rank), str(rank), "2")
        }
    ranked = {s.label("pid") for s in profile.samples if s.label("rank") is not None}
    assert ranked == {str(r["pid"]) for r in ranks.values()}  # torchrun's own process has no rank


def test_report_has_a_table_per_rank_in_rank_order_and_says_how_uneven(ddp_run) -> None:
    path, ranks, _ = ddp_run
    done = report(path, "-n", "1")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    heads = [out.index(f"rank {r} (pid {ranks[r]['pid']}, local rank {r}, world size 2): ") for r in (0, 1)]
    assert heads == sorted(heads)
    assert "-u ddp.py" in " ".join(out[heads[0] : heads[1]].split())  # the command line, wrapped or not
    flat = " ".join(out.split())  # rich wraps at the terminal's width
    assert "Ranks uneven: rank 1 peaked at" in flat and "the largest peak is" in flat


def test_report_json_processes_per_rank_with_their_own_numbers(ddp_run) -> None:
    path, ranks, _ = ddp_run
    done = report(path, "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    rows = data["processes"]
    assert [(r["rank"], r["pid"], r["world_size"]) for r in rows] == [(r, ranks[r]["pid"], 2) for r in (0, 1)]
    for row in rows:
        said = ranks[row["rank"]]
        assert row["command"][-1] == "ddp.py"
        assert row["at_joint_peak_by_category"]["parameter"] == said["params"]
        assert sum(row["at_joint_peak_by_category"].values()) == row["at_joint_peak"]
        assert row["peak"] >= row["at_joint_peak"] and row["peak_s"] is not None
    assert sum(r["at_joint_peak"] for r in rows) == data["total"]
    # rank 1 did what rank 0 did, and kept its extra tensor through the step; give or take a few bytes: each
    # rank's own peak moves with the two processes' timing (4 runs: rank 0 33,128-33,132 B, rank 1 295,272-295,292)
    assert rows[1]["peak"] - rows[0]["peak"] >= ranks[1]["extra"] - 1024 > 0
    spread = data["uneven"]
    assert spread["of"] == "ranks" and spread["largest"]["rank"] == 1 and spread["smallest"]["rank"] == 0
    assert spread["ratio"] == pytest.approx(rows[1]["peak"] / rows[0]["peak"], abs=1e-4)


@pytest.mark.parametrize("rank", [0, 1])
def test_label_rank_selects_only_that_rank_s_bytes(ddp_run, rank: int) -> None:
    path, ranks, _ = ddp_run
    done = report(path, "--json", "--label", f"rank={rank}", "-n", "50")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert [r["pid"] for r in data["processes"]] == [ranks[rank]["pid"]]
    assert data["processes"][0]["at_joint_peak_by_category"]["parameter"] == ranks[rank]["params"]
    assert data["total"] == data["processes"][0]["at_joint_peak"]
    extra = sum(e["self"] for e in data["widest_leaves"] if e["name"] == "rank_extra")
    assert extra == ranks[rank]["extra"]
    assert data["uneven"] is None  # one process shown: nothing to compare


def test_label_rank_that_is_not_there_is_one_line_and_exit_2(ddp_run) -> None:
    path, _, _ = ddp_run
    done = report(path, "--label", "rank=2")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [done.stderr.strip()] and "rank" in done.stderr


def test_run_json_lists_each_rank_with_its_pid_and_command(ddp_run) -> None:
    _, ranks, summary = ddp_run
    rows = summary["per_process"]
    assert [(r["rank"], r["pid"]) for r in rows] == [(r, ranks[r]["pid"]) for r in (0, 1)]
    assert all(r["command"][-1] == "ddp.py" for r in rows)
    assert summary["uneven"]["largest"]["pid"] == ranks[1]["pid"]
