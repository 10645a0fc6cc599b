"""Run a small model's workload once and say what the allocator did: the script that makes the GPU snapshots.

Each run is its own process, so that ``PYTORCH_CUDA_ALLOC_CONF`` (read when
CUDA starts) is the caller's to set. On CUDA, ``--snapshot FILE`` records
the allocator's history (Python stacks, every allocation and free) and writes
the snapshot gzipped, as ``tests/data`` keeps them; ``--memory-limit`` caps
the process with ``torch.cuda.set_per_process_memory_fraction``, and an
out-of-memory error is caught, recorded in the snapshot and reported. One
JSON line per workload on stdout: the real reserved and allocated peaks
(``torch.cuda.max_memory_reserved``/``allocated``), the segment events of
the trace by action, whether it ran out of memory, and the model's origin.

    python bench/gpu_check/workloads.py gpt2-train --device cuda --snapshot gpt2.pickle.gz
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python bench/gpu_check/workloads.py gpt2-train ...
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import pickle
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, where the package gpu_check is

from gpu_check.models import SIZES, WORKLOADS, implementation, started  # noqa: E402

SEGMENT_ACTIONS = ("segment_alloc", "segment_free", "segment_map", "segment_unmap")
HISTORY_ENTRIES = 200_000
STEPS = {"gpt2-train": 2, "llama-generate": 1}  # the second step has the optimizer's state; one generate is enough


def segment_events(snapshot: dict[str, Any]) -> dict[str, int]:
    """How many trace entries of each segment action the snapshot holds, over every device."""
    counts: Counter[str] = Counter()
    for trace in snapshot.get("device_traces", []):
        counts.update(e["action"] for e in trace if e.get("action") in SEGMENT_ACTIONS)
    return {a: counts[a] for a in SEGMENT_ACTIONS}


def run_one(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Build *name*'s model and run it its number of steps; what happened, as one JSON-able dict."""
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    result: dict[str, Any] = {
        "workload": name,
        "impl": implementation(args.impl),
        "size": args.size,
        "device": str(device),
        "pid": os.getpid(),
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "steps": args.steps or STEPS[name],
        "oom": None,
    }
    if cuda and args.memory_limit:
        total = torch.cuda.get_device_properties(device).total_memory
        result["fraction"] = args.memory_limit / total
        torch.cuda.set_per_process_memory_fraction(result["fraction"], device)
    if cuda and args.snapshot:
        torch.cuda.memory._record_memory_history(max_entries=HISTORY_ENTRIES, stacks="python")
    try:
        work, result["impl"] = started(name, SIZES[args.size], device, result["impl"])
        for _ in range(result["steps"] - 1):
            work()
    except torch.OutOfMemoryError as exc:
        result["oom"] = str(exc).splitlines()[0][:300]
    if cuda:
        torch.cuda.synchronize()
        result["reserved_peak"] = torch.cuda.max_memory_reserved(device)
        result["allocated_peak"] = torch.cuda.max_memory_allocated(device)
    if cuda and args.snapshot:
        snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        result["segment_events"] = segment_events(snapshot)
        with gzip.open(args.snapshot, "wb", compresslevel=9) as f:
            pickle.dump(snapshot, f)
        result["snapshot"] = str(args.snapshot)
        result["snapshot_bytes"] = Path(args.snapshot).stat().st_size
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workloads", nargs="+", choices=sorted(WORKLOADS))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--size", choices=sorted(SIZES), default="full")
    parser.add_argument("--impl", choices=("auto", "transformers", "pure-torch"), default="auto")
    parser.add_argument("--steps", type=int, help="calls of each workload (default: 2 training steps, 1 generate)")
    parser.add_argument("--snapshot", type=Path, help="CUDA only: write the allocator snapshot here (gzip)")
    parser.add_argument("--memory-limit", type=int, default=0, help="CUDA only: cap the process at this many bytes")
    args = parser.parse_args(argv)
    if args.snapshot and len(args.workloads) > 1:
        parser.error("--snapshot takes one workload")
    for name in args.workloads:
        print(json.dumps(run_one(name, args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
