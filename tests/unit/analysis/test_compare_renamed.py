"""diff of two runs of a renamed script: its <module> and functions are matched by name, and it says so.

``train.py`` run, then the same program as ``train_v2.py``: every frame of
the script changed file, so compared by file each function was ``[new]``
in one table and ``[vanished]`` in the other. The profiles here are shaped
as a real run's (the script's <module> at the root, its functions above,
torch's frames shared by both).
"""

from __future__ import annotations

from pathlib import Path

from gpuflame.analysis.compare import GREW, compare
from gpuflame.formats import save
from gpuflame.model import Frame, Profile, memory_sample_types
from gpuflame.model.diff import renamed_scripts
from tests.helpers.cli import run, run_json

LINEAR = Frame("Linear > __init__", "torch/nn/modules/linear.py", 106, start_line=99)


def script_run(script: str, big: int, helper: str = "/w/util.py") -> Profile:
    """A profile of ``python SCRIPT``: build() holds 1,000 B, step() 200 B, the module itself *big* B."""
    module = Frame("<module>", script, 12, start_line=1)
    build = Frame("build", script, 4, start_line=3)
    step = Frame("step", script, 7, start_line=6)
    imported = Frame("<module>", helper, 2, start_line=1)  # a module the script imports: the same in both runs
    profile = Profile(sample_types=memory_sample_types(inuse=False, alloc=False))
    profile.add([LINEAR, build, module], [1000, 1], {"pid": "1"})
    profile.add([step, module], [200, 1], {"pid": "1"})
    profile.add([module], [big, 1], {"pid": "1"})
    profile.add([imported, module], [50, 1], {"pid": "1"})
    return profile


def test_a_renamed_script_is_compared_as_one_file_by_name() -> None:
    base, new = script_run("/w/train.py", 4000), script_run("/w/train_v2.py", 6000)
    cmp = compare(base, new, limit=50)
    assert cmp.aligned == (("/w/train.py", "/w/train_v2.py"),)
    assert [(c.frame.name, c.base, c.new, c.status) for c in cmp.grew + cmp.shrank] == [
        ("<module>", 5250, 7250, GREW)  # the one change: 2,000 B more at the top level; build and step equal
    ]
    assert cmp.changed == 1


def test_no_align_keeps_each_file_apart() -> None:
    base, new = script_run("/w/train.py", 4000), script_run("/w/train_v2.py", 6000)
    cmp = compare(base, new, limit=50, align=False)
    assert cmp.aligned == ()
    assert {(c.frame.name, c.frame.file, c.status) for c in cmp.grew} == {
        ("<module>", "/w/train_v2.py", "new"),
        ("build", "/w/train_v2.py", "new"),
        ("step", "/w/train_v2.py", "new"),
    }
    assert {c.status for c in cmp.shrank} == {"vanished"}


def test_the_same_script_in_both_is_no_rename() -> None:
    base, new = script_run("/w/train.py", 4000), script_run("/w/train.py", 6000)
    assert renamed_scripts(base, new) == {}
    assert compare(base, new).aligned == ()


def test_several_renamed_files_pair_only_by_equal_file_names() -> None:
    """Two scripts gone and two come: paired where only the folder changed; two unrelated names stay apart."""
    base = script_run("/old/train.py", 1, helper="/old/data.py")
    new = script_run("/new/train.py", 1, helper="/new/loader.py")
    assert renamed_scripts(base, new) == {"/old/train.py": "/new/train.py"}


def test_the_cli_says_it_matched_them_and_no_align_does_not(tmp_path: Path, capsys) -> None:
    a, b = str(tmp_path / "a.pb.gz"), str(tmp_path / "b.pb.gz")
    save(script_run("/w/train.py", 4000), a)
    save(script_run("/w/train_v2.py", 6000), b)
    rc, out, err = run(capsys, "diff", a, b)
    flat = " ".join(out.split())
    assert rc == 0, err
    assert "/w/train.py (base) and /w/train_v2.py (new): one script renamed" in flat
    assert "[new]" not in out and "[vanished]" not in out
    data = run_json(capsys, "diff", a, b)
    assert data["aligned"] == [{"base": "/w/train.py", "new": "/w/train_v2.py"}]
    rc, out, _ = run(capsys, "diff", a, b, "--no-align")
    assert rc == 0 and "one script renamed" not in out and "[new]" in out and "[vanished]" in out
    assert run_json(capsys, "diff", a, b, "--no-align")["aligned"] == []
