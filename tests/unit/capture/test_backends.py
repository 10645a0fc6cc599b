"""The backend registry: one table answers which names exist, which import starts each, and "auto"."""

from __future__ import annotations

import pytest

from gpuflame.boundary import backends
from gpuflame.boundary.settings import Settings
from gpuflame.capture import recorders


def test_every_registered_backend_is_accepted_by_the_environment_and_unknown_ones_are_not() -> None:
    assert backends.BACKENDS == ("auto", *backends.REGISTRY)
    for name in backends.BACKENDS:
        assert Settings.from_env({"GPUFLAME_BACKEND": name}).backend == name
    assert Settings.from_env({"GPUFLAME_BACKEND": "tensorflow"}).backend == "auto"
    with pytest.raises(ValueError, match="unknown backend 'tensorflow'"):
        recorders.create("tensorflow", None)  # type: ignore[arg-type]


def test_the_frameworks_each_backend_waits_for() -> None:
    assert backends.frameworks("auto") == ("torch", "jax")
    assert backends.frameworks("torch-cuda") == backends.frameworks("torch") == ("torch",)
    assert backends.frameworks("jax") == ("jax",)
    assert backends.frameworks("nothing") == ()


def test_auto_picks_torch_cuda_only_with_cuda_and_jax_for_jax() -> None:
    torch = pytest.importorskip("torch")
    jax = pytest.importorskip("jax")
    assert backends.for_framework("auto", torch) == ("torch-cuda" if torch.cuda.is_available() else "torch")
    assert backends.for_framework("auto", jax) == "jax"
    assert backends.for_framework("torch-cuda", torch) == "torch-cuda"  # asked for: never second-guessed
