"""gpuflame's own data (timeline, peaks, processes, event history) in pprof field 1000, not in comments.

``go tool pprof -top`` prints every comment before its table: a history
written as a comment was kilobytes to megabytes of base64 on the screen.
Field 1000 (``gpuflame_data``) is not pprof's: Go's pprof and Pyroscope skip
it. Files written before it, with the data in comments, read as they did:
``tests/data/gpuflame-0.1.0-data-in-comments.pb.gz`` is one, written by
``gpuflame run --backend torch`` on a small CPU script.
"""

from __future__ import annotations

import gzip
import re
import shutil
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

from gpuflame import limits
from gpuflame.errors import ProfileFormatError
from gpuflame.formats import load, pprof
from gpuflame.formats import protobuf_encode as wire
from gpuflame.formats.pprof_proto import profile_pb2, split_profile_pb2
from gpuflame.formats.pprof_read import UNREAD_DATA_NOTE
from gpuflame.model import Profile, history, peak, phases, processes, timeline
from tests.helpers.paths import DATA

OLD_FILE = DATA / "gpuflame-0.1.0-data-in-comments.pb.gz"
PREFIXES = (timeline.PREFIX, peak.PREFIX, phases.PREFIX, processes.PREFIX, history.PREFIX)
GO = shutil.which("go")


def kept(p: Profile) -> tuple:
    """What gpuflame's data and the rest of a profile must keep through a file."""
    samples = [(tuple(p.frames[i] for i in s.stack), s.values, s.labels) for s in p.samples]
    return (p.comments, p.timeline, p.peaks, p.phases, p.processes, p.history, p.sample_types, samples)


def raw_of(p: Profile) -> bytes:
    return gzip.decompress(pprof.encode(p))


@pytest.fixture(scope="module")
def old() -> Profile:
    return load(OLD_FILE)


def test_the_old_file_holds_its_data_in_comments() -> None:
    """The fixture is what it stands for: every data entry a comment, no field 1000."""
    raw = gzip.decompress(OLD_FILE.read_bytes())
    message = profile_pb2.Profile.FromString(raw)
    comments = [message.string_table[i] for i in message.comment]
    assert {p for p in PREFIXES if any(c.startswith(p) for c in comments)} >= {timeline.PREFIX, history.PREFIX}
    assert list(split_profile_pb2.SplitProfile.FromString(raw).gpuflame_data) == []


def test_a_file_with_the_data_in_comments_still_reads_and_leaves_only_the_notes(old: Profile) -> None:
    assert old.timeline is not None and old.peaks and old.processes
    assert old.history is not None and old.history.events() > 0
    assert old.comments and not any(c.startswith(PREFIXES) for c in old.comments)


def test_written_again_the_data_moves_to_its_field_and_reads_back_the_same(old: Profile) -> None:
    raw = raw_of(old)
    message = profile_pb2.Profile.FromString(raw)
    assert [message.string_table[i] for i in message.comment] == old.comments
    entries = [e.decode() for e in split_profile_pb2.SplitProfile.FromString(raw).gpuflame_data]
    assert sorted(e.split(":", 1)[0] + ":" for e in entries) == sorted(
        p for p in PREFIXES if p != phases.PREFIX or old.phases
    )
    assert not any(s.startswith(PREFIXES) for s in message.string_table)  # nor in the string table
    assert kept(pprof.decode(raw)) == kept(old)
    assert kept(pprof.decode_in_process(raw)) == kept(old)  # the standard library's parse reads the field too


def test_each_kind_of_data_survives_save_and_load(tmp_path: Path) -> None:
    from tests.helpers.history_events import EVENTS, T0, profile_of

    p = profile_of(EVENTS, limit=4)
    p.timeline = timeline.Timeline({(("pid", "1"),): [(T0, 0), (T0 + 5, 1000), (T0 + 9, 400)]})
    p.phases = [phases.PhaseStat("train", "cpu", "1", T0, T0 + 9, 1000, T0 + 5, 400, "load_model", 1000)]
    p.peaks = [peak.PeakUnit("cpu", start=T0, end=T0 + 9, pid="1")]
    p.processes = [processes.ProcessInfo("1", argv=("python", "train.py"), peak=1000, peak_ns=T0 + 5, devices=("cpu",))]
    p.comments = ["a note for people"]
    path = tmp_path / "h.pb.gz"
    path.write_bytes(pprof.encode(p))
    entries = split_profile_pb2.SplitProfile.FromString(gzip.decompress(path.read_bytes())).gpuflame_data
    assert sorted(e.decode().split(":", 1)[0] + ":" for e in entries) == sorted(PREFIXES)
    back = load(path)
    assert kept(back) == kept(p) and back.comments == ["a note for people"]
    assert back.history is not None and back.history.tracks[0].folded


