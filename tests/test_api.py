"""The Python API: ``with gpuflame.profile(path)``, ``gpuflame.start()`` / ``stop()``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import gpuflame
from gpuflame.formats import load


class Buffers:
    def allocate(self, n: int) -> torch.Tensor:
        return torch.empty(n, dtype=torch.uint8)


def leaf_bytes(path: Path, name: str, type_name: str = "alloc_space") -> int:
    p = load(path)
    idx = p.type_index(type_name)
    return sum(s.values[idx] for s in p.samples if s.stack and p.frames[s.stack[0]].name == name)


def test_profile_block_writes_the_file(tmp_path: Path) -> None:
    before = Buffers().allocate(1 << 20)  # made before profiling: not counted
    out = tmp_path / "block.pb.gz"
    with gpuflame.profile(out, backend="torch"):
        kept = Buffers().allocate(4096)
        before.add_(1)
    assert leaf_bytes(out, "Buffers > allocate") == 4096
    # touching the old tensor in place holds nothing (its scalar is wrapped in a
    # few bytes that are freed at once, which the CPU allocator hook does see)
    assert load(out).totals()["inuse_space"] == 4096
    del kept


def test_the_file_is_written_when_the_block_raises(tmp_path: Path) -> None:
    out = tmp_path / "raised.pb.gz"
    with pytest.raises(ZeroDivisionError):
        with gpuflame.profile(out, backend="torch"):
            kept = Buffers().allocate(2048)  # noqa: F841
            raise ZeroDivisionError("inside the block")
    assert leaf_bytes(out, "Buffers > allocate") == 2048


def test_start_stop_and_double_start(tmp_path: Path) -> None:
    out = tmp_path / "ss.pb.gz"
    gpuflame.start(out, backend="torch")
    try:
        with pytest.raises(RuntimeError, match="already profiling"):
            gpuflame.start(tmp_path / "other.pb.gz")
        kept = Buffers().allocate(512)  # noqa: F841
    finally:
        assert gpuflame.stop() == out.resolve()
    assert gpuflame.stop() is None
    assert leaf_bytes(out, "Buffers > allocate") == 512


def test_unknown_backend_is_refused() -> None:
    with pytest.raises(ValueError, match="backend must be one of"):
        gpuflame.start(backend="cobol")
