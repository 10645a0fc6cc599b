"""The ``category`` label (capture/books/categories.py) on both recorders of the ``torch`` backend.

Exact bytes per category on real transformers models built from a config
(random weights): an AdamW training loop and a generate loop with a static
KV cache. Expectations come from the model, the optimizer and the cache
themselves (``numel() * element_size()``, storages' ``nbytes()``), never from
the recorder.
"""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from gpuflame.capture.books import categories  # noqa: E402
from gpuflame.capture.books.categories import Block, split_rows, stack_category  # noqa: E402
from gpuflame.capture.recorders.dispatch import TorchTensorRecorder  # noqa: E402
from gpuflame.formats import load  # noqa: E402
from gpuflame.model import Frame, Profile  # noqa: E402
from tests.helpers.run_cli import gpuflame_run  # noqa: E402
from tests.helpers.torch_helpers import INUSE, PEAK, RECORDERS, record, tiny_llama_config  # noqa: E402


def by_category(profile: Profile, col: int) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in profile.samples:
        name = s.label(categories.LABEL)
        assert name in categories.CATEGORIES, s
        out[name] = out.get(name, 0) + s.values[col]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("recorder", RECORDERS)
def test_adamw_training_loop_exact_per_category(recorder: str) -> None:
    def train() -> tuple[Any, Any]:
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(tiny_llama_config())
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        ids = torch.randint(0, 128, (2, 16))
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
        opt.zero_grad(set_to_none=True)  # the gradients of the peak are gone before the profile
        return model, opt

    profile, (model, opt), _ = record(RECORDERS[recorder], train)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    steps = sum(s["step"].numel() * s["step"].element_size() for s in opt.state.values())
    assert params > 300_000 and steps == 4 * len(list(model.parameters()))
    inuse = by_category(profile, INUSE)
    assert inuse["parameter"] == params + buffers  # buffers count as parameters (rotary inv_freq here)
    assert inuse["optimizer_state"] == 2 * params + steps
    assert inuse.get("gradient", 0) == 0
    # the peak is the first step (state made while the gradients live): after backward
    peak = by_category(profile, PEAK)
    assert peak["gradient"] == params
    assert peak["parameter"] == params + buffers
    assert peak["optimizer_state"] == 2 * params + steps


@pytest.mark.slow
@pytest.mark.subprocess  # inductor compiles with g++
def test_a_compiled_optimizer_step_keeps_its_state_optimizer_state() -> None:
    """torch.compile of ``opt.step`` keeps the optimizer's state as buffers of its graph module.

    The graph walk made every buffer a ``parameter`` first: AdamW's 264,720 B of
    state read as ``parameter`` (397,072 B where the weights are 132,352; a trial).
    A buffer now yields to the other roles. The allocator hook sees what the
    compiled code allocates (the dispatch mode does not: docs/backends.md).
    """
    torch._dynamo.reset()

    def train() -> tuple[Any, Any]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        step = torch.compile(opt.step)
        for _ in range(2):
            model(torch.randn(4, 16)).sum().backward()
            step()
            opt.zero_grad(set_to_none=True)
        return model, opt

    profile, (model, opt), _ = record(RECORDERS["allocator"], train)
    graph_buffers = [
        b for o in gc.get_objects() if issubclass(type(o), torch.fx.GraphModule) for b in o._buffers.values()
    ]
    assert any(b is s["exp_avg"] for b in graph_buffers for s in opt.state.values())  # the case at hand
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    state = sum(t.untyped_storage().nbytes() for s in opt.state.values() for t in s.values())
    inuse = by_category(profile, INUSE)
    assert (inuse["parameter"], inuse["optimizer_state"]) == (params, state)
    assert state == 2 * params + 4 * len(opt.state)


