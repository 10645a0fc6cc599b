"""analysis/selection.py: the one view of a profile every front end builds (the CLI, serve, the notebook, the
pytest plugin), each field on its own, the notes of a filter that matched nothing, and the CLI and serve
giving the same page for the same selection."""

from __future__ import annotations

import argparse
import http.client
import threading
from pathlib import Path
from urllib.parse import parse_qs

import pytest

from gpuflame.analysis.selection import Selection
from gpuflame.cli.common import add_analysis_options, selection_from_args
from gpuflame.cli.main import main
from gpuflame.errors import GpuflameError
from gpuflame.formats import save
from gpuflame.model import Frame, Profile, memory_sample_types
from gpuflame.model.filter import focus_matched, hide_matched, ignore_matched, select_labels_matched
from gpuflame.model.history import EventLog, History
from gpuflame.model.processes import ProcessInfo
from gpuflame.model.profile import TRAMPOLINE_KIND
from gpuflame.model.timeline import Timeline
from gpuflame.serve import make_server
from gpuflame.symbols.names import CACHED_FREE
from tests.helpers.viewer_profiles import embedded

MS = 1_000_000
T0 = 1_767_225_600_000_000_000
main_f = Frame("<module>", "train.py", 1)
train = Frame("Trainer > train", "train.py", 20)
linear = Frame("Linear > forward", "/venv/site-packages/torch/nn/modules/linear.py", 116)
empty = Frame("empty", "/venv/site-packages/torch/_refs/__init__.py", 4000)
tramp = Frame("<interpreter trampoline>", kind=TRAMPOLINE_KIND)


def profile() -> Profile:
    """Two processes; a stack through torch, one through a trampoline, and the allocator's cached blocks."""
    p = Profile(memory_sample_types())
    p.add([empty, linear, train, main_f], [600, 1, 500, 1, 600, 1], {"pid": "1"})
    p.add([Frame("small", "train.py", 30), tramp, train, main_f], [100, 1, 100, 1, 100, 1], {"pid": "2"})
    p.add([Frame(CACHED_FREE)], [300, 0, 300, 0, 0, 0], {"pid": "1"})
    return p


def with_history() -> Profile:
    """1 s of one process: 10 allocations of 100 B, one every 100 ms, none freed."""
    p = Profile(memory_sample_types())
    p.add([Frame("hold", "/app/a.py", 3)], [1000, 10, 1000, 10, 1000, 10], {"device": "cpu", "pid": "1"})
    points = [(T0 + k * 100 * MS, 100 * k) for k in range(11)]
    p.timeline = Timeline({(("device", "cpu"), ("pid", "1")): points})
    log = EventLog(T0, 1000)
    for t, _ in points[1:]:
        log.add(t, 0, 100)
    p.history = History(
        [Frame("hold", "/app/a.py", 3)], [((0,), (("device", "cpu"),))], [log.track(T0 + 1000 * MS, (("pid", "1"),))]
    )
    return p


def leaves(p: Profile, index: int = 0) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in p.samples:
        name = p.frames[s.stack[0]].name if s.stack else ""
        out[name] = out.get(name, 0) + s.values[index]
    return out


def names(p: Profile) -> set[str]:
    return {p.frames[f].name for s in p.samples for f in s.stack}


# ---------------------------------------------------------------- the model's filters say whether they matched


def test_each_filter_says_whether_it_matched() -> None:
    p = profile()
    assert ignore_matched(p, "linear").matched and not ignore_matched(p, "nowhere").matched
    assert focus_matched(p, "train").matched and not focus_matched(p, "nowhere").matched
    assert hide_matched(p, "trampoline").matched and not hide_matched(p, "nowhere").matched
    assert select_labels_matched(p, "pid", {"2"}).matched and not select_labels_matched(p, "pid", {"9"}).matched
    assert len(ignore_matched(p, "nowhere").profile.samples) == 3


# ---------------------------------------------------------------- each field


def test_the_default_selection_is_the_whole_profile_at_its_peak() -> None:
    p = profile()
    view = Selection().apply(p)
    assert view.profile is p and view.notes == () and p.sample_types[view.type_index].type == "peak_space"
    assert Selection().words() == []


