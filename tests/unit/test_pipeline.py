"""pipeline: the one flow from files to the view a reading command renders (load, merge, moment, filters)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuflame.analysis.selection import Selection
from gpuflame.errors import GpuflameError
from gpuflame.formats import save
from gpuflame.model import Frame, Profile, SampleType
from gpuflame.pipeline import Request, open_each, open_profile


def write_profile(path: Path, leaf: str, size: int, pid: int) -> str:
    """A small real pprof file: one stack of a python function with its def line under <module>."""
    profile = Profile(sample_types=[SampleType("inuse_space", "bytes")])
    profile.add([Frame(leaf, "train.py", 10, start_line=3), Frame("<module>", "train.py", 1)], [size], {"pid": pid})
    save(profile, path)
    return str(path)


@pytest.fixture
def two_files(tmp_path: Path) -> tuple[str, str]:
    return write_profile(tmp_path / "a.pb.gz", "build", 4096, 1), write_profile(tmp_path / "b.pb.gz", "step", 512, 2)


def test_several_files_open_as_one_merged_profile(two_files: tuple[str, str]) -> None:
    opened = open_profile(Request(paths=two_files))
    assert opened.profile.totals()["inuse_space"] == 4096 + 512
    assert sorted(opened.profile.label_values("pid")) == ["1", "2"]
    assert opened.source == ", ".join(two_files)


def test_filters_apply_and_the_words_say_them(two_files: tuple[str, str]) -> None:
    selection = Selection(labels=(("pid", "2"),), hide=("no_such_function",))
    opened = open_profile(Request(paths=two_files, selection=selection))
    assert opened.profile.totals()["inuse_space"] == 512
    assert opened.source == f"{', '.join(two_files)} --label pid=2 --hide no_such_function"
    assert len(opened.notes) == 1 and opened.notes[0].startswith("--hide changed nothing")


def test_each_file_opens_on_its_own(two_files: tuple[str, str]) -> None:
    base, new = open_each(Request(paths=two_files))
    assert base.profile.totals()["inuse_space"] == 4096
    assert new.profile.totals()["inuse_space"] == 512
    assert (base.source, new.source) == two_files


def test_every_file_is_read_before_a_filter_fails(two_files: tuple[str, str], tmp_path: Path) -> None:
    """open_each reads all files first: an unreadable second file is said before the first file's filter fails."""
    missing = str(tmp_path / "missing.pb.gz")
    with pytest.raises(GpuflameError, match="missing.pb.gz"):
        open_each(Request(paths=(two_files[0], missing), selection=Selection(focus="no_such_function")))
    each = open_each(Request(paths=two_files, selection=Selection(labels=(("pid", "1"),))))
    assert next(each).profile.totals()["inuse_space"] == 4096
    with pytest.raises(GpuflameError, match="pid=1"):
        next(each)  # the second file has no pid 1: its filter fails only when it is taken
