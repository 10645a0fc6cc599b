"""Slowdown of the demo's generate loop on the CPU under the ``torch`` backend and under torch.profiler.

One process, one model, the three ways interleaved round by round (so a
noisy, shared machine slows them alike), best of --repeat:

* bare: the generate loop alone;
* gpuflame's ``torch`` backend, both ways it records, with and without
  building the profile at the end: the CPU allocator hook
  (:class:`TorchAllocatorRecorder`, what ``auto`` picks on a CPU-only
  machine), the same with C++ frames (``--native``), and the dispatch mode
  (:class:`TorchTensorRecorder`, any device);
* ``torch.profiler.profile(profile_memory=True, with_stack=True)``, the
  peer that also gives allocations with Python stacks, with and without its
  exit (where it builds its event tree);
* memray's ``Tracker`` (every malloc with its Python stack, CPU memory
  only), when memray is installed (``pip install memray``);
* both gpuflame recorders with the program marking phases (``gpuflame.phase``):
  four phases, the loop inside the last, so each allocation and free books
  its phase's own peak (capture/books/phases.py);
* both gpuflame recorders again as a process of ``gpuflame run`` sees them:
  publishing every allocation and free to the run's shared peak table (the
  joint peak, capture/books/joint_peak.py); then the table's cost per allocation
  (``torch.empty(10)`` in a loop, with and without it).

The workload is ``examples/demo.py``'s ``ModelRunner.generate`` (a small
Llama built from a config, random weights, static KV cache); ``--model
tiny`` uses a 64-wide, 2-layer Llama instead, where every op is tiny and the
per-op cost of any Python-level hook shows most. Goals (issue 3): under
1.3x, and a slowdown under half of torch.profiler's.

    python bench/bench_capture_torch.py [--model demo|tiny] [--repeat 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

import gpuflame  # noqa: E402
from gpuflame.capture.base import Recorder  # noqa: E402
from gpuflame.capture.books import phases  # noqa: E402
from gpuflame.capture.recorders.allocator import TorchAllocatorRecorder  # noqa: E402
from gpuflame.capture.recorders.allocator.native import load_cpu_hook  # noqa: E402
from gpuflame.capture.recorders.dispatch import TorchTensorRecorder  # noqa: E402


def demo_workload(batch: int, prompt_len: int, new_tokens: int) -> Callable[[], Any]:
    """The demo's runner (examples/demo.py), generating once per call."""
    spec = importlib.util.spec_from_file_location("gpuflame_demo", ROOT / "examples" / "demo.py")
    assert spec is not None and spec.loader is not None
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    runner = demo.ModelRunner(torch.device("cpu"), batch, prompt_len + new_tokens)
    generator = torch.Generator().manual_seed(1)
    vocab = runner.model.config.vocab_size
    prompts = torch.randint(1, vocab, (batch, prompt_len), generator=generator)
    return lambda: runner.generate(prompts, new_tokens)


def tiny_workload(batch: int, prompt_len: int, new_tokens: int) -> Callable[[], Any]:
    """A 64-wide, 2-layer Llama with a static cache: the smallest ops, the worst case for a hook."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        max_position_embeddings=256,
    )
    model = LlamaForCausalLM(config).eval()
    prompts = torch.randint(1, 128, (batch, prompt_len))

    def run() -> Any:
        with torch.inference_mode():
            return model.generate(
                prompts,
                max_new_tokens=new_tokens,
                do_sample=False,
                cache_implementation="static",
                pad_token_id=0,
            )

    return run


def bare(work: Callable[[], Any]) -> dict[str, float]:
    start = time.perf_counter()
    work()
    return {"loop": time.perf_counter() - start}


def gpuflame_allocator(work: Callable[[], Any]) -> dict[str, float]:
    return gpuflame_torch(TorchAllocatorRecorder(load_cpu_hook()), work)


def gpuflame_native(work: Callable[[], Any]) -> dict[str, float]:
    return gpuflame_torch(TorchAllocatorRecorder(load_cpu_hook(), native=True), work)


def gpuflame_dispatch(work: Callable[[], Any]) -> dict[str, float]:
    return gpuflame_torch(TorchTensorRecorder(), work)


def in_a_run(way: Callable[[Callable[[], Any]], dict[str, float]]) -> Callable[[Callable[[], Any]], dict[str, float]]:
    """*way* as in a process of ``gpuflame run``: with a session folder, so it publishes to the peak table."""

    def run_way(work: Callable[[], Any]) -> dict[str, float]:
        with tempfile.TemporaryDirectory() as folder:
            os.environ["GPUFLAME_SESSION_DIR"] = folder
            try:
                return way(work)
            finally:
                del os.environ["GPUFLAME_SESSION_DIR"]

    return run_way


Way = Callable[[Callable[[], Any]], dict[str, float]]


def with_phases(way: Way) -> Way:
    """*way* with the program marking phases (``gpuflame.phase``): three, then the loop inside a fourth."""

    def run_way(work: Callable[[], Any]) -> dict[str, float]:
        def phased() -> Any:
            for name in ("load_model", "warmup", "eval"):
                gpuflame.phase(name)
            with gpuflame.phase("generate"):
                return work()

        try:
            return way(phased)
        finally:
            phases.switch(0)

    return run_way


def table_cost_per_allocation(n: int = 100_000, rounds: int = 5) -> tuple[float, float]:
    """Best µs per ``torch.empty(10)`` + its free under the hook, without and with the run's table."""

    def loop() -> None:
        for _ in range(n):
            torch.empty(10)

    def timed(run: bool) -> float:
        way = in_a_run(gpuflame_allocator) if run else gpuflame_allocator
        return way(loop)["loop"]

    plain = min(timed(False) for _ in range(rounds))
    shared = min(timed(True) for _ in range(rounds))
    return plain / n * 1e6, shared / n * 1e6


