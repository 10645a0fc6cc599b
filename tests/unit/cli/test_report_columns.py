"""report, top, flame and explain of a large pprof read from the columns: no Sample made, the same output."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from gpuflame.formats import save
from gpuflame.model import Frame, Profile, memory_sample_types
from gpuflame.model.peak import PeakUnit
from gpuflame.symbols.names import CACHED_FREE
from tests.helpers.cli import run

COMMANDS = [
    ["report"],
    ["report", "--json"],
    ["report", "--json", "--lines"],
    ["report", "--group-by", "device"],
    ["report", "--json", "--group-by", "pid", "--type", "alloc"],
    ["top", "--by", "category"],
    ["top", "--by", "total"],
    ["flame", "--json"],
    ["explain", "f1", "--json"],
]


def _profile(n: int = 6000) -> Profile:
    """Samples of every shape a reader meets: shared and recursive stacks, empty ones, zero values, a cached
    leaf, categories on some samples only, two devices and two processes, a reserved peak on one device."""
    rng = random.Random(3)
    frames = [Frame(f"f{i % 40}" if i % 3 else f"Cls.m{i}", f"/src/m{i % 7}.py", 5 + i % 30) for i in range(120)]
    cached = Frame(CACHED_FREE, "", 0, kind="synthetic")
    stacks = [[rng.choice(frames) for _ in range(rng.randint(1, 14))] for _ in range(400)]
    profile = Profile(sample_types=memory_sample_types())
    for i in range(n):
        stack = list(rng.choice(stacks))
        stack = stack + stack[:2] if i % 11 == 0 else stack  # recursion: a function twice on one stack
        stack = [cached, *stack[1:]] if i % 29 == 0 else stack
        stack = [] if i % 97 == 0 else stack
        values = [rng.choice([0, 0, 512, 4096, 1 << 20]) * rng.randint(1, 5) for _ in range(6)]
        labels = {"device": f"cuda:{i % 3 % 2}", "pid": str(100 + i % 2)}
        if i % 4:
            labels["category"] = rng.choice(["parameter", "gradient", "activation"])
        profile.add(stack, values, labels)
    profile.default_type = "peak_space"
    profile.peaks = [PeakUnit("cuda:0", reserved=1 << 40, reserved_allocated=1 << 30, reserved_at=5)]
    return profile


@pytest.fixture(scope="module")
def path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("columns") / "large.pb.gz"
    save(_profile(), out)
    return out


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: "_".join(a).replace("-", ""))
def test_a_command_on_columns_makes_no_sample_and_says_what_the_listed_profile_says(
    argv: list[str], path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpuflame.formats import load, pprof_samples
    from gpuflame.model.columns import SampleColumns

    command, rest = argv[0], argv[1:]
    with monkeypatch.context() as listed:
        listed.setattr(pprof_samples, "BULK_MIN", 1 << 62)  # the reader hands over Sample objects
        assert "_columns" not in load(path).__dict__
        rc, expected, err = run(capsys, command, path, *rest)
        assert rc == 0, err
    assert "_columns" in load(path).__dict__

    def refuse(self: SampleColumns) -> None:
        raise AssertionError("the command built the list of samples")

    monkeypatch.setattr(SampleColumns, "to_samples", refuse)
    rc, out, err = run(capsys, command, path, *rest)
    assert rc == 0, err
    assert out == expected


def test_the_profile_shows_what_the_columns_road_must_get_right(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The report above has a by-category table, a reserved peak, a cached leaf: the comparison compares them."""
    rc, out, err = run(capsys, "report", path)
    assert rc == 0, err
    assert "cuda:0: the allocator's reserved peak 1.00 TiB" in out
    for category in ("parameter", "gradient", "activation", "cached_free"):
        assert category in out
