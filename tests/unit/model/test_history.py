"""The event history (model/history.py) and the verbs at/between (model/moment.py), and their CLI.

Expectations come from replaying the same events naively in the test, never
from the code under test.
"""

from __future__ import annotations

import base64
import json
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuflame.cli.main import main
from gpuflame.errors import GpuflameError
from gpuflame.formats import load, pprof, save
from gpuflame.model import Profile, merge
from gpuflame.model import history as event_history
from gpuflame.model.history import DAMAGED_NOTE, PREFIX, EventLog, History
from gpuflame.model.moment import ALLOCATIONS_ONLY, NO_HISTORY, PEAK, at, between, origin, parse_when
from gpuflame.model.process_table import process_rows
from gpuflame.model.sample_types import memory_sample_types
from gpuflame.symbols.names import CACHED_FREE
from tests.helpers.history_events import EVENTS, FRAMES, SITES, T0, S, profile_of
from tests.helpers.paths import DATA


def naive_live(events: list[tuple[int, int, int]], t: int) -> dict[str, int]:
    """Leaf frame -> live bytes after every event up to *t*: the test's own replay."""
    out: dict[str, int] = {}
    for when, site, size in events:
        if when <= t:
            name = FRAMES[SITES[site][0][0]].name
            out[name] = out.get(name, 0) + size
    return {k: v for k, v in out.items() if v}


def by_leaf(p: Profile) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in p.samples:
        if not s.stack:  # a process that held nothing then (0 B, its labels only)
            continue
        name = p.frames[s.stack[0]].name
        out[name] = out.get(name, 0) + s.values[0]
    return {k: v for k, v in out.items() if v}


def test_a_recordings_end_read_back_to_the_microsecond_is_still_its_end() -> None:
    """Seconds written to the microsecond (report's phase end) can land up to 0.5 us past the recording's end."""
    end = 7 * S + 123_456_789  # not a whole microsecond after the strip's 0
    p = profile_of(EVENTS, end=end)
    zero = origin(p)
    written = round((T0 + end - zero) / 1e9, 6)  # as report --json writes a phase's end_s
    assert T0 + end < zero + round(written * 1e9)  # read back, it lands past the end
    assert by_leaf(at(p, written)) == {"load_model": 1000, "step": 70}
    with pytest.raises(GpuflameError, match="past the end of the recording"):
        at(p, written + 0.01)  # well past the end


def test_at_is_what_was_live_and_between_what_was_allocated() -> None:
    p = profile_of(EVENTS)
    assert by_leaf(at(p, 3.5)) == {"load_model": 1000, "alloc_kv": 400, "step": 50}
    assert at(p, 3.5).totals()["inuse_objects"] == 3
    assert by_leaf(at(p, 4)) == {"load_model": 1000, "alloc_kv": 400}  # an event at T counts at T
    assert by_leaf(between(p, 2.5, 5)) == {"step": 120}
    assert between(p, 2.5, 5).totals()["alloc_objects"] == 2
    assert by_leaf(at(p, "peak")) == {"load_model": 1000, "alloc_kv": 400, "step": 70}
    moment = at(p, 3.5)
    kv = next(s for s in moment.samples if s.values[0] == 400)
    assert moment.stack_frames(kv) == [FRAMES[1], FRAMES[0]] and kv.labels == (("device", "cpu"), ("pid", "1"))