@pytest.mark.slow
@pytest.mark.parametrize("recorder", RECORDERS)
@pytest.mark.parametrize("keep", [True, False])
def test_generate_with_static_cache_exact_kv_cache(recorder: str, keep: bool) -> None:
    cfg = tiny_llama_config()
    model = transformers.LlamaForCausalLM(cfg).eval()

    def generate() -> tuple[Any, int]:
        cache = transformers.StaticCache(config=cfg, max_cache_len=64)
        ids = torch.randint(0, 128, (1, 8))
        with torch.no_grad():
            model.generate(ids, cache=cache, max_new_tokens=6, do_sample=False)
        storages = {
            t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in categories._tensors_in(vars(cache), 4)
        }
        return (cache if keep else None), sum(storages.values())

    profile, (_cache, expected), _ = record(RECORDERS[recorder], generate)
    layers = cfg.num_hidden_layers
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    assert expected >= 2 * layers * cfg.num_key_value_heads * 64 * head_dim * 4
    assert by_category(profile, PEAK)["kv_cache"] == expected
    assert by_category(profile, INUSE).get("kv_cache", 0) == (expected if keep else 0)


@pytest.mark.parametrize("recorder", RECORDERS)
def test_weights_of_a_model_freed_before_the_profile_stay_parameters(recorder: str) -> None:
    """The demo's case: the model is gone when the profile is written; its RMSNorm weights, made by
    ``torch.ones`` in transformers' own ``__init__`` (no torch.nn frame), are still ``parameter``."""

    def build_run_and_drop() -> int:
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(tiny_llama_config()).eval()
        weights = {
            t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
            for t in (*model.parameters(), *model.buffers())
        }
        with torch.no_grad():
            model(input_ids=torch.randint(0, 128, (1, 8)))
        return sum(weights.values())

    profile, expected, _ = record(RECORDERS[recorder], build_run_and_drop)
    norms = [
        s
        for s in profile.samples
        if s.stack
        and "RMSNorm" in profile.frames[s.stack[0]].name
        and profile.frames[s.stack[0]].name.endswith("__init__")
    ]
    assert norms and all(s.label(categories.LABEL) == "parameter" for s in norms if s.values[PEAK])
    assert by_category(profile, PEAK)["parameter"] == expected
    assert by_category(profile, INUSE).get("parameter", 0) == 0


@pytest.mark.parametrize("recorder", RECORDERS)
def test_gradients_without_an_optimizer_are_gradients(recorder: str) -> None:
    """A hand-written SGD step (no torch.optim) that drops the gradients: at the peak they were gradients,
    not the activations their backward-pass stack suggests."""

    def train() -> int:
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(tiny_llama_config())
        ids = torch.randint(0, 128, (2, 16))
        grads = 0
        for _ in range(2):
            model(input_ids=ids, labels=ids).loss.backward()
            grads = sum(p.grad.untyped_storage().nbytes() for p in model.parameters())
            scratch = torch.empty(16 << 20, dtype=torch.uint8)  # the peak: every gradient alive, no activation
            del scratch
            with torch.no_grad():
                for p in model.parameters():
                    p -= 1e-3 * p.grad
                    p.grad = None
        return grads

    profile, grads, _ = record(RECORDERS[recorder], train)
    assert grads > 300_000
    assert by_category(profile, PEAK)["gradient"] == grads


