"""A function bar's file:line is where the function is defined; a chain shows each call's line.

The workload allocates 40 B at line 5 and 4 MB at line 6 of ``build``
(defined at line 4): the bar must say line 4 whatever line was seen first,
``explain`` must say 15 -> 11 -> 6 (the calls and the big allocation), and
``--lines`` must keep one bar per line.
"""

from __future__ import annotations

import json
import pickle
import textwrap
from pathlib import Path

import pytest

from gpuflame.analysis.tree import build_tree
from gpuflame.formats import load, loads, pprof, speedscope
from gpuflame.model import Frame, Profile, SampleType
from gpuflame.render import svg
from gpuflame.render.html import viewer_data
from tests.helpers.cli import run, run_json
from tests.helpers.run_cli import gpuflame_run

WORKLOAD = """\
import torch


def build():
    small = torch.zeros(10)
    big = torch.zeros(1_000_000)
    return small, big


def main():
    keep = build()
    return keep


held = main()
"""
SMALL, BIG = 10 * 4, 1_000_000 * 4


@pytest.fixture(scope="module")
def captured(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("deflines")
    (folder / "lines.py").write_text(WORKLOAD)
    done = gpuflame_run("-o", "lines.pb.gz", "--backend", "torch", "lines.py", cwd=folder)
    assert done.returncode == 0, done.stderr
    return folder / "lines.pb.gz"


@pytest.mark.subprocess
def test_captured_frames_know_where_their_function_starts(captured):
    profile = load(captured)
    starts = {(f.name, f.line): f.start_line for f in profile.frames if f.file.endswith("lines.py")}
    assert starts[("build", 5)] == starts[("build", 6)] == 4
    assert starts[("main", 11)] == 10 and starts[("<module>", 15)] == 1


@pytest.mark.subprocess
def test_top_and_report_show_the_def_line_not_the_first_line_seen(capsys, captured):
    top = run_json(capsys, "top", captured)
    [build] = [f for f in top["functions"] if f["name"] == "build"]
    assert (build["line"], build["def_line"], build["self"]) == (4, 4, SMALL + BIG)
    report = run_json(capsys, "report", captured)
    leaf = report["widest_leaves"][0]
    assert (leaf["name"], leaf["line"]) == ("build", 4)
    rc, out, _ = run(capsys, "top", captured)
    assert rc == 0 and "lines.py:4" in out and "lines.py:5" not in out


@pytest.mark.subprocess
def test_lines_keeps_one_bar_per_line(capsys, captured):
    top = run_json(capsys, "top", captured, "--lines")
    by_line = {f["line"]: f["self"] for f in top["functions"] if f["name"] == "build"}
    assert by_line == {5: SMALL, 6: BIG}
    assert all(f["def_line"] == 4 for f in top["functions"] if f["name"] == "build")


@pytest.mark.subprocess
def test_explain_shows_the_line_of_each_call(capsys, captured):
    ex = run_json(capsys, "explain", captured, "build")
    steps = ex["chains"][0]["steps"]
    assert [(s["name"], s["line"], s["def_line"]) for s in steps] == [
        ("<module>", 15, 1),
        ("main", 11, 10),
        ("build", 6, 4),
    ]
    assert steps[-1]["lines"] == [{"line": 6, "total": BIG}, {"line": 5, "total": SMALL}]
    rc, out, _ = run(capsys, "explain", captured, "build")
    assert rc == 0 and "lines.py:15" in out and "lines.py:11" in out and "lines.py:6 +1 line" in out


@pytest.mark.subprocess
def test_pprof_keeps_start_line_in_the_function_and_the_line_in_the_location(captured):
    profile = load(captured)
    again = pprof.decode(pprof.encode(profile))
    assert again.frames == profile.frames
    assert b"\x28\x04" in pprof.encode_raw(profile)  # Function.start_line (field 5) = 4, for build


@pytest.mark.subprocess
def test_svg_speedscope_and_the_viewer_show_the_def_line(captured):
    profile = load(captured)
    index = profile.type_index("peak_space")
    picture = svg.encode(profile, index)
    assert "lines.py:4" in picture and "lines.py:5" not in picture and "lines.py:6" not in picture
    doc = json.loads(speedscope.encode(profile, index))
    assert {f["line"] for f in doc["shared"]["frames"] if f["name"] == "build"} == {4}
    data = viewer_data(profile, "t")
    frames = data["frames"]
    lines = {n: ln for n, ln in zip(frames["name"], frames["line"], strict=True)}
    assert (lines["build"], lines["main"], lines["<module>"]) == (4, 10, 1)


def test_a_function_without_a_known_def_line_shows_its_file_only():
    p = Profile(sample_types=[SampleType("inuse_space", "bytes")])
    p.add([Frame("build", "/gone/lines.py", 6)], [BIG])
    p.add([Frame("build", "/gone/lines.py", 5)], [SMALL])
    tree = build_tree(p, 0)
    [root] = tree.roots()
    assert tree.frame(root).line == 0 and tree.frame(root).location() == "/gone/lines.py"


def snapshot_of(frames: list[dict]) -> bytes:
    block = {"address": 0, "size": 512, "requested_size": 512, "state": "active_allocated", "frames": frames}
    segment = {
        "device": 0,
        "address": 0,
        "total_size": 512,
        "allocated_size": 512,
        "active_size": 512,
        "requested_size": 512,
        "stream": 0,
        "segment_type": "small",
        "blocks": [block],
    }
    return pickle.dumps({"segments": [segment], "device_traces": []})


def test_a_snapshot_gets_def_lines_from_the_source_and_says_when_it_cannot(tmp_path):
    source = tmp_path / "model.py"
    source.write_text(
        textwrap.dedent("""\
        class Model:
            @staticmethod
            def forward():
                a = 1
                return a
        """)
    )
    here = loads(snapshot_of([{"filename": str(source), "line": 5, "name": "forward"}]))
    [frame] = [f for f in here.frames if f.name == "Model > forward"]
    assert (frame.line, frame.start_line) == (5, 2)  # co_firstlineno: the decorator's line
    assert not any("defined is unknown" in c for c in here.comments)
    gone = loads(snapshot_of([{"filename": "/nowhere/model.py", "line": 5, "name": "forward"}]))
    assert [f.start_line for f in gone.frames if f.name == "forward"] == [0]
    assert any(c.startswith("definition lines unknown for functions of /nowhere/model.py") for c in gone.comments)


@pytest.mark.subprocess
def test_a_profile_without_def_lines_says_why_its_bars_have_no_line(capsys, tmp_path, captured):
    old = Profile(sample_types=[SampleType("inuse_space", "bytes")])
    old.add([Frame("build", "/app/lines.py", 6), Frame("<module>", "/app/lines.py", 15)], [BIG])
    path = tmp_path / "old.pb.gz"
    path.write_bytes(pprof.encode(old))
    notes = run_json(capsys, "top", path)["comments"]
    assert notes == [
        "definition lines unknown for functions of /app/lines.py (the profile records only the lines "
        "that ran): their bars show the file without a line; --lines and explain show the lines they ran"
    ]
    assert not any("definition lines" in c for c in run_json(capsys, "top", captured)["comments"])


DECORATED = """\
import functools
import torch


def logged(f):
    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        return f(*args, **kwargs)
    return wrapper


class Model:
    @logged
    @torch.no_grad()
    def make(
        self,
    ):
        return torch.empty(1 << 20, dtype=torch.uint8)


held = Model().make()
"""


@pytest.mark.subprocess
def test_a_decorated_function_is_named_at_its_def_not_its_first_decorator(tmp_path: Path, capsys) -> None:
    """co_firstlineno is the first decorator's line (13); the bar says the def (15) in every view."""
    (tmp_path / "deco.py").write_text(DECORATED)
    done = gpuflame_run("-o", "deco.pb.gz", "--backend", "torch", "deco.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    recorded = [f for f in load(tmp_path / "deco.pb.gz").frames if f.name == "Model > make"]
    assert {f.start_line for f in recorded} == {13}  # as CPython records it
    data = run_json(capsys, "report", tmp_path / "deco.pb.gz")
    [leaf] = [e for e in data["widest_leaves"] if e["name"] == "Model > make"]
    assert (leaf["line"], leaf["def_line"]) == (15, 15)
    profile = load(tmp_path / "deco.pb.gz")
    frames = viewer_data(profile, "t")["frames"]
    lines = {ln for n, ln in zip(frames["name"], frames["line"], strict=True) if n == "Model > make"}
    assert lines == {15}


def test_the_note_names_the_first_three_files_in_order_and_counts_the_rest() -> None:
    from gpuflame.model.functions import def_lines_note

    files = {f"/app/m{i:02d}.py" for i in (7, 3, 11, 5, 2)}
    assert def_lines_note(files).startswith(
        "definition lines unknown for functions of /app/m02.py, /app/m03.py, /app/m05.py and 2 more files ("
    )
    assert "more files" not in def_lines_note(["/b.py", "/a.py"])
    assert def_lines_note(["/b.py", "/a.py"]).startswith("definition lines unknown for functions of /a.py, /b.py (")