def test_times_are_seconds_from_the_strips_start() -> None:
    p = profile_of(EVENTS, start=S // 2)  # window opened at 0.5 s: the strip's 0
    assert origin(p) == T0 + S // 2
    assert by_leaf(at(p, 1.0)) == naive_live(EVENTS, int(1.5 * S))


def test_folding_keeps_every_later_moment_exact_and_refuses_earlier_ones() -> None:
    events = [(k * S // 10, k % 3, 100 + k) for k in range(1, 40)] + [(5 * S, 0, -101)]
    p = profile_of(events, limit=8)
    track = p.history.tracks[0]
    assert track.folded > 0 and len(track.times) < 8
    fold_s = (track.fold - T0) / S
    for t in (fold_s, fold_s + 0.05, 4.5, 5.0, 6.0):
        assert by_leaf(at(p, t)) == naive_live(events, round(t * S))
    with pytest.raises(GpuflameError, match="not available: the history of pid 1 before .* was folded"):
        at(p, fold_s - 0.1)
    with pytest.raises(GpuflameError, match="not available"):
        between(p, fold_s - 0.1, 4)
    window = [e for e in events if fold_s + 0.01 <= e[0] / S <= 5.0 and e[2] > 0]
    assert window and by_leaf(between(p, fold_s + 0.01, 5.0)) == naive_live(window, 10 * S)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 2), st.integers(1, 1000)), min_size=1, max_size=60),
    st.integers(2, 12),
    st.floats(0, 7),
)
def test_any_moment_after_the_fold_equals_a_naive_replay(allocs, limit, when) -> None:
    events, live = [], []
    for k, (site, size) in enumerate(allocs):
        events.append(((k + 1) * S // 10, site, size))
        live.append((site, size))
        if k % 3 == 2:  # free the oldest still live
            site0, size0 = live.pop(0)
            events.append(((k + 1) * S // 10 + 1, site0, -size0))
    p = profile_of(events, limit=limit)
    t = round(when * S)
    if p.history.tracks[0].folded and T0 + t < p.history.tracks[0].fold:
        with pytest.raises(GpuflameError, match="not available"):
            at(p, when)
    else:
        assert by_leaf(at(p, when)) == naive_live(events, t)


def test_history_survives_the_pprof_file_and_a_damaged_one_is_dropped_with_a_note() -> None:
    p = profile_of(EVENTS, limit=4)
    back = pprof.decode(pprof.encode(p))
    assert back.history == p.history and p.history.tracks[0].folded
    assert [len(t.times) for t in back.history.tracks] == [len(t.times) for t in p.history.tracks]
    assert not any(c.startswith(PREFIX) for c in back.comments)
    p.comments.append(PREFIX + "bm90IHpsaWI=")
    p.history = None
    damaged = pprof.decode(pprof.encode(p))
    assert damaged.history is None and DAMAGED_NOTE in damaged.comments


def test_a_merge_keeps_each_process_on_the_common_clock() -> None:
    a = profile_of([(1 * S, 0, 1000), (4 * S, 0, -1000)], pid="1", end=5 * S)
    b = profile_of([(3 * S, 2, 30)], pid="2", start=2 * S, end=9 * S)
    merged = merge([a, b], labels=[{"pid": 1}, {"pid": 2}])
    assert by_leaf(at(merged, 3.5)) == {"load_model": 1000, "step": 30}
    assert by_leaf(at(merged, 6)) == {"step": 30}
    assert {s.label("pid") for s in at(merged, 3.5).samples} == {"1", "2"}
    assert by_leaf(between(merged, 0.5, 3)) == {"load_model": 1000, "step": 30}


def test_a_process_that_held_nothing_at_a_moment_keeps_its_row_at_0_bytes() -> None:
    """A moment of a merged run has every process whose window covers it: one that held nothing then is a row
    of 0 B in the table per process (report --at of a 3-process DataLoader run showed none, and --json's
    processes was [], as only one process had anything live); one whose window does not cover it has none."""
    a = profile_of([(1 * S, 0, 1000), (4 * S, 0, -1000)], pid="1", end=5 * S)
    b = profile_of([(3 * S, 2, 30)], pid="2", start=2 * S, end=9 * S)
    merged = merge([a, b], labels=[{"pid": 1}, {"pid": 2}])
    rows = {r.info.pid: r.at_joint_peak for r in process_rows(at(merged, 2.5))}
    assert rows == {"1": 1000, "2": 0}
    assert {r.info.pid: r.at_joint_peak for r in process_rows(at(merged, 6))} == {"2": 30}  # pid 1 had ended
    assert {r.info.pid: r.at_joint_peak for r in process_rows(between(merged, 4.5, 5))} == {"1": 0, "2": 0}
    assert at(merged, 2.5).totals()["inuse_space"] == 1000


def test_parse_when() -> None:
    assert parse_when("1.5") == 1.5 and parse_when("250ms") == 0.25 and parse_when("2s") == 2.0
    assert parse_when(" Peak ") == "peak"
    assert parse_when("+2s") == ("start", 2.0) and parse_when("+250ms") == ("start", 0.25)
    assert parse_when("14:03:07.5") == ("clock", 14 * 3600 + 3 * 60 + 7.5) and parse_when("9:05") == ("clock", 32700)
    for bad in ("-1", "x", "nan", "inf", "+x", "25:00", "12:61", "1:2:3:4"):
        with pytest.raises(ValueError):
            parse_when(bad)
    # finite seconds whose nanoseconds are not: round(inf) was OverflowError, 'internal error' (exit 3)
    for bad in ("1e308", "+1e308s", "+1e300ms", "1e13"):
        with pytest.raises(ValueError, match="is longer than any recording"):
            parse_when(bad)
    assert parse_when("1e12") == 1e12


def test_a_moment_from_the_recordings_start_or_on_the_wall_clock() -> None:
    """The strip's 0 is the first allocation (4 s after the recording started here); +S counts from the start,
    HH:MM:SS is local wall-clock time; every moment says where 0 is."""
    from datetime import datetime

    p = profile_of(EVENTS)
    p.time_nanos = T0 - 4 * S  # torch's import took 4 s before anything was recorded
    assert by_leaf(at(p, ("start", 5.0))) == naive_live(EVENTS, 1 * S) == {"load_model": 1000}
    wall = datetime.fromtimestamp((T0 + 3.5 * S) / 1e9)
    clock = wall.hour * 3600 + wall.minute * 60 + wall.second + wall.microsecond / 1e6
    assert by_leaf(at(p, ("clock", clock))) == by_leaf(at(p, 3.5))
    zero = datetime.fromtimestamp(T0 / 1e9).strftime("%H:%M:%S.%f")[:-3]
    assert f"0 s is the first allocation at {zero}, 4.000 s after the recording started" in at(p, 3.5).moment
    with pytest.raises(GpuflameError, match="before the recording started"):
        at(p, ("clock", (clock - 3600) % 86400))


def test_merged_histories_share_frames_and_sites() -> None:
    one = profile_of(EVENTS).history
    both = event_history.merged([one, one], [(("pid", "1"),), (("pid", "2"),)])
    assert len(both.frames) == len(FRAMES) and len(both.sites) == len(SITES) and len(both.tracks) == 2


# -- the CLI --------------------------------------------------------------------------


def run(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as exc:
        rc = int(exc.code or 0)
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def history_file(tmp_path: Path) -> Path:
    p = profile_of(EVENTS)
    p.add([FRAMES[0]], [1000, 1, 1000, 1, 1000, 1], {"device": "cpu", "pid": "1"})
    path = tmp_path / "h.pb.gz"
    save(p, path)
    return path


@pytest.mark.parametrize("command", ["report", "top", "flame", "explain"])
def test_every_showing_command_takes_at_and_between(capsys, history_file: Path, command: str) -> None:
    extra = ["step"] if command == "explain" else []
    rc, out, err = run(capsys, command, history_file, *extra, "--at", "3.5", "--json")
    assert rc == 0, err
    assert "what was live at 3.500 s" in out
    rc, out, err = run(capsys, command, history_file, *extra, "--between", "2.5", "5", "--json")
    assert rc == 0, err
    assert "what was allocated from 2.500 s to 5.000 s" in out


def test_report_json_of_a_moment(capsys, history_file: Path) -> None:
    rc, out, err = run(capsys, "report", history_file, "--at", "3.5", "--json")
    data = json.loads(out)
    assert data["total"] == 1450 and data["sample_type"] == "inuse_space"
    assert data["moment"].startswith("what was live at 3.500 s (")
    assert data["moment"].endswith("from the event history)")
    assert "0 s is the first allocation at " in data["moment"]


def test_export_and_view_take_a_moment(capsys, history_file: Path, tmp_path: Path) -> None:
    folded = tmp_path / "m.folded"
    rc, _, err = run(capsys, "export", history_file, "--between", "2.5", "5", "-o", folded)
    assert rc == 0, err
    assert folded.read_text().splitlines()[1:] == ["step 120"]
    rc, _, err = run(capsys, "view", history_file, "--at", "2", "-o", tmp_path / "m.html")
    assert rc == 0, err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--at", "99"], "past the end of the recording (it spans 0 to 10.000 s"),
        (["--between", "5", "2"], "the window ends before it starts"),
        (["--at", "soon"], "expected a time: 1.5 or 250ms (on the strip, 0 = its first allocation)"),
    ],
)
def test_bad_times_are_one_line_and_exit_2(capsys, history_file: Path, argv: list[str], says: str) -> None:
    rc, out, err = run(capsys, "report", history_file, *argv)
    assert rc == 2 and says in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_profile_without_history_says_so(capsys, tmp_path: Path) -> None:
    p = Profile(memory_sample_types())
    p.add([FRAMES[0]], [1, 1, 1, 1, 1, 1])
    save(p, tmp_path / "old.pb.gz")
    assert load(tmp_path / "old.pb.gz").history is None
    rc, _, err = run(capsys, "top", tmp_path / "old.pb.gz", "--at", "1")
    assert rc == 2 and NO_HISTORY in err and len(err.strip().splitlines()) == 1


def _comment(payload: dict) -> str:
    text = json.dumps(payload).encode()
    return PREFIX + base64.b64encode(zlib.compress(text)).decode()


@pytest.mark.parametrize(
    "change",
    [
        {"t": [1, -5]},
        {"s": [0, 9]},
        {"b": [1.5, 2]},
        {"t": [2**63, 0]},
        {"s": [0]},
        {"base": [[0, 1]]},
    ],
)
def test_a_history_comment_is_untrusted_input(change: dict) -> None:
    track = {
        "labels": [],
        "start": 1,
        "end": 0,
        "fold": 1,
        "folded": 0,
        "base": [],
        "t": [1, 1],
        "s": [0, 0],
        "b": [10, -10],
    }
    good = {"frames": [["f", "a.py", 1, "python", 0]], "sites": [[[0], []]], "tracks": [track]}
    assert History.from_comment(_comment(good)).tracks[0].sizes.tolist() == [10, -10]
    bad = {**good, "tracks": [{**track, **change}]}
    with pytest.raises(ValueError, match="damaged history"):
        History.from_comment(_comment(bad))


@pytest.mark.parametrize("by", ["category", "phase"])
def test_top_by_label_at_a_moment_says_moments_are_not_split(capsys, tmp_path: Path, by: str) -> None:
    """The whole recording is labelled; a moment is not: say that, not "only torch records them"."""
    p = profile_of(EVENTS)
    p.add(
        [FRAMES[0]],
        [1000, 1, 1000, 1, 1000, 1],
        {"device": "cpu", "pid": "1", "category": "parameter", "phase": "load"},
    )
    save(p, tmp_path / "labelled.pb.gz")
    rc, _, err = run(capsys, "top", tmp_path / "labelled.pb.gz", "--by", by, "--at", "3.5")
    if by == "phase":  # the history never keeps phases
        assert rc == 2 and "--at and --between profiles are not split by phase" in err
    else:  # it keeps categories: a history without them is an older file's, not every moment's
        assert rc == 2 and "this profile's event history carries no categories" in err
        assert "not split by category" not in err


@pytest.mark.parametrize("when", [["--at", "+0.5s"], ["--between", "+0.2s", "+0.5s"]])
def test_top_by_category_of_an_empty_moment_says_it_is_empty(capsys, tmp_path: Path, when: list[str]) -> None:
    """Before the first allocation nothing was live: say so, not that moments carry no categories."""
    p = profile_of(EVENTS)  # the recording starts at T0, its first allocation is 1 s later
    save(p, tmp_path / "p.pb.gz")
    rc, _, err = run(capsys, "top", tmp_path / "p.pb.gz", "--by", "category", *when)
    assert rc == 2 and "no categories to show: what was" in err and ": 0 B" in err
    assert "not split by" not in err and "carries no categories" not in err
    assert "only the torch backends" not in err and "mark them with" not in err


def _payload(comment: str) -> dict:
    return json.loads(zlib.decompress(base64.b64decode(comment[len(PREFIX) :])))


def test_the_comment_holds_every_field_of_every_track() -> None:
    """The stored JSON, field by field (times as differences from the fold, then from the previous event)."""
    one, two = profile_of(EVENTS).history, profile_of(EVENTS[:2], pid="2é", start=S // 2).history
    both = event_history.merged([one, two])
    payload = _payload(both.to_comment())
    assert payload["frames"] == [[f.name, f.file, f.line, f.kind, f.start_line] for f in both.frames]
    assert payload["sites"] == [[list(stack), [list(p) for p in labels]] for stack, labels in both.sites]
    for stored, track in zip(payload["tracks"], both.tracks, strict=True):
        assert stored == {
            "labels": [list(p) for p in track.labels],
            "start": track.start,
            "end": track.end,
            "fold": track.fold,
            "folded": track.folded,
            "base": [[s, b, c] for s, (b, c) in sorted(track.base.items())],
            "t": [b - a for a, b in zip([track.fold, *track.times[:-1]], track.times, strict=True)],
            "s": list(track.sites),
            "b": list(track.sizes),
        }
    assert History.from_comment(both.to_comment()) == both


def test_a_full_history_is_written_without_a_copy_of_its_events_in_python_objects() -> None:
    """stop() writes the history: its memory must stay near the compressed size, not the ~100 bytes an event
    that lists of ints and one JSON text cost (55 MiB above the recording's plateau at a full history)."""
    import tracemalloc
    from array import array

    n = 300_000
    times = array("q", (T0 + i * 1000 for i in range(n)))
    track = event_history.Track(
        (),
        T0,
        T0 + n * 1000,
        T0,
        0,
        {},
        times,
        array("q", [i % 3 for i in range(n)]),
        array("q", [64 if i % 2 == 0 else -64 for i in range(n)]),
    )
    history = History(list(FRAMES), list(SITES), [track])
    tracemalloc.start()
    try:
        comment = history.to_comment()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * len(comment) + (2 << 20)  # the comment and its base64 copy, and a chunk of text
    assert History.from_comment(comment).tracks[0].sizes == track.sizes


# -- --at counts live allocations only; on a snapshot that also holds the reserve it says so --------


def test_a_moment_of_a_snapshot_with_cached_blocks_says_it_counts_allocations_only() -> None:
    """At the peak's instant, --at gave 12.x GiB where the report's peak said 13.2 GiB, with no word why."""
    profile = load(DATA / "torch-snapshot-MAGMA27-memory_snapshot.pickle.gz")
    assert any(frame.name == CACHED_FREE for frame in profile.frames)
    moment = at(profile, PEAK)
    assert moment.totals()["inuse_space"] < profile.totals()["peak_space"]
    assert ALLOCATIONS_ONLY in moment.comments


def test_a_moment_of_a_profile_without_a_reserve_says_nothing_of_it() -> None:
    """The torch CPU hook's profiles hold no reserve: their moments and their peak count the same bytes."""
    profile = profile_of([(1 * S, 0, 100), (2 * S, 1, 50)])
    moment = at(profile, parse_when("3s"))
    assert moment.totals()["inuse_space"] == 150
    assert ALLOCATIONS_ONLY not in moment.comments


def test_top_by_category_of_a_moment_is_headed_by_the_moment(capsys, tmp_path: Path) -> None:
    """``top --at T --by category`` says what the moment is, not 'live at the end of the window'."""
    p = profile_of(EVENTS)
    sites = [(frames, (*labels, ("category", "parameter"))) for frames, labels in SITES]
    p.history = History(list(FRAMES), sites, p.history.tracks)
    save(p, tmp_path / "c.pb.gz")
    rc, out, err = run(capsys, "top", tmp_path / "c.pb.gz", "--by", "category", "--at", "3.5")
    assert rc == 0, err
    headline = next(line for line in out.splitlines() if line.startswith("inuse_space"))
    assert "what was live at 3.500 s" in headline and "end of the window" not in out
    assert "parameter" in out


def test_a_moments_process_rows_are_what_each_process_held_then(capsys) -> None:
    """report --at of a merged run: each rank's table read 'total 0 B' under 'at the peak' (a moment has no peak)."""
    from gpuflame.model.process_table import process_rows
    from gpuflame.model.processes import ProcessInfo
    from gpuflame.render.console import make_console
    from gpuflame.render.process_tables import process_table

    a = profile_of([(1 * S, 0, 1000), (4 * S, 0, -1000)], pid="1", end=5 * S)
    b = profile_of([(3 * S, 2, 30)], pid="2", start=2 * S, end=9 * S)
    merged = merge([a, b], labels=[{"pid": 1}, {"pid": 2}])
    merged.processes = [ProcessInfo("1", rank="0", peak=1000), ProcessInfo("2", rank="1", peak=30)]
    for moment, held, column in (
        (at(merged, 3.5), [1000, 30], "live at this moment"),
        (between(merged, 2.5, 3), [0, 30], "allocated in this window"),
    ):
        rows = process_rows(moment)
        assert [r.at_joint_peak for r in rows if r.at_joint_peak] == [h for h in held if h]
        assert all(r.moment == moment.sample_types[0].type and "at_moment" in r.to_dict() for r in rows)
        make_console().print(process_table(rows[-1], joint=True))
        shown = capsys.readouterr().out
        assert column in shown and "30 B" in shown and "at the joint peak" not in shown


@pytest.mark.parametrize("command", [["top"], ["top", "--by", "category"], ["report"], ["flame"]])
def test_a_moment_is_described_once_on_the_terminal(capsys, tmp_path: Path, command: list[str]) -> None:
    """The title says which moment; the same words also came as a 'note:' right above or below it."""
    p = profile_of(EVENTS)
    assert p.history is not None
    sites = [(stack, (("category", "parameter"), *labels)) for stack, labels in SITES]
    p.history = History(list(FRAMES), sites, p.history.tracks)
    p.comments.append("a caveat of the recorder")
    save(p, tmp_path / "p.pb.gz")
    rc, out, _ = run(capsys, command[0], tmp_path / "p.pb.gz", *command[1:], "--at", "3.5")
    flat = " ".join(out.split())
    assert rc == 0 and flat.count("what was live at 3.500 s") == 1 and "note: a caveat of the recorder" in flat


def test_a_merge_sums_the_folded_bytes_of_two_sites_that_are_one() -> None:
    """Two recorder keys can name one site (one line, one category: a block classed at its allocation and
    one classed later). Folded, each has its row in the base; a merge (every gpuflame run) kept only the
    last row, and a 2-layer model built on one line lost its first layer from every moment after the fold."""
    log = EventLog(T0, limit=4)  # full at 4 events: the oldest 2 are folded
    for t, key, size in ((1, 10, 16384), (2, 11, 2048), (3, 12, 50), (4, 12, -50)):
        log.add(T0 + t * S, key, size)
    assert log.folded == 2 and set(log.base) == {10, 11}
    assert log.track(T0 + 10 * S, sites={10: 0, 11: 0, 12: 1}).base == {0: (18432, 2)}  # renumbered onto one
    layer = (("category", "parameter"),)
    h = event_history.of_track(
        log.track(T0 + 10 * S),
        frames_of=lambda key: [FRAMES[0]] if key in (10, 11) else [FRAMES[2]],
        labels_of=lambda key: layer if key in (10, 11) else (),
    )
    p = Profile(memory_sample_types())
    p.time_nanos = T0
    p.history = h
    assert by_leaf(at(p, 5)) == {"load_model": 18432}  # one file, as the recorder wrote it
    assert by_leaf(at(merge([p], labels=[{"pid": 1}]), 5)) == {"load_model": 18432}


def test_reports_phase_table_under_a_moment_says_it_is_the_whole_recordings(capsys, tmp_path: Path) -> None:
    """report --at 0.1 listed a phase that began after it, under 'each phase's own peak' with no word."""
    from gpuflame.model.phases import PhaseStat

    p = profile_of(EVENTS)
    p.add([FRAMES[0]], [1000, 1, 1000, 1, 1000, 1], {"device": "cpu", "pid": "1", "phase": "train"})
    p.phases = [PhaseStat("train", device="cpu", pid="1", start=T0 + 5 * S, end=T0 + 6 * S, peak=1000)]
    save(p, tmp_path / "p.pb.gz")
    _, whole, _ = run(capsys, "report", tmp_path / "p.pb.gz")
    _, moment, _ = run(capsys, "report", tmp_path / "p.pb.gz", "--at", "3.5")
    assert "By phase: each phase's own peak (bytes)" in whole and "whole recording" not in whole
    assert "By phase: each phase's own peak (bytes), over the whole recording" in moment
