"""A command freezes the profile it read (no collection walks it) and thaws it when it returns."""

from __future__ import annotations

import gc
from pathlib import Path

from gpuflame.cli.main import main
from gpuflame.formats import save
from gpuflame.gcpause import kept_to_the_end, thaw
from tests.helpers.profiles import small_profile


def test_objects_built_in_the_block_are_frozen_until_thawed() -> None:
    thaw()
    with kept_to_the_end():
        assert not gc.isenabled()
        kept = [[i] for i in range(1000)]
    assert gc.isenabled()
    assert gc.get_freeze_count() >= len(kept)
    thaw()
    assert gc.get_freeze_count() == 0


def test_a_command_thaws_what_it_froze(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "p.pb.gz"
    save(small_profile("alloc", 4096), path)
    frozen: list[int] = []
    real_thaw = thaw

    def spy() -> None:
        frozen.append(gc.get_freeze_count())
        real_thaw()

    monkeypatch.setattr("gpuflame.cli.main.thaw", spy)
    assert main(["report", str(path)]) == 0
    assert frozen and frozen[0] > 0  # the profile was frozen while the command ran
    assert gc.get_freeze_count() == 0
