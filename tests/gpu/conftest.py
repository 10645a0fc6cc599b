"""GPU tests: collected everywhere, run only where PyTorch sees a CUDA device."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    try:
        import torch

        available = torch.cuda.is_available()
    except Exception:
        available = False
    if available:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (none here)")
    for item in items:
        if "tests/gpu/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(skip)