def test_sample_type() -> None:
    view = Selection(sample_type="inuse").apply(profile())
    assert view.profile.sample_types[view.type_index].type == "inuse_space"


def test_labels_same_key_any_of_and_a_label_that_leaves_nothing_is_an_error() -> None:
    assert leaves(Selection(labels=(("pid", "2"),)).apply(profile()).profile) == {"small": 100}
    both = Selection(labels=(("pid", "1"), ("pid", "2"))).apply(profile()).profile
    assert len(both.samples) == 3
    with pytest.raises(GpuflameError, match=r"no sample has label pid=9 \(pid values here: 1, 2\)"):
        Selection(labels=(("pid", "9"),)).apply(profile())


def test_no_cached() -> None:
    assert CACHED_FREE not in names(Selection(no_cached=True).apply(profile()).profile)


def test_ignore_and_its_note_when_it_matched_nothing() -> None:
    view = Selection(ignore=("linear",)).apply(profile())
    assert "empty" not in leaves(view.profile) and view.notes == ()
    missed = Selection(ignore=("lienar",)).apply(profile())
    assert len(missed.profile.samples) == 3
    assert missed.notes == ("--ignore changed nothing: no function matches 'lienar'; did you mean 'Linear > forward'?",)


def test_focus_roots_at_the_function_and_one_that_matches_nothing_is_an_error() -> None:
    view = Selection(focus="Trainer.train").apply(profile())
    assert all(view.profile.frames[s.stack[-1]].name == "Trainer > train" for s in view.profile.samples)
    with pytest.raises(GpuflameError, match="--focus: no function matches 'nowhere'"):
        Selection(focus="nowhere").apply(profile())
    assert Selection(focus="x").apply(Profile(memory_sample_types())).profile.samples == []  # empty: no error


def test_hide_and_its_note_and_hide_trampolines_without_one() -> None:
    view = Selection(hide=("trampoline",)).apply(profile())
    assert "<interpreter trampoline>" not in names(view.profile) and view.notes == ()
    assert Selection(hide=("nowhere",)).apply(profile()).notes[0].startswith("--hide changed nothing: ")
    no_tramp = Selection(hide_trampolines=True)
    assert no_tramp.apply(no_tramp.apply(profile()).profile).notes == ()  # a flag: nothing to hide is fine


def test_prune_framework_and_min_size() -> None:
    pruned = Selection(prune_framework=("torch",)).apply(profile()).profile
    assert "empty" not in names(pruned) and "Linear > forward" in names(pruned)  # the entry into torch stays
    small = Selection(min_size=200).apply(profile()).profile
    assert "<frames under 200 B>" in names(small) and "small" not in names(small)
    assert sum(leaves(small).values()) == 1000  # what was folded still counts


def test_at_and_between_read_the_history() -> None:
    at = Selection(at=0.45).apply(with_history())
    assert at.profile.sample_types[at.type_index].type == "inuse_space" and at.profile.totals()["inuse_space"] == 400
    window = Selection(between=(0.25, 0.55)).apply(with_history())
    assert window.profile.totals()["alloc_space"] == 300


def two_processes() -> Profile:
    """pid 1 holds 100 B from 0.1 s on; pid 2 (function ``late``) allocates 50 B at 0.9 s."""
    hold, late = Frame("hold", "/app/a.py", 3), Frame("late", "/app/b.py", 7)
    p = Profile(memory_sample_types())
    p.add([hold], [100, 1, 100, 1, 100, 1], {"device": "cpu", "pid": "1"})
    p.add([late], [50, 1, 50, 1, 50, 1], {"device": "cpu", "pid": "2"})
    tracks = []
    for pid, site, t, size in (("1", 0, 100, 100), ("2", 1, 900, 50)):
        log = EventLog(T0, 1000)
        log.add(T0 + t * MS, site, size)
        tracks.append(log.track(T0 + 1000 * MS, (("pid", pid),)))
    p.history = History([hold, late], [((0,), (("device", "cpu"),)), ((1,), (("device", "cpu"),))], tracks)
    return p