def test_an_entry_this_version_does_not_read_is_one_note_not_a_comment(old: Profile) -> None:
    later = "gpuflame-later-v9:" + "QUJD" * 1000
    raw = raw_of(old) + wire.field_string(1000, later) + wire.field_string(1000, later + "x")
    back = pprof.decode(raw)
    assert later not in back.comments and back.comments == [*old.comments, UNREAD_DATA_NOTE]
    assert back.history == old.history


def test_a_damaged_entry_is_a_note_as_a_damaged_comment_was(old: Profile) -> None:
    raw = raw_of(Profile(old.sample_types)) + wire.field_string(1000, history.PREFIX + "bm90IHpsaWI=")
    back = pprof.decode(raw)
    assert back.history is None and back.comments == [history.DAMAGED_NOTE]


def test_the_entries_count_against_the_comments_limit(monkeypatch, old: Profile) -> None:
    raw = raw_of(Profile(old.sample_types)) + wire.field_string(1000, "x") * 6
    monkeypatch.setenv(limits.COMMENTS.env, "5")
    with pytest.raises(ProfileFormatError, match=limits.COMMENTS.env):
        pprof.decode(raw)
    monkeypatch.setenv(limits.COMMENTS.env, "6")
    assert pprof.decode(raw).comments == [UNREAD_DATA_NOTE]


def test_the_entries_inflate_under_the_comment_data_budget(monkeypatch, old: Profile) -> None:
    raw = raw_of(old)
    monkeypatch.setenv(limits.COMMENT_DATA_BYTES.env, "100")
    with pytest.raises(ProfileFormatError, match=limits.COMMENT_DATA_BYTES.env):
        pprof.decode(raw)


# =============================================================================
# Go's pprof
# =============================================================================

BASE64_RUN = re.compile(r"[A-Za-z0-9+/=]{200,}")


def _go(*args: str) -> str:
    assert GO is not None
    return subprocess.run([GO, "tool", "pprof", *args], capture_output=True, text=True, check=True).stdout


@pytest.mark.subprocess
@pytest.mark.skipif(GO is None, reason="go is not installed (apt-get install golang-go)")
def test_go_tool_pprof_top_prints_the_notes_not_the_data_and_the_same_total(tmp_path: Path, old: Profile) -> None:
    path = tmp_path / "new.pb.gz"
    path.write_bytes(pprof.encode(old))
    top = _go("-top", "-unit=B", str(path))
    assert not BASE64_RUN.search(top) and not any(p in top for p in PREFIXES)
    for note in old.comments:
        assert note in top
    index = [st.type for st in old.sample_types].index(old.default_type or old.sample_types[-1].type)
    total = sum(s.values[index] for s in old.samples)
    assert f"of {total}B total" in top
    old_top = _go("-top", "-unit=B", str(OLD_FILE))  # the same file with its data in comments: the same total
    assert BASE64_RUN.search(old_top) and f"of {total}B total" in old_top


@pytest.mark.subprocess
@pytest.mark.skipif(GO is None, reason="go is not installed (apt-get install golang-go)")
def test_go_tool_pprof_proto_reads_and_rewrites_the_file(tmp_path: Path, old: Profile) -> None:
    """pprof keeps no field it does not know: its copy holds the samples and notes, not gpuflame's data."""
    path, out = tmp_path / "new.pb.gz", tmp_path / "rewritten.pb.gz"
    path.write_bytes(pprof.encode(old))
    out.write_bytes(subprocess.run([GO, "tool", "pprof", "-proto", str(path)], capture_output=True, check=True).stdout)
    back = load(out)
    assert back.comments == old.comments and back.history is None and back.timeline is None
    for st in old.sample_types:
        index = [t.type for t in back.sample_types].index(st.type)
        mine = old.sample_types.index(st)
        assert sum(s.values[index] for s in back.samples) == sum(s.values[mine] for s in old.samples)


def test_a_pyroscope_push_carries_the_notes_and_no_history_nor_timeline(push_pb2: ModuleType, old: Profile) -> None:
    """ship/pyroscope.py drops the viewer's aids before pushing, as it did; what else is data rides in field 1000."""
    from gpuflame.ship.pyroscope import push_request
    from tests.helpers.pyroscope_server import decode_push

    assert old.history is not None and old.timeline is not None
    series = decode_push(push_request(old, {"service_name": "t"}), push_pb2, profile_pb2)
    assert series
    for _, message in series:  # Google's Profile (as Pyroscope's parser) reads it, field 1000 aside
        assert [message.string_table[i] for i in message.comment] == old.comments
        entries = split_profile_pb2.SplitProfile.FromString(message.SerializeToString()).gpuflame_data
        assert any(e.startswith(peak.PREFIX.encode()) for e in entries)  # the field came through the parse
        assert not any(e.startswith((history.PREFIX.encode(), timeline.PREFIX.encode())) for e in entries)
