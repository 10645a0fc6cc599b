"""Inputs that used to be taken for something else: counts under 1, empty names, negative or non-profile folded text."""

from __future__ import annotations

import pytest

from gpuflame.analysis.chains import NoSuchFunctionError, explain
from gpuflame.analysis.tree import build_tree
from gpuflame.formats import save
from tests.helpers.cli import run, run_json
from tests.helpers.guide import guide_profile


@pytest.fixture()
def guide_file(tmp_path):
    path = tmp_path / "guide.pb.gz"
    save(guide_profile(), path)
    return path


def one_line(rc: int, out: str, err: str, words: str) -> None:
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert words in err


@pytest.mark.parametrize(
    "argv",
    [
        ["top", "{f}", "-n", "0"],
        ["top", "{f}", "-n", "-1"],
        ["report", "{f}", "-n", "0"],
        ["diff", "{f}", "{f}", "-n", "-3"],
        ["explain", "{f}", "forward", "--chains", "0"],
    ],
)
def test_counts_under_one_are_refused(capsys, guide_file, argv):
    rc, out, err = run(capsys, *[a.format(f=guide_file) for a in argv])
    one_line(rc, out, err, "expected a number of at least 1")


def test_top_n_is_how_many_rows(capsys, guide_file):
    assert len(run_json(capsys, "top", guide_file, "-n", "2")["functions"]) == 2
    assert len(run_json(capsys, "top", guide_file, "-n", "1")["functions"]) == 1


@pytest.mark.parametrize(
    "argv",
    [
        ["explain", "{f}", ""],
        ["explain", "{f}", "  "],
        ["report", "{f}", "--hide", ""],
        ["report", "{f}", "--focus", ""],
        ["top", "{f}", "--ignore", " "],
    ],
)
def test_empty_names_are_refused_not_matched_everywhere(capsys, guide_file, argv):
    rc, out, err = run(capsys, *[a.format(f=guide_file) for a in argv])
    one_line(rc, out, err, "the name is empty")


def test_explain_of_an_empty_name_from_python():
    with pytest.raises(NoSuchFunctionError, match="empty"):
        explain(build_tree(guide_profile(), 0), "")


def test_negative_folded_counts_are_refused(capsys, tmp_path):
    stacks = tmp_path / "stacks.folded"
    stacks.write_text("main;work 100\nmain;other -40\n")
    rc, out, err = run(capsys, "report", stacks)
    one_line(rc, out, err, "line 2: the count -40 is negative")


@pytest.mark.parametrize(
    "text",
    ["import torch\nx = torch.zeros(3)\n", "# My notes\n\nSome words here\n", "hello world\n"],
)
def test_text_that_is_no_profile_says_so(capsys, tmp_path, text):
    path = tmp_path / "notes.py"
    path.write_text(text)
    rc, out, err = run(capsys, "top", path)
    one_line(rc, out, err, "not a profile")
    assert "whole number" not in err


def test_gzip_of_something_else_is_no_profile(capsys, tmp_path):
    import gzip

    path = tmp_path / "data.tar.gz"
    path.write_bytes(gzip.compress(b"data/train.csv" + b"\0" * 100))
    rc, out, err = run(capsys, "report", path)
    one_line(rc, out, err, "not a profile gpuflame can read")
    assert "protobuf" not in err


@pytest.mark.parametrize("obj, kind", [([1, 2], "list"), ({"a": 1}, "dict"), ("text", "str")])
def test_a_pickle_that_is_no_snapshot_says_so(capsys, tmp_path, obj, kind):
    import pickle

    path = tmp_path / "thing.pickle"
    path.write_bytes(pickle.dumps(obj))
    rc, out, err = run(capsys, "top", path)
    one_line(rc, out, err, f"not a profile: a pickle of a {kind}")