def test_a_moment_where_a_label_or_focus_held_nothing_is_0_bytes_and_a_typo_an_error() -> None:
    """At 0.5 s pid 2 held nothing yet: --label pid=2 is a moment of 0 B, as at the peak a process holding
    nothing is. It was 'no sample has label pid=2 (pid values here: 1)', exit 2, while pid 2 is in the file
    (a DataLoader worker of a GPT-2 training run, asked about at its main process's peak)."""
    assert Selection(at=0.5).apply(two_processes()).profile.totals()["inuse_space"] == 100
    for sel in (Selection(at=0.5, labels=(("pid", "2"),)), Selection(at=0.5, focus="late")):
        view = sel.apply(two_processes())
        assert view.profile.totals()["inuse_space"] == 0 and not any(any(s.values) for s in view.profile.samples)
    assert Selection(at=0.95, labels=(("pid", "2"),)).apply(two_processes()).profile.totals()["inuse_space"] == 50
    assert Selection(between=(0.0, 0.5), focus="late").apply(two_processes()).profile.totals()["alloc_space"] == 0
    with pytest.raises(GpuflameError, match=r"no sample has label pid=9 \(pid values here: 1, 2\)"):
        Selection(at=0.5, labels=(("pid", "9"),)).apply(two_processes())
    with pytest.raises(GpuflameError, match="--focus: no function matches 'lat3'"):
        Selection(at=0.5, focus="lat3").apply(two_processes())


def test_group_by_and_lines_shape_the_tree() -> None:
    grouped = Selection(group_by="pid").apply(profile()).tree().table
    assert grouped.offset == 1 and {"pid=1", "pid=2"} <= {f.name for f in grouped.frames}
    p = Profile(memory_sample_types())
    for line in (10, 20):  # one function, two lines
        p.add([Frame("f", "a.py", line, start_line=5)], [1] * 6)
    assert len(Selection().apply(p).tree().table.frames) == 1
    assert [f.line for f in Selection(lines=True).apply(p).tree().table.frames] == [10, 20]


def test_words_are_the_command_line_in_filter_order() -> None:
    sel = Selection(
        hide=("a b",),
        focus="f",
        ignore=("i",),
        labels=(("pid", "1"),),
        no_cached=True,
        hide_trampolines=True,
        prune_framework=("torch", "jax"),
        min_size=4096,
    )
    assert sel.words() == [
        "--label pid=1",
        "--no-cached",
        "--ignore i",
        "--focus f",
        "--hide 'a b'",
        "--hide-trampolines",
        "--prune-framework=torch,jax",
        "--min-size 4096",
    ]


# ---------------------------------------------------------------- every front end builds the same one

ARGV = [
    "--type",
    "inuse",
    "--label",
    "pid=1",
    "--label",
    "pid=2",
    "--no-cached",
    "--ignore",
    "nowhere",
    "--focus",
    "train",
    "--hide",
    "trampoline",
    "--hide-trampolines",
    "--prune-framework=torch",
    "--min-size",
    "64",
    "--lines",
]
QUERY = (
    "type=inuse&label=pid%3D1&label=pid%3D2&no-cached&ignore=nowhere&focus=train&hide=trampoline"
    "&hide-trampolines=1&prune-framework=torch&min-size=64&lines"
)


