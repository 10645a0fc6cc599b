"""Profiles for the HTML viewer's tests (tests/unit/cli/test_view.py, tests/browser/).

Realistic names from the AKS guide (``LlamaMLP > __init__``,
``GPUModelRunner > _allocate_kv_cache_tensors``), a trampoline, native and
synthetic frames, two processes, and names, files and labels that would be
markup or script if a page ever treated them as HTML.
"""

from __future__ import annotations

import re

from gpuflame.model import Frame, Profile, memory_sample_types
from gpuflame.render.html import decode_payload

MiB = 1024 * 1024

XSS_IMG = "<img src=x onerror=alert(1)>"
XSS_SCRIPT = "</script><script>alert(2)</script>"
XSS_COMMENT_FILE = "/app/<!--evil-->.py"
XSS_LABEL = "<svg onload=alert(3)>"

MODULE = Frame("<module>", "/app/serve.py", 1)
MAIN = Frame("main", "/app/serve.py", 10)
FOR_CAUSAL_LM = Frame("LlamaForCausalLM > __init__", "/app/modeling_llama.py", 700)
DECODER_LAYER = Frame("LlamaDecoderLayer > __init__", "/app/modeling_llama.py", 300)
MLP_INIT = Frame("LlamaMLP > __init__", "/app/modeling_llama.py", 99)
LINEAR_INIT = Frame("Linear > __init__", "/torch/nn/modules/linear.py", 96)
TRAMPOLINE_FRAME = Frame("<interpreter trampoline>", "", 0, "trampoline")
INIT_KV = Frame("GPUModelRunner > initialize_kv_cache", "/vllm/worker/gpu_model_runner.py", 2400)
ALLOC_KV = Frame("GPUModelRunner > _allocate_kv_cache_tensors", "/vllm/worker/gpu_model_runner.py", 2300)
NATIVE = Frame("0x7f151deadbeef", "/usr/lib/libcuda.so.1", 0, "native")
CACHED = Frame("<cached free blocks>", "", 0, "synthetic")
IMG = Frame(XSS_IMG, XSS_COMMENT_FILE, 5)
SCRIPT = Frame(XSS_SCRIPT, "/app/serve.py", 20)

# Per sample: the stack (root first, reversed when added), then MiB for
# peak, inuse, alloc (objects are 1 per sample). Peak adds up to 100 MiB,
# of which LlamaMLP > __init__ holds 30 (two stacks); in use adds up to 80.
STACKS = [
    ([MODULE, MAIN, FOR_CAUSAL_LM, DECODER_LAYER, MLP_INIT, LINEAR_INIT], (20, 20, 40), "1", "cuda:0"),
    ([MODULE, MAIN, FOR_CAUSAL_LM, DECODER_LAYER, TRAMPOLINE_FRAME, MLP_INIT], (10, 0, 10), "1", "cuda:0"),
    ([MODULE, MAIN, INIT_KV, ALLOC_KV, NATIVE], (55, 55, 55), "1", "cuda:0"),
    ([MODULE, MAIN, IMG], (5, 1, 5), "2", XSS_LABEL),
    ([MODULE, MAIN, SCRIPT], (5, 1, 5), "2", XSS_LABEL),
    ([CACHED], (5, 3, 0), "1", "cuda:0"),
]

PEAK_TOTAL = 100 * MiB
INUSE_TOTAL = 80 * MiB
MLP_PEAK = 30 * MiB


def viewer_profile() -> Profile:
    """The profile described above, all six memory sample types."""
    p = Profile(sample_types=memory_sample_types())
    p.comments = ["made by the viewer tests"]
    for stack, (peak, inuse, alloc), pid, device in STACKS:
        values = {
            "peak_space": peak * MiB,
            "peak_objects": 1 if peak else 0,
            "inuse_space": inuse * MiB,
            "inuse_objects": 1 if inuse else 0,
            "alloc_space": alloc * MiB,
            "alloc_objects": 1 if alloc else 0,
        }
        p.add(stack[::-1], values, {"pid": pid, "device": device})
    return p


