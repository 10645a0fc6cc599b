"""The workload of bench/bench_dispatch_tiny.py: 200,000 tiny torch operations on the CPU.

Each step is four aten operations on 16 floats, the mix of a small model's
inner loop: two make a new storage (``add``, ``mm``), one is a view
(``view``), one writes in place (``mul_``). At about a microsecond each,
every per-operation cost of a recorder shows. The result of each step is
kept until the next, so storages die as they do in a loop.

``--empty-mode`` runs the loop under a ``TorchDispatchMode`` that only
calls each op: the floor of any dispatch-mode recorder (what torch itself
costs per op once a mode is on), for the bench's comparison.

    python bench/tiny_ops.py [OPS] [--empty-mode]
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class EmptyMode(TorchDispatchMode):
    """Calls each op and nothing else (as cheaply as a mode can: no dynamo shim)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        return func._op(*args, **kwargs) if kwargs else func._op(*args)


def main(ops: int = 200_000) -> None:
    torch.set_num_threads(1)
    x = torch.ones(16)
    w = torch.ones(4, 4)
    out = None
    for _ in range(ops // 4):
        a = x + 1  # new storage
        b = a.view(4, 4)  # a view: nothing new
        b.mul_(2)  # in place: nothing new
        out = b.mm(w)  # new storage
    print(float(out.sum()) if out is not None else 0.0)


if __name__ == "__main__":
    words = [w for w in sys.argv[1:] if w != "--empty-mode"]
    with EmptyMode() if "--empty-mode" in sys.argv else contextlib.nullcontext():
        main(int(words[0]) if words else 200_000)