@pytest.mark.slow
@pytest.mark.parametrize("recorder", RECORDERS)
def test_lora_fine_tune_base_weights_frozen_adapters_trainable(recorder: str) -> None:
    """peft's LoRA on a Llama built from a config: the base weights peft froze are ``frozen_parameter``,
    the adapters (and the buffers) ``parameter``, AdamW's state twice the adapters plus its steps."""
    peft = pytest.importorskip("peft")

    def fine_tune() -> tuple[Any, Any]:
        torch.manual_seed(0)
        base = transformers.LlamaForCausalLM(tiny_llama_config())
        model = peft.get_peft_model(base, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
        ids = torch.randint(0, 128, (2, 16))
        for _ in range(2):
            opt.zero_grad(set_to_none=True)
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
        return model, opt  # the last step's gradients are kept

    profile, (model, opt), _ = record(RECORDERS[recorder], fine_tune)
    nbytes = [(p.requires_grad, p.numel() * p.element_size()) for p in model.parameters()]
    frozen = sum(n for trains, n in nbytes if not trains)
    adapters = sum(n for trains, n in nbytes if trains)
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    steps = sum(s["step"].numel() * s["step"].element_size() for s in opt.state.values())
    assert frozen > 20 * adapters > 0 and steps == 4 * len(opt.state)
    inuse = by_category(profile, INUSE)
    assert inuse["frozen_parameter"] == frozen
    assert inuse["parameter"] == adapters + buffers
    assert inuse["gradient"] == adapters
    assert inuse["optimizer_state"] == 2 * adapters + steps


def test_stack_category_rules() -> None:
    fwd = Frame("LlamaMLP > forward", "/x/modeling_llama.py", 3)
    cache = Frame("StaticLayer > lazy_initialization", "/site-packages/transformers/cache_utils.py", 9)
    init = Frame("AdamW > _init_group", "/site-packages/torch/optim/adamw.py", 9)
    assert stack_category([cache, fwd]) == "kv_cache"
    assert stack_category([init, Frame("main", "/a.py")]) == "optimizer_state"
    assert stack_category([Frame("helper", "/a.py"), fwd]) == "activation"
    assert stack_category([Frame("backward", "/site-packages/torch/autograd/__init__.py")]) == "activation"
    assert stack_category([Frame("main", "/a.py")]) == "other"
    linear = Frame("Linear > __init__", "/site-packages/torch/nn/modules/linear.py")
    assert stack_category([Frame("empty", "/a.py"), linear, Frame("<module>", "/a.py")]) == "parameter"
    assert stack_category([linear, fwd]) == "parameter"  # a layer made in a forward: still its weights
    assert stack_category([Frame("Net > __init__", "/a.py")]) == "other"  # not torch.nn's: the graph must tell


def test_stack_category_comm_buffers_by_the_innermost_python_frame() -> None:
    ddp = "/site-packages/torch/nn/parallel/distributed.py"
    fwd = Frame("DistributedDataParallel > forward", ddp, 5)
    rebuild = Frame("DistributedDataParallel > _pre_forward", ddp, 9)
    assert stack_category([rebuild, fwd]) == "comm_buffer"  # buckets rebuilt in the first forward: no activation
    assert stack_category([Frame("DistributedDataParallel > _ddp_init_helper", ddp)]) == "comm_buffer"
    native = Frame("c10d::Reducer::initialize_buckets", "libtorch.so", kind="native")
    assert stack_category([native, rebuild, fwd]) == "comm_buffer"  # --native: the Python frame decides
    to_device = Frame("_recursive_to > to_map", "/site-packages/torch/distributed/utils.py")
    assert stack_category([to_device, Frame("DistributedDataParallel > _to_kwargs", ddp), fwd]) == "activation"
    fsdp = "/site-packages/torch/distributed/fsdp/_fully_shard/"
    gather = Frame("all_gather_single", "/site-packages/torch/distributed/distributed_c10d.py")
    assert stack_category([gather, Frame("foreach_all_gather", fsdp + "_fsdp_collectives.py"), fwd]) == "comm_buffer"
    outputs = Frame("FSDPParam > init_all_gather_outputs > <listcomp>", fsdp + "_fsdp_param.py")
    assert stack_category([outputs]) == "comm_buffer"
    assert stack_category([Frame("FSDPParam > _init_sharded_param", fsdp + "_fsdp_param.py")]) == "parameter"
    # user code that merely calls a collective's caller is not a comm buffer
    assert stack_category([Frame("helper", "/a.py"), gather]) == "other"


def test_split_rows_moves_live_and_gone_blocks() -> None:
    rows = {0: [100, 3, 60, 2, 500, 9]}  # site 0: made in backward (activation by its stack)
    blocks = [Block(1, 40, 0, True, 0), Block(2, 20, 0, False, 2)]  # graph says parameter; tag says gradient
    out = split_rows(rows, lambda site: "activation", blocks, [(0, 2, 30, 1)], {1: "parameter"})
    assert out[(0, "parameter")] == [40, 1, 40, 1, 0, 0]
    assert out[(0, "gradient")] == [30, 1, 20, 1, 0, 0]
    assert out[(0, "activation")] == [30, 1, 0, 0, 500, 9]


def test_split_rows_moves_the_joint_peak_pair_by_each_block_s_own_category() -> None:
    """A process whose own peak was another moment: its blocks live at the run's joint peak keep their category."""
    rows = {0: [100, 3, 60, 2, 500, 9, 70, 3]}  # with the joint-peak pair: 70 B in 3 blocks at the joint peak
    blocks = [Block(1, 40, 0, False, 0, True), Block(2, 20, 0, True, 2, False)]  # live at the joint / own peak
    out = split_rows(rows, lambda site: "activation", blocks, [], {1: "gradient"}, [(0, 5, 10, 1)])
    assert out[(0, "gradient")] == [20, 1, 60, 2, 0, 0, 40, 1]  # the joint pair moves with block 1 only
    assert out[(0, "frozen_parameter")] == [0, 0, 0, 0, 0, 0, 10, 1]  # tag 5: freed since the joint peak
    assert out[(0, "activation")] == [80, 2, 0, 0, 500, 9, 20, 1]
    assert categories.TAGGED[5 - 1] == "frozen_parameter"


def test_split_rows_allocated_bytes_follow_when_every_block_moved() -> None:
    out = split_rows({0: [8, 1, 8, 1, 8, 1]}, lambda site: "other", [Block(1, 8, 0, True, 0)], [], {1: "parameter"})
    assert out == {(0, "parameter"): [8, 1, 8, 1, 8, 1]}


def test_optimizer_step_hooks_removed_at_stop() -> None:
    from torch.optim import optimizer as optim_module

    before = len(optim_module._global_optimizer_pre_hooks)
    rec = TorchTensorRecorder()
    rec.start()
    assert len(optim_module._global_optimizer_pre_hooks) == before + 1
    from torch.nn.modules import module as nn_module

    registered = len(nn_module._global_parameter_registration_hooks)
    rec.stop()
    assert len(optim_module._global_optimizer_pre_hooks) == before
    assert len(nn_module._global_parameter_registration_hooks) == registered - 1


TRAIN_SCRIPT = """
import json, sys, torch, transformers
cfg = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=200, n_positions=32, use_cache=False)
model = transformers.GPT2LMHeadModel(cfg)  # tied input and output embeddings: one storage
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
x = torch.randint(0, 200, (1, 4))  # small activations: the peak is the first step, after backward
for _ in range(3):
    model(input_ids=x, labels=x).loss.backward()
    opt.step()
    opt.zero_grad()
p = sum(t.numel() * t.element_size() for t in model.parameters())
b = sum(t.numel() * t.element_size() for t in model.buffers())
s = sum(st["step"].numel() * st["step"].element_size() for st in opt.state.values())
json.dump({"params": p, "buffers": b, "steps": s}, open(sys.argv[1], "w"))
"""


@pytest.mark.subprocess
@pytest.mark.parametrize("hook", ["allocator", "dispatch"])
def test_gpuflame_run_labels_a_training_script(tmp_path: Path, hook: str) -> None:
    """End to end, as a user runs it: ``gpuflame run`` on a GPT-2 training loop nobody wrote for gpuflame."""
    (tmp_path / "train.py").write_text(TRAIN_SCRIPT)
    result = gpuflame_run("--torch-hook", hook, "-o", "run.pb.gz", "train.py", "sizes.json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    sizes = json.loads((tmp_path / "sizes.json").read_text())
    profile = load(str(tmp_path / "run.pb.gz"))
    inuse, peak = by_category(profile, profile.type_index("inuse_space")), by_category(profile, PEAK)
    assert inuse["parameter"] == sizes["params"] + sizes["buffers"]
    assert inuse["optimizer_state"] == 2 * sizes["params"] + sizes["steps"]
    assert peak["gradient"] == sizes["params"]  # the first step's peak: after backward, all gradients live
