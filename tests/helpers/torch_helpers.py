"""Helpers shared by the torch backend's tests: exact expectations computed without the recorder."""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch

from gpuflame.capture.recorders.allocator import TorchAllocatorRecorder
from gpuflame.capture.recorders.allocator.native import NativeUnavailable, load_cpu_hook
from gpuflame.capture.recorders.dispatch import TorchTensorRecorder
from gpuflame.model import Profile

PEAK, PEAK_N, INUSE, INUSE_N, ALLOC, ALLOC_N = range(6)
TYPES = ["peak_space", "peak_objects", "inuse_space", "inuse_objects", "alloc_space", "alloc_objects"]


# -----------------------------------------------------------------------------
# helpers
# -----------------------------------------------------------------------------


def here() -> int:
    """The caller's current line: ``x, line = torch.empty(3), here()``."""
    return sys._getframe(1).f_lineno


def by_frame(profile: Profile, name: str, column: int, line: int | None = None) -> int:
    """Sum of *column* over samples whose leaf frame is *name* (and on *line*, if given)."""
    total = 0
    for s in profile.samples:
        leaf = profile.frames[s.stack[0]] if s.stack else None
        if leaf is not None and leaf.name == name and (line is None or leaf.line == line):
            total += s.values[column]
    return total


def by_line(profile: Profile, line: int, column: int, file: str | None = None) -> int:
    """Sum of *column* over samples whose leaf frame is *file*:*line* (default: the caller's file)."""
    file = file or sys._getframe(1).f_code.co_filename
    total = 0
    for s in profile.samples:
        leaf = profile.frames[s.stack[0]]
        if leaf.file == file and leaf.line == line:
            total += s.values[column]
    return total


def column(profile: Profile, col: int) -> int:
    return profile.totals()[TYPES[col]]


def live_storages() -> dict[int, Any]:
    """Every storage reachable from a Python tensor object, by address (independent of the recorder)."""
    out: dict[int, Any] = {}
    for obj in gc.get_objects():
        if issubclass(type(obj), torch.Tensor) and obj.device.type != "meta":
            try:
                st = obj.untyped_storage()
            except (RuntimeError, NotImplementedError):
                continue
            out[st._cdata] = st
    return out


def tiny_llama_config() -> Any:
    transformers = pytest.importorskip("transformers")
    return transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )


def leaf_most_init(profile: Profile, sample: Any, classes: set[str]) -> str | None:
    for f in profile.stack_frames(sample):
        if f.name.endswith(" > __init__") and f.name[: -len(" > __init__")] in classes:
            return f.name
    return None


# a small module tree: parameters and a buffer made in nested __init__s
class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(16, 32)
        self.norm = torch.nn.LayerNorm(32)
        self.register_buffer("table", torch.zeros(7, dtype=torch.float16))


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block() for _ in range(3)])
        self.head = torch.nn.Linear(32, 5, bias=False)


def hook_recorder() -> Any:
    """The CPU allocator hook's recorder; the test skips where the hook cannot be built."""
    try:
        return TorchAllocatorRecorder(load_cpu_hook())
    except NativeUnavailable as exc:
        pytest.skip(f"the CPU allocator hook cannot be built here: {exc}")


RECORDERS = {"allocator": hook_recorder, "dispatch": TorchTensorRecorder}  # both torch recorders, by name


def record(make_recorder: Callable[[], Any], fn: Callable[[], Any]) -> tuple[Profile, Any, Any]:
    """Run *fn* under a new recorder; return the profile, fn's result (kept alive) and the recorder."""
    rec = make_recorder()
    rec.start()
    try:
        result = fn()
    finally:
        rec.stop()
    return rec.snapshot(), result, rec
