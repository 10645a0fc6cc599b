"""A vLLM-shaped profile after the AKS guide's example (KV cache, weights, compile, cache)."""

from __future__ import annotations

from gpuflame.model import Frame, Profile, memory_sample_types
from gpuflame.model.profile import NATIVE, SYNTHETIC, TRAMPOLINE_KIND

GiB = 1 << 30


MiB = 1 << 20


# guide_profile's KV-cache stack, root first: the AKS guide's own example chain
GUIDE_KV_CHAIN = [
    "0x7f151",
    "<interpreter trampoline>",
    "<module>",
    "EngineCoreProc > run_engine_core",
    "EngineCore > __init__",
    "EngineCore > _initialize_kv_caches",
    "Worker > initialize_from_config",
    "GPUModelRunner > initialize_kv_cache",
    "GPUModelRunner > _allocate_kv_cache_tensors",
]


def guide_profile() -> Profile:
    """A vLLM-shaped profile after the AKS guide's example: KV cache, weights, compile, cache."""
    site = "/usr/lib/python3/site-packages/vllm/v1"
    entry = [
        Frame("0x7f151", kind=NATIVE),
        Frame("<interpreter trampoline>", kind=TRAMPOLINE_KIND),
        Frame("<module>", "/app/serve.py", 1, start_line=1),
        Frame("EngineCoreProc > run_engine_core", f"{site}/engine/core.py", 500, start_line=500),
        Frame("EngineCore > __init__", f"{site}/engine/core.py", 60, start_line=60),
    ]
    kv = entry + [
        Frame("EngineCore > _initialize_kv_caches", f"{site}/engine/core.py", 120, start_line=120),
        Frame("Worker > initialize_from_config", f"{site}/worker/gpu_worker.py", 200, start_line=200),
        Frame("GPUModelRunner > initialize_kv_cache", f"{site}/worker/gpu_model_runner.py", 2100, start_line=2100),
        Frame(
            "GPUModelRunner > _allocate_kv_cache_tensors", f"{site}/worker/gpu_model_runner.py", 2010, start_line=2010
        ),
    ]
    load = entry + [
        Frame("Worker > load_model", f"{site}/worker/gpu_worker.py", 150, start_line=150),
        Frame("LlamaForCausalLM > __init__", "/models/llama.py", 500, start_line=500),
        Frame("LlamaMLP > __init__", "/models/llama.py", 80, start_line=80),
    ]
    compile_ = entry + [
        Frame("Worker > compile_or_warm_up_model", f"{site}/worker/gpu_worker.py", 300, start_line=300),
        Frame("_compile_fx_inner", "/usr/lib/python3/site-packages/torch/_inductor/compile_fx.py", 400, start_line=400),
    ]
    profile = Profile(sample_types=memory_sample_types())
    profile.default_type = "peak_space"

    def add(root_first: list[Frame], size: int, device: str = "cuda:0", inuse: int | None = None) -> None:
        inuse = size if inuse is None else inuse
        profile.add(root_first[::-1], [size, 1, inuse, 1, 3 * size, 3], {"device": device, "pid": "4242"})

    add(kv, 40 * GiB)
    add(kv, 15 * GiB, "cuda:1")
    add(load, 14 * GiB)
    add(load[:-1], 300 * MiB)  # LlamaForCausalLM allocates a little itself
    add(compile_, 2 * GiB, inuse=0)
    add([Frame("<cached free blocks>", kind=SYNTHETIC)], 3 * GiB)
    profile.comments.append("trace ring buffer overflowed; peak only over the recorded window")
    return profile
