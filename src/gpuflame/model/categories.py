"""The ``category`` label's vocabulary: what kind of memory a sample is.

One owner for the names, for the recorders (capture/books/categories.py finds
them), the analyses and views that group by them, and the rule that reads a
category from an allocating stack alone (used by every source that has no
object graph: a saved PyTorch snapshot, blocks freed before they were seen).
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuflame.model.profile import PYTHON, Frame, Profile, Sample
from gpuflame.symbols import names

LABEL = "category"

PARAMETER = "parameter"  # trainable: requires_grad (and every module buffer)
FROZEN_PARAMETER = "frozen_parameter"  # requires_grad=False: LoRA's base weights, a frozen encoder
GRADIENT = "gradient"
OPTIMIZER_STATE = "optimizer_state"
KV_CACHE = "kv_cache"
COMM_BUFFER = "comm_buffer"  # DDP's gradient buckets, FSDP's all-gather / reduce-scatter buffers, collectives' staging
ACTIVATION = "activation"
OTHER = "other"
CACHED_FREE = "cached_free"
OUTSIDE_FRAMEWORK = "outside_framework"
CATEGORIES = (
    PARAMETER,
    FROZEN_PARAMETER,
    GRADIENT,
    OPTIMIZER_STATE,
    KV_CACHE,
    COMM_BUFFER,
    ACTIVATION,
    OTHER,
    CACHED_FREE,
    OUTSIDE_FRAMEWORK,
)

# keys gpuflame's recorders add to a live PyTorch snapshot (formats/torch_snapshot.py reads them):
# the snapshot says it carries categories, an active block its category from the object graph.
# Here, not in the reader, so that recording never imports the snapshot reader.
CATEGORIES_KEY = "gpuflame_categories"
BLOCK_CATEGORY_KEY = "gpuflame_category"


# synthetic frames that stand for a category of their own
SYNTHETIC_CATEGORIES = {
    names.CACHED_FREE: CACHED_FREE,
    names.OUTSIDE_FRAMEWORK: OUTSIDE_FRAMEWORK,
}

# where KV caches are allocated (vLLM's are untested here: vLLM needs a GPU)
_KV_CACHE_FILES = ("transformers/cache_utils.py", "vllm/worker/cache_engine.py")
_KV_CACHE_FUNCTIONS = ("_allocate_kv_cache", "initialize_kv_cache", "_allocate_kv_cache_tensors")
_MODULE_SETUP = ("> __init__", "> reset_parameters", "> register_buffer")  # where torch.nn makes weights
_BACKWARD = ("backward", "_engine_run_backward", "Tensor > backward", "Function > backward")

# torch.distributed's own Python, when it is the innermost Python frame of an allocation: (file, functions or
# None for any). DDP's reducer makes its gradient buckets in ``_ddp_init_helper`` and rebuilds them in
# ``_pre_forward``; ``_sync_params_and_buffers`` broadcasts through a flat staging copy; a collective's own
# temporaries (gloo's flattened all-gather and reduce-scatter) are made under distributed_c10d.py; FSDP2 makes
# its all-gather and reduce-scatter buffers in _fsdp_collectives.py and the unsharded parameters' storage in
# _fsdp_param.py. Inputs moved to the device by DDP (``_recursive_to``) are not comm buffers, hence the lists.
_COMM_SITES: tuple[tuple[str, tuple[str, ...] | None], ...] = (
    ("torch/nn/parallel/distributed.py", ("_ddp_init_helper", "_pre_forward", "_sync_buffers", "_sync_module_buffers")),
    ("torch/distributed/utils.py", ("_sync_params_and_buffers", "_verify_param_shape_across_processes")),
    ("torch/distributed/distributed_c10d.py", None),
    ("torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py", None),
    (
        "torch/distributed/fsdp/_fully_shard/_fsdp_param.py",
        ("alloc_storage", "init_all_gather_outputs", "alloc_all_gather_outputs"),
    ),
)
# FSDP2's sharded parameters (the local shard each rank keeps) are made here
_SHARDED_PARAMETER_SITES = (("torch/distributed/fsdp/_fully_shard/_fsdp_param.py", ("_init_sharded_param",)),)


def stack_category(frames: Sequence[Frame]) -> str:
    """The category a block's allocating stack implies (leaf first): kv_cache, optimizer_state, parameter, ...

    Used for blocks the object graph never classed (freed before any profile
    or optimizer step looked): a model built and dropped before the process
    ends still shows its weights as ``parameter`` (made in a ``torch.nn``
    module's ``__init__`` or ``reset_parameters``), not ``other``; a block
    whose innermost Python frame is torch.distributed's own communication
    code is a ``comm_buffer`` (a DDP bucket made in the first ``forward`` is
    not an activation).
    """
    leaf = next((f for f in frames if f.kind == PYTHON), None)
    if leaf is not None:
        if _made_in(leaf, _COMM_SITES):
            return COMM_BUFFER
        if _made_in(leaf, _SHARDED_PARAMETER_SITES):
            return PARAMETER
    active = False
    for f in frames:
        file = f.file.replace("\\", "/")
        name = f.name
        if file.endswith(_KV_CACHE_FILES) or name.endswith(_KV_CACHE_FUNCTIONS):
            return KV_CACHE
        if name.endswith("_init_group") and "/torch/optim/" in file:
            return OPTIMIZER_STATE
        if "/torch/nn/modules/" in file and name.endswith(_MODULE_SETUP) and not active:
            return PARAMETER
        if name == "forward" or name.endswith("> forward") or name.endswith(_BACKWARD):
            active = True
    return ACTIVATION if active else OTHER


def _made_in(frame: Frame, sites: tuple[tuple[str, tuple[str, ...] | None], ...]) -> bool:
    """Whether *frame* is one of *sites*: its file ends with the site's, and a part of its name is listed."""
    file = frame.file.replace("\\", "/")
    parts = frame.name.split(" > ")
    return any(file.endswith(f) and (names_ is None or any(p in names_ for p in parts)) for f, names_ in sites)


def category_of(profile: Profile, sample: Sample) -> str | None:
    """A sample's category: its label, or the one its synthetic leaf frame stands for; None when unknown."""
    label = sample.label(LABEL)
    if label is not None:
        return label
    if sample.stack:
        leaf = profile.frames[sample.stack[0]]
        return SYNTHETIC_CATEGORIES.get(leaf.name)
    return None
