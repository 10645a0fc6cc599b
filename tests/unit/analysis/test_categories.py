"""The ``category`` label in the command-line views: ``report``'s by-category table and ``top --by category``."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuflame.analysis.categories import UNKNOWN, category_totals
from gpuflame.formats import save
from gpuflame.model import SYNTHETIC, Frame, Profile
from gpuflame.symbols.names import CACHED_FREE
from tests.helpers.cli import run, run_json

TYPES = [("peak_space", "bytes"), ("inuse_space", "bytes")]


def labelled_profile() -> Profile:
    p = Profile(TYPES, default_type="peak_space")
    init = Frame("Linear > __init__", "/m/linear.py", 10)
    step = Frame("Adam > _init_group", "/t/optim/adam.py", 139)
    fwd = Frame("MLP > forward", "/m/mlp.py", 5)
    p.add([init], [4000, 4000], {"category": "parameter"})
    p.add([Frame("helper", "/m/h.py", 2)], [1000, 1000], {"category": "parameter"})
    p.add([step], [8000, 8000], {"category": "optimizer_state"})
    p.add([fwd], [3000, 0], {"category": "activation"})
    p.add([Frame(CACHED_FREE, kind=SYNTHETIC)], [500, 700], {})  # no label: the synthetic frame says it
    return p


def test_category_totals_in_vocabulary_order_with_top_function() -> None:
    rows = category_totals(labelled_profile(), 0)
    assert [(c.category, c.total, c.top_function) for c in rows] == [
        ("parameter", 5000, "Linear > __init__"),
        ("optimizer_state", 8000, "Adam > _init_group"),
        ("activation", 3000, "MLP > forward"),
        ("cached_free", 500, "<cached free blocks>"),
    ]
    assert sum(c.percent for c in rows) == pytest.approx(100.0)
    # in use: the activation is gone, so it has no row
    inuse = category_totals(labelled_profile(), 1)
    assert [c.category for c in inuse] == ["parameter", "optimizer_state", "cached_free"]


def test_unlabelled_samples_are_not_recorded_not_guessed() -> None:
    p = labelled_profile()
    p.add([Frame("jax_fn", "/j.py", 1)], [200, 200])
    assert category_totals(p, 0)[-1].category == UNKNOWN
    bare = Profile(TYPES)
    bare.add([Frame("f", "/a.py", 1)], [1, 1])
    bare.add([Frame(CACHED_FREE, kind=SYNTHETIC)], [5, 5])  # a synthetic frame alone is no recorder's label
    assert category_totals(bare, 0) == []


@pytest.fixture
def labelled_file(tmp_path: Path) -> Path:
    path = tmp_path / "run.pb.gz"
    save(labelled_profile(), path)
    return path


def test_report_has_a_by_category_table(capsys, labelled_file: Path) -> None:
    rc, out, err = run(capsys, "report", labelled_file)
    assert rc == 0, err
    assert "By category" in out
    line = next(x for x in out.splitlines() if x.strip().startswith("optimizer_state"))
    assert "7.81 KiB" in line and "48.5%" in line and "Adam > _init_group" in line
    data = run_json(capsys, "report", labelled_file, "--type", "inuse")
    assert {c["category"]: c["total"] for c in data["by_category"]} == {
        "parameter": 5000,
        "optimizer_state": 8000,
        "cached_free": 700,
    }


def test_top_by_category(capsys, labelled_file: Path) -> None:
    data = run_json(capsys, "top", labelled_file, "--by", "category")
    assert data["by"] == "category" and data["total"] == 16500
    assert [(c["category"], c["total"]) for c in data["categories"]] == [
        ("parameter", 5000),
        ("optimizer_state", 8000),
        ("activation", 3000),
        ("cached_free", 500),
    ]
    rc, out, _ = run(capsys, "top", labelled_file, "--by", "category")
    assert rc == 0 and "activation" in out and "MLP > forward" in out


def test_top_by_category_without_categories_is_one_line_exit_2(capsys, tmp_path: Path) -> None:
    bare = Profile(TYPES)
    bare.add([Frame("f", "/a.py", 1)], [1, 1])
    save(bare, tmp_path / "bare.pb.gz")
    rc, out, err = run(capsys, "top", tmp_path / "bare.pb.gz", "--by", "category")
    assert rc == 2 and "no categories" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_top_by_category_with_nothing_in_use_says_the_type_is_empty(capsys, tmp_path: Path) -> None:
    """Labelled, but nothing held at the end: the profile has categories; its in-use total is 0 B."""
    p = Profile(TYPES, default_type="peak_space")
    p.add([Frame("MLP > forward", "/m/mlp.py", 5)], [3000, 0], {"category": "activation"})
    save(p, tmp_path / "freed.pb.gz")
    rc, _, err = run(capsys, "top", tmp_path / "freed.pb.gz", "--by", "category", "--type", "inuse")
    assert rc == 2 and "no categories to show: inuse_space is 0 B" in err and "only the torch" not in err


def test_top_by_category_with_no_object_in_use_counts_objects_not_bytes(capsys, tmp_path: Path) -> None:
    """inuse_objects is a count: 'is 0', not '0 B', and its peak is peak_objects (a trial read '0 B')."""
    p = Profile([("peak_objects", "count"), ("inuse_objects", "count")], default_type="peak_objects")
    p.add([Frame("MLP > forward", "/m/mlp.py", 5)], [3, 0], {"category": "activation"})
    save(p, tmp_path / "freed.pb.gz")
    rc, _, err = run(capsys, "top", tmp_path / "freed.pb.gz", "--by", "category", "--type", "inuse_objects")
    assert rc == 2 and "inuse_objects is 0 in this profile" in err and "0 B" not in err
    assert "--type peak_objects shows the peak" in err
    rc, out, _ = run(capsys, "top", tmp_path / "freed.pb.gz", "--by", "category", "--type", "peak_objects")
    assert rc == 0 and "activation" in out  # 3 objects at the peak: the table
