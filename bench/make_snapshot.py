"""Generate a large HAND-WRITTEN stand-in for a PyTorch CUDA memory snapshot.

Not produced by ``torch.cuda.memory._snapshot()`` (no GPU here): the dict has
its structure (segments and blocks, ``device_traces`` with ``alloc`` /
``free_requested`` / ``free_completed`` / ``segment_alloc`` entries, shared
frame dicts and one frames list per allocation shared by its block and its
trace entry), at the size of a long training run: by default 200k trace
entries, 20-frame stacks, about 20k blocks alive at the end. Frames point at
real lines of real functions in torch's own source, so converting pays for
qualified-name recovery as it would on a real snapshot.

    python bench/make_snapshot.py -n 200000 -d 20 -o bench/out/large_snapshot.pickle
"""

from __future__ import annotations

import argparse
import pickle
import random
import sys
import types
from pathlib import Path
from typing import Any

EPOCH_US = 1_767_225_600_000_000
MiB = 1 << 20


def _torch_functions(limit: int = 40) -> list[tuple[str, int, str]]:
    """(file, line, co_name) of real lines in torch's Python source."""
    import torch

    root = Path(torch.__file__).parent
    files = sorted((root / "nn" / "modules").glob("*.py")) + sorted((root / "optim").glob("*.py"))
    out: list[tuple[str, int, str]] = []
    for path in files[:limit]:
        try:
            code = compile(path.read_bytes(), str(path), "exec")
        except SyntaxError:
            continue
        stack = [code]
        while stack:
            co = stack.pop()
            stack += [c for c in co.co_consts if isinstance(c, types.CodeType)]
            lines = sorted({ln for _, _, ln in co.co_lines() if ln is not None})
            if co.co_name != "<module>" and lines:
                out.append((str(path), lines[len(lines) // 2], co.co_name))
    return out


def make_snapshot(entries: int = 200_000, depth: int = 20, seed: int = 1) -> dict[str, Any]:
    rng = random.Random(seed)
    functions = _torch_functions()
    frames = [{"name": n, "filename": f, "line": ln} for f, ln, n in rng.sample(functions, min(3000, len(functions)))]
    callees = [[rng.randrange(len(frames)) for _ in range(5)] for _ in frames]
    roots = [rng.randrange(len(frames)) for _ in range(3)]

    def stack() -> list[dict[str, Any]]:
        node = rng.choice(roots)
        path = [node]
        for _ in range(depth - 1):
            node = rng.choice(callees[node])
            path.append(node)
        return [frames[i] for i in reversed(path)]

    stacks = [stack() for _ in range(4000)]
    trace: list[dict[str, Any]] = []
    clock = EPOCH_US
    address = 0x7F0000000000
    segments: list[dict[str, Any]] = []

    def record(action: str, addr: int, size: int, fr: list[dict[str, Any]]) -> None:
        nonlocal clock
        clock += rng.randint(1, 30)
        trace.append(
            {
                "action": action,
                "addr": addr,
                "size": size,
                "stream": 0,
                "time_us": clock,
                "compile_context": "N/A",
                "user_metadata": "",
                "frames": fr,
            }
        )

    def new_segment(blocks: list[dict[str, Any]], fr: list[dict[str, Any]]) -> None:
        nonlocal address
        total = sum(b["size"] for b in blocks)
        record("segment_alloc", address, total, fr)
        at = address
        for b in blocks:
            b["address"] = at
            at += b["size"]
        active = sum(b["size"] for b in blocks if b["state"] != "inactive")
        segments.append(
            {
                "device": 0,
                "address": address,
                "total_size": total,
                "allocated_size": active,
                "active_size": active,
                "requested_size": sum(b["requested_size"] for b in blocks),
                "stream": 0,
                "segment_type": "large",
                "segment_pool_id": (0, 0),
                "is_expandable": False,
                "frames": fr,
                "blocks": blocks,
            }
        )
        address += total + 64 * MiB

    # weights: allocated once, alive at the end (20k of them, 16 per segment)
    weights = max(1, entries // 10)
    for start in range(0, weights, 16):
        blocks = []
        for _ in range(min(16, weights - start)):
            fr = list(rng.choice(stacks))
            size = rng.choice((1, 2, 4, 8)) * MiB
            blocks.append(
                {
                    "address": 0,
                    "size": size,
                    "requested_size": size,
                    "state": "active_allocated",
                    "frames": fr,
                }
            )
        blocks.append({"address": 0, "size": 2 * MiB, "requested_size": 0, "state": "inactive", "frames": []})
        new_segment(blocks, blocks[0]["frames"])
        for b in blocks[:-1]:
            record("alloc", b["address"], b["size"], b["frames"])
    # activations: allocated and freed in a loop inside one big workspace segment
    workspace = address
    new_segment([{"address": 0, "size": 4096 * MiB, "requested_size": 0, "state": "inactive", "frames": []}], [])
    while len(trace) + 3 * 64 <= entries:
        live = []
        at = workspace
        for _ in range(64):
            size = rng.randint(1, 4096) * 512
            fr = list(rng.choice(stacks))
            record("alloc", at, size, fr)
            live.append((at, size))
            at += size
        for addr, size in live:
            record("free_requested", addr, size, [])
            record("free_completed", addr, size, [])
    return {
        "segments": segments,
        "device_traces": [trace],
        "allocator_settings": {
            "PYTORCH_CUDA_ALLOC_CONF": "",
            "max_split_size": -1,
            "garbage_collection_threshold": 0.0,
            "expandable_segments": False,
        },
        "external_annotations": [],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="large hand-written snapshot stand-in")
    parser.add_argument("-n", "--entries", type=int, default=200_000)
    parser.add_argument("-d", "--depth", type=int, default=20)
    parser.add_argument("-o", "--output", type=Path, default=Path("bench/out/large_snapshot.pickle"))
    args = parser.parse_args()
    snap = make_snapshot(args.entries, args.depth)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    with open(args.output, "wb") as f:
        pickle.dump(snap, f)
    blocks = sum(len(s["blocks"]) for s in snap["segments"])
    print(
        f"wrote {args.output}: {len(snap['device_traces'][0]):,} trace entries, {blocks:,} blocks, "
        f"{args.output.stat().st_size / 1e6:.1f} MB (a hand-written stand-in)",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