def wide_profile(functions: int, depth: int = 12, seed: int = 7) -> Profile:
    """A synthetic profile with about *functions* distinct frames, for size and speed checks."""
    import random

    rng = random.Random(seed)
    p = Profile(sample_types=memory_sample_types())
    frames = [
        Frame(f"Module{i // 8} > method_{i}", f"/site-packages/pkg{i % 97}/mod{i % 13}.py", 10 + i % 500)
        for i in range(functions)
    ]
    # Roots come from small pools (one root, a few callers under it), so the
    # graph has wide bars as real programs do; the middle is random, and the
    # two leaf frames walk the table so every frame is used.
    samples = max(functions // 2, 1)
    for s in range(samples):
        root_side = [frames[0], frames[1 + rng.randrange(4)], frames[5 + rng.randrange(32)]]
        middle = [frames[rng.randrange(functions)] for _ in range(depth - 5)]
        leaves = [frames[(s * 2 + 1) % functions], frames[(s * 2) % functions]]
        stack = (root_side + middle + leaves)[::-1]
        size = rng.randrange(1, 64) * MiB
        p.add(stack, [size, 1, size // 2, 1, size * 2, 2])
    return p


# Diff mode: BASE against viewer_profile() as NEW. The KV cache grew (40 ->
# 55 MiB), the Linear under LlamaMLP shrank (30 -> 20), a warm-up stack
# vanished (7 MiB, BASE only), the cached blocks stayed at 5 MiB.
WARMUP = Frame("Engine > warmup", "/vllm/engine.py", 50)
BASE_STACKS = [
    ([MODULE, MAIN, FOR_CAUSAL_LM, DECODER_LAYER, MLP_INIT, LINEAR_INIT], 30),
    ([MODULE, MAIN, FOR_CAUSAL_LM, DECODER_LAYER, TRAMPOLINE_FRAME, MLP_INIT], 10),
    ([MODULE, MAIN, INIT_KV, ALLOC_KV, NATIVE], 40),
    ([MODULE, MAIN, WARMUP], 7),
    ([CACHED], 5),
]
BASE_PEAK_TOTAL = 92 * MiB


def base_profile() -> Profile:
    """The BASE of the diff tests: the same MiB in every byte type, one object per sample."""
    p = Profile(sample_types=memory_sample_types())
    for stack, mib in BASE_STACKS:
        values = {
            "peak_space": mib * MiB,
            "peak_objects": 1,
            "inuse_space": mib * MiB,
            "inuse_objects": 1,
            "alloc_space": mib * MiB,
            "alloc_objects": 1,
        }
        p.add(stack[::-1], values, {"pid": "1", "device": "cuda:0"})
    return p


# Grouping: <module> calls "other" and a chain of five frames with one
# callee each and no self (Chain > s1 ... Chain > s5), which calls two leaves.
CHAIN = [Frame(f"Chain > s{i}", "/app/chain.py", i) for i in range(1, 6)]


def chain_profile() -> Profile:
    p = Profile(sample_types=memory_sample_types()[:1])
    p.add([Frame("other", "/app/chain.py", 90), MODULE], [3 * MiB])
    p.add([Frame("leaf_a", "/app/chain.py", 91), *CHAIN[::-1], MODULE], [10 * MiB])
    p.add([Frame("leaf_b", "/app/chain.py", 92), *CHAIN[::-1], MODULE], [5 * MiB])
    return p


DATA_ELEMENT = re.compile(r'<script type="application/octet-stream" id="gpuflame-data">([A-Za-z0-9+/=]*)</script>')


def embedded(html: str) -> dict:
    match = DATA_ELEMENT.search(html)
    assert match, "no data element"
    return decode_payload(match.group(1))
