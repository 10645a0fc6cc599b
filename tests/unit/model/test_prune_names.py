"""--prune-framework keeps what says what the memory is: the entry the user called and the class's own method.

An AdamW training loop under ``gpuflame run``: the optimizer state
(exp_avg and exp_avg_sq for every parameter, plus a 4-byte step per
parameter) must show as ``Adam > _init_group`` with its exact bytes, and
``explain Adam`` must find it. Native frames are never the user's code.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuflame.model import Frame, Profile, SampleType, prune_framework
from gpuflame.model.profile import NATIVE
from tests.helpers.cli import run_json
from tests.helpers.run_cli import gpuflame_run

TRAIN = """\
import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(256, 512)

    def forward(self, x):
        return self.fc(x)


def train():
    net = Net()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    x = torch.randn(8, 256)
    for _ in range(2):
        opt.zero_grad()
        net(x).sum().backward()
        opt.step()
    return net, opt


kept = train()
"""
PARAM_BYTES = (256 * 512 + 512) * 4
STATE_BYTES = 2 * PARAM_BYTES + 2 * 4  # exp_avg, exp_avg_sq; a float32 step per parameter


@pytest.fixture(scope="module")
def adamw(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("adamw")
    (folder / "train.py").write_text(TRAIN)
    done = gpuflame_run("-o", "train.pb.gz", "--backend", "torch", "train.py", cwd=folder)
    assert done.returncode == 0, done.stderr
    return folder / "train.pb.gz"


@pytest.mark.subprocess
def test_adamw_state_is_named_after_adam_with_its_exact_bytes(capsys, adamw):
    top = run_json(capsys, "top", adamw, "--type", "inuse", "--prune-framework")
    by_name = {f["name"]: f["self"] for f in top["functions"]}
    assert by_name["Adam > _init_group"] == STATE_BYTES
    assert by_name["Linear > __init__"] == PARAM_BYTES
    assert not any("profile_hook_step" in name for name in by_name)  # the entry calls on: no self


@pytest.mark.subprocess
def test_explain_adam_finds_the_state_after_pruning(capsys, adamw):
    ex = run_json(capsys, "explain", adamw, "Adam", "--type", "inuse", "--prune-framework")
    assert [f["name"] for f in ex["functions"]] == ["Adam > _init_group"]
    assert ex["total"] == STATE_BYTES
    steps = [s["name"] for s in ex["chains"][0]["steps"]]
    assert steps == ["<module>", "train", "Optimizer > profile_hook_step > wrapper", "Adam > _init_group"]


def test_native_frames_are_pruned_as_framework():
    t = SampleType("inuse_space", "bytes")
    p = Profile(sample_types=[t])
    lib = "/venv/lib/python3.11/site-packages/torch/lib/libtorch_cpu.so"
    p.add(
        [
            Frame("at::detail::empty_generic", lib, kind=NATIVE),
            Frame("at::_ops::zeros::call", lib, kind=NATIVE),
            Frame("build", "/app/x.py", 6, start_line=4),
            Frame("0x7f15deadbeef", "/usr/lib/libfoo.so", kind=NATIVE),  # native between user frames
            Frame("main", "/app/x.py", 11, start_line=10),
            Frame("0x7f151", kind=NATIVE),  # the launcher below the outermost user frame stays
        ],
        [100],
    )
    pruned = prune_framework(p)
    [sample] = pruned.samples
    assert [f.name for f in pruned.stack_frames(sample)] == ["at::_ops::zeros::call", "build", "main", "0x7f151"]
    assert pruned.totals() == p.totals()
