"""The cost of the CPU allocator hook's GIL round trip when another Python thread is busy.

To read the Python stack of an allocation, the hook takes the GIL back for
a moment in a thread that released it around a torch operation. Alone, that
is cheap; with another thread spinning in pure Python, every wait for the
GIL can last up to the switch interval (5 ms). This runs a small torch loop
(Linear + relu + add, 64x256) with and without such a thread, bare, under
the hook and under the dispatch mode, interleaved, best of --repeat.

    python bench/bench_gil_contention.py [--steps 300] [--repeat 3]
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

from gpuflame.capture.base import Recorder  # noqa: E402
from gpuflame.capture.recorders.allocator import TorchAllocatorRecorder  # noqa: E402
from gpuflame.capture.recorders.allocator.native import load_cpu_hook  # noqa: E402
from gpuflame.capture.recorders.dispatch import TorchTensorRecorder  # noqa: E402


def torch_loop(steps: int) -> float:
    lin = torch.nn.Linear(256, 256)
    x = torch.randn(64, 256)
    start = time.perf_counter()
    with torch.no_grad():
        for _ in range(steps):
            torch.relu(lin(x)) + 1
    return time.perf_counter() - start


def spin(stop: threading.Event) -> None:
    while not stop.is_set():
        sum(i * i for i in range(1000))


def timed(steps: int, contended: bool, make: Callable[[], Recorder | None]) -> float:
    stop = threading.Event()
    other = threading.Thread(target=spin, args=(stop,))
    if contended:
        other.start()
    rec = make()
    try:
        if rec is not None:
            rec.start()
        return torch_loop(steps)
    finally:
        if rec is not None:
            rec.stop()
        stop.set()
        if contended:
            other.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    hook = load_cpu_hook()
    ways: dict[str, Callable[[], Any]] = {
        "bare": lambda: None,
        "gpuflame hook": lambda: TorchAllocatorRecorder(hook),
        "gpuflame dispatch": TorchTensorRecorder,
    }
    torch_loop(10)  # warm up
    for contended in (False, True):
        runs: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(args.repeat):  # round by round, so a noisy machine slows all ways alike
            for name, make in ways.items():
                runs[name].append(timed(args.steps, contended, make))
        best = {name: min(times) for name, times in runs.items()}
        label = "with a busy Python thread" if contended else "alone"
        cells = "  ".join(f"{name} {t * 1e3:8.1f} ms ({t / best['bare']:.2f}x)" for name, t in best.items())
        print(f"{label:26} {cells}")


if __name__ == "__main__":
    main()