def gpuflame_torch(rec: Recorder, work: Callable[[], Any]) -> dict[str, float]:
    start = time.perf_counter()
    rec.start()
    work()
    rec.stop()
    loop = time.perf_counter() - start
    profile = rec.snapshot()
    total = time.perf_counter() - start
    if rec.errors or not profile.samples:
        raise SystemExit(f"the recorder failed: {rec.errors}")
    return {"loop": loop, "with profile": total}


def torch_profiler(work: Callable[[], Any]) -> dict[str, float]:
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True, with_stack=True)
    start = time.perf_counter()
    prof.__enter__()
    work()
    loop = time.perf_counter() - start
    prof.__exit__(None, None, None)
    total = time.perf_counter() - start
    return {"loop": loop, "with profile": total}


def memray_tracker(work: Callable[[], Any]) -> dict[str, float]:
    """memray's in-process tracker: every malloc with its Python stack, written to a file."""
    import tempfile

    import memray

    with tempfile.TemporaryDirectory() as tmp:
        tracker = memray.Tracker(Path(tmp) / "bench.bin")
        start = time.perf_counter()
        tracker.__enter__()
        work()
        loop = time.perf_counter() - start
        tracker.__exit__(None, None, None)
        total = time.perf_counter() - start
    return {"loop": loop, "with profile": total}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=["demo", "tiny"], default="demo")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: steadiest ratios)")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=16)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    make = demo_workload if args.model == "demo" else tiny_workload
    work = make(args.batch, args.prompt_len, args.new_tokens)
    work()  # warm up: first-call costs are nobody's overhead

    ways: dict[str, Callable[[Callable[[], Any]], dict[str, float]]] = {
        "bare": bare,
        "gpuflame torch": gpuflame_allocator,
        "gpuflame torch, run": in_a_run(gpuflame_allocator),
        "gpuflame torch, phases": with_phases(gpuflame_allocator),
        "gpuflame --native": gpuflame_native,
        "gpuflame dispatch": gpuflame_dispatch,
        "gpuflame dispatch, run": in_a_run(gpuflame_dispatch),
        "gpuflame dispatch, ph.": with_phases(gpuflame_dispatch),
        # last: its exit leaves garbage that the next way's collector would pay for
        "torch.profiler": torch_profiler,
    }
    if importlib.util.find_spec("memray") is not None:
        ways["memray"] = memray_tracker
    times: dict[str, dict[str, list[float]]] = {name: {} for name in ways}
    for _ in range(args.repeat):
        for name, way in ways.items():
            for key, value in way(work).items():
                times[name].setdefault(key, []).append(value)

    base = min(times["bare"]["loop"])
    print(
        f"workload: {args.model} generate, batch {args.batch}, {args.prompt_len}+{args.new_tokens} tokens, "
        f"{args.threads} thread(s), best of {args.repeat}"
    )
    print(f"{'':22} {'best':>9} {'median':>9} {'ratio':>7}   {'incl. profile':>13} {'ratio':>7}")
    ratios: dict[str, float] = {}
    for name, columns in times.items():
        loop = columns["loop"]
        best, median = min(loop), statistics.median(loop)
        line = f"{name:22} {best * 1e3:7.1f}ms {median * 1e3:7.1f}ms {best / base:6.2f}x"
        ratios[name] = min(loop) / base
        if "with profile" in columns:
            full = min(columns["with profile"])
            line += f"   {full * 1e3:11.1f}ms {full / base:6.2f}x"
            ratios[name + " incl"] = full / base
        print(line)
    ours, peer = ratios["gpuflame torch"] - 1, ratios["torch.profiler"] - 1
    peer_incl = ratios["torch.profiler incl"] - 1
    print(
        f"gpuflame torch slowdown / torch.profiler slowdown: {ours / peer:.2f} in the loop, "
        f"{(ratios['gpuflame torch incl'] - 1) / peer_incl:.2f} including building the profile (goal < 0.5)"
    )
    print(
        f"gpuflame torch ratio {ratios['gpuflame torch']:.2f}x (goal < 1.3x); "
        f"with --torch-hook dispatch {ratios['gpuflame dispatch']:.2f}x"
    )
    if "memray" in ratios:
        print(f"gpuflame torch slowdown / memray slowdown: {ours / (ratios['memray'] - 1):.2f} in the loop")
    print(
        f"in gpuflame run (joint peak table): hook {ratios['gpuflame torch, run']:.2f}x (goal < 1.1x), "
        f"dispatch {ratios['gpuflame dispatch, run']:.2f}x"
    )
    print(
        f"with phases marked (gpuflame.phase): hook {ratios['gpuflame torch, phases']:.2f}x (goal < 1.15x), "
        f"dispatch {ratios['gpuflame dispatch, ph.']:.2f}x"
    )
    plain, shared = table_cost_per_allocation()
    print(
        f"per torch.empty(10) and its free under the hook: {plain:.3f} µs, {shared:.3f} µs with the run's table "
        f"(+{shared - plain:.3f} µs)"
    )


if __name__ == "__main__":
    main()
