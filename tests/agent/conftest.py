"""Fixtures for the node agent's tests: the BPF object, a stand-in libcuda, target processes.

Every test here needs BPF with uprobes (root, kernel BTF) and a toolchain
(clang, bpftool, libbpf; gcc and the CUDA toolkit's cuda.h for the stand-in);
where one is missing they all skip with one reason (agent_helpers.why_not).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.agent.agent_helpers import HERE, Target, build_standin, python_for, why_not


@pytest.fixture(scope="session")
def bpf_object() -> Path:
    reason = why_not()
    if reason:
        pytest.skip(reason)
    from gpuflame.agent import build

    return build.ensure()


@pytest.fixture(scope="session")
def libcuda(bpf_object: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The stand-in libcuda.so.1 (tests/agent/standin_cuda.c), built from cuda.h's real signatures (each function
    its own code: identical bodies folded into one, as -O2 does, would make a _ptsz variant a jump to its twin)."""
    out = tmp_path_factory.mktemp("standin") / "libcuda.so.1"
    build_standin(
        out,
        (
            "-O2",
            "-fno-omit-frame-pointer",
            "-fno-optimize-sibling-calls",
            "-fno-inline",
            "-fno-shrink-wrap",
            "-fno-ipa-icf",
        ),
    )
    out.parent.chmod(0o755)
    return str(out)


@pytest.fixture(scope="session")
def standin_nvml(bpf_object: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A stand-in libnvidia-ml.so.1 (tests/agent/standin_nvml.c, prototypes from NVML's public reference): what it
    reports per process is read from the file GPUFLAME_STANDIN_NVML names."""
    out = tmp_path_factory.mktemp("standin_nvml") / "libnvidia-ml.so.1"
    subprocess.run(
        [
            "gcc",
            "-shared",
            "-fPIC",
            "-O2",
            "-Wl,-soname,libnvidia-ml.so.1",
            str(HERE / "standin_nvml.c"),
            "-o",
            str(out),
        ],
        check=True,
        capture_output=True,
    )
    return str(out)


@pytest.fixture
def start_target(libcuda: str) -> Iterator[Callable[..., Target]]:
    started: list[Target] = []

    def start(version: str = "3.11", *extra: str, prefix: tuple[str, ...] = (), lib: str = "") -> Target:
        python = python_for(version)
        if python is None:
            where = f"pyenv install {version}" if version != "3.14" else "/opt/cpython-3.14: docs/agent-python.md"
            pytest.skip(f"no Python {version} here ({where})")
        t = Target(python, lib or libcuda, *extra, prefix=prefix)
        started.append(t)
        return t

    yield start
    for t in started:
        t.close()


@pytest.fixture
def agent_for(bpf_object: Path) -> Iterator[Callable[..., object]]:
    from gpuflame.agent.agent import Agent

    agents: list[Agent] = []

    def make(*pids: int, **kwargs: object) -> Agent:
        a = Agent(pids=pids, **kwargs)  # type: ignore[arg-type]
        agents.append(a)
        a.start()
        return a

    yield make
    for a in agents:
        a.stop()