def test_the_command_line_and_a_query_give_the_same_selection() -> None:
    parser = argparse.ArgumentParser()
    add_analysis_options(parser)
    from_cli = selection_from_args(parser.parse_args(ARGV))
    from_query = Selection.from_query(parse_qs(QUERY, keep_blank_values=True))
    assert from_cli == from_query
    moment_args = parser.parse_args(["--between", "0.1", "+0.5s"])
    assert selection_from_args(moment_args) == Selection.from_query({"between": ["0.1", "+0.5s"]})


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ({"focus": [""]}, "focus: the name is empty"),
        ({"label": ["pid"]}, "label: expected KEY=VALUE"),
        ({"min-size": ["big"]}, "min-size: "),
        ({"between": ["1"]}, "between: give two times"),
        ({"at": ["1"], "between": ["1", "2"]}, "give one of them"),
        ({"colour": ["red"]}, "unknown parameter 'colour'"),
        ({"type": ["a", "b"]}, "type: give it once"),
    ],
)
def test_a_query_that_cannot_be_read_says_which_parameter(query: dict[str, list[str]], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        Selection.from_query(query)


def fetch(port: int, target: str, token: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("GET", target, headers={"Authorization": f"Bearer {token}"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def test_serve_shows_the_page_gpuflame_view_writes_for_the_same_selection(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    save(profile(), tmp_path / "p.pb.gz")
    out = tmp_path / "out"
    out.mkdir()
    assert main(["view", str(tmp_path / "p.pb.gz"), "-o", str(out / "p.html"), *ARGV[:-1]]) == 0  # no --lines
    assert "gpuflame view: warning: --ignore changed nothing" in capsys.readouterr().err
    server = make_server(tmp_path, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        assert server.token is not None
        status, body = fetch(server.port, f"/view/p.pb.gz?{QUERY.removesuffix('&lines')}", server.token.value)
        bad_status, bad = fetch(server.port, "/view/p.pb.gz?focus=nowhere", server.token.value)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    assert status == 200
    written, shown = embedded((out / "p.html").read_text()), embedded(body.decode())
    notes = [c for c in shown.pop("comments") if c not in written.pop("comments")]  # type: ignore[union-attr]
    assert shown == written  # the same frames, stacks, samples, types and default type
    assert notes == [
        "--ignore changed nothing: no function matches 'nowhere' (see `gpuflame top` for the names in this profile)"
    ]  # serve has no stderr: the page says it
    assert bad_status == 400 and b"--focus: no function matches" in bad


def test_a_process_of_the_run_that_held_nothing_is_0_bytes_and_an_unknown_one_an_error() -> None:
    """A DataLoader worker that never allocated has no sample, only its description in the run: `top --label
    pid=<it>` was 'no sample has label' (exit 2) though the run lists it (a trial); now 0 B, at the peak and at
    a moment. A pid the run does not describe is still an error."""
    p = two_processes()
    p.processes = [ProcessInfo("1"), ProcessInfo("2"), ProcessInfo("3")]  # pid 3 allocated nothing
    for sel in (Selection(labels=(("pid", "3"),)), Selection(at=0.5, labels=(("pid", "3"),))):
        view = sel.apply(p)
        assert not any(any(s.values) for s in view.profile.samples)
    with pytest.raises(GpuflameError, match=r"no sample has label pid=9 \(pid values here: 1, 2\)"):
        Selection(labels=(("pid", "9"),)).apply(p)


def test_a_process_idle_at_the_joint_peak_is_told_when_its_own_peak_was() -> None:
    """`top --label pid=<a DataLoader worker>` read 0 B at the joint peak and nothing more; the run had said
    'own peak 2.01 KiB at 1.209 s', and --at 1.209 fell half a millisecond after it (a trial): 0 B again.
    The view's note gives the moment to the nanosecond; a process that held memory at the peak gets none."""
    p = Profile(memory_sample_types())
    p.add([train, main_f], [600, 1, 0, 0, 600, 1], {"pid": "1"})
    p.add([Frame("collate", "w.py", 9)], [0, 0, 0, 0, 2056, 9], {"pid": "2"})
    p.timeline = Timeline({(("pid", "1"),): [(T0, 0), (T0 + 3000 * MS, 600)]})
    p.processes = [
        ProcessInfo("1", peak=600, peak_ns=T0 + 3000 * MS),
        ProcessInfo("2", peak=2056, peak_ns=T0 + 1_115_379_333),
    ]
    notes = Selection(labels=(("pid", "2"),)).apply(p).notes
    assert notes == (
        "pid 2 held nothing at the run's joint peak; its own peak, 2.01 KiB, was 1.115379333 s into the strip "
        "(--at 1.115379333 shows it)",
    )
    assert Selection(labels=(("pid", "1"),)).apply(p).notes == ()
    assert Selection(labels=(("pid", "2"),), sample_type="inuse").apply(p).notes == ()
