"""Hostile files through ``gpuflame report``, each in a child process with bounded memory.

The files are in ``tests/data/hostile/`` (its README says what each is).
Each child runs under ``RLIMIT_AS`` of 2 GiB, so a reader that regresses
to unbounded memory fails here instead of taking the machine; nothing is
timed. The larger bombs (the 306 KB gzip pickle of the issue, a gzip past
the inflated-bytes limit) are made here, in memory, from a few repeated
bytes.
"""

from __future__ import annotations

import gzip
import os
import pickle
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from gpuflame import limits
from gpuflame.errors import ProfileFormatError
from gpuflame.formats import dumps, load, loads, pprof
from gpuflame.model import Frame, Profile, SampleType
from tests.helpers.paths import DATA, FIXTURES, REPO

HOSTILE = DATA / "hostile"
ADDRESS_SPACE = 2 << 30

EXPECTED_EXIT = {
    "leading-zeros.folded": 0,
    "protocol-0.pickle": 0,
    "protocol-1.pickle": 0,
    "deep-stack.pb.gz": 2,
    "repeated-timeline.pb.gz": 0,
    "comment-bomb.pb.gz": 2,
    "list-bomb.pickle.gz": 0,
    "fuzz-unit-not-a-string.speedscope.json": 2,
    "fuzz-frame-line-2-63.pickle": 0,
}

CHILD = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))
from gpuflame.cli.main import main
sys.exit(main(["report", sys.argv[1]]))
"""


def report(path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``gpuflame report PATH`` in a child limited to 2 GiB of address space."""
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLAME_")} | env
    return subprocess.run(
        [sys.executable, "-c", CHILD.format(limit=ADDRESS_SPACE), str(path)],
        capture_output=True,
        text=True,
        env=child_env,
        timeout=600,
    )


def assert_plain(proc: subprocess.CompletedProcess[str], code: int) -> None:
    assert proc.returncode == code, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr[-2000:]
    assert len(proc.stderr.splitlines()) <= 1, proc.stderr[-2000:]
    if code == 2:
        assert proc.stderr.startswith("gpuflame report: error: "), proc.stderr


def hostile_files() -> list[str]:
    return sorted(p.name for p in HOSTILE.iterdir() if p.suffix not in (".md", ".py"))


def test_every_hostile_file_has_an_expected_outcome():
    assert set(hostile_files()) == set(EXPECTED_EXIT)


@pytest.mark.subprocess
@pytest.mark.parametrize("name", hostile_files())
def test_hostile_file_gives_one_line_and_a_plain_exit(name: str) -> None:
    assert_plain(report(HOSTILE / name), EXPECTED_EXIT[name])


def test_old_protocol_pickles_read_as_the_snapshot_they_hold():
    expected = loads((FIXTURES / "handwritten_oom.pickle").read_bytes())
    for name in ("protocol-0.pickle", "protocol-1.pickle"):
        got = loads((HOSTILE / name).read_bytes())
        assert [(s.stack, s.values, s.labels) for s in got.samples] == [
            (s.stack, s.values, s.labels) for s in expected.samples
        ]
        assert got.frames == expected.frames


@pytest.mark.subprocess
def test_the_deep_stack_names_its_limit():
    proc = report(HOSTILE / "deep-stack.pb.gz")
    assert "GPUFLAME_MAX_STACK_DEPTH" in proc.stderr and "16,384 frames" in proc.stderr


def test_a_stack_past_the_limit_loads_once_the_limit_is_raised(monkeypatch):
    deep = Profile(sample_types=[SampleType("inuse_space", "bytes")])
    deep.add([Frame("recurse", "a.py", 3)] * 20_000, [1])
    data = pprof.encode(deep)
    with pytest.raises(ProfileFormatError, match="GPUFLAME_MAX_STACK_DEPTH"):
        loads(data)
    monkeypatch.setenv("GPUFLAME_MAX_STACK_DEPTH", "20000")
    assert len(loads(data).samples[0].stack) == 20_000


@pytest.mark.subprocess
def test_the_comment_bomb_stops_at_the_comment_data_limit():
    assert "GPUFLAME_MAX_COMMENT_DATA_BYTES" in report(HOSTILE / "comment-bomb.pb.gz").stderr


def test_a_comment_named_twenty_times_is_parsed_once(monkeypatch):
    from gpuflame.model import timeline

    calls = []
    real = timeline._decode_payload
    monkeypatch.setattr(timeline, "_decode_payload", lambda payload: calls.append(1) or real(payload))
    p = loads((HOSTILE / "repeated-timeline.pb.gz").read_bytes())
    assert len(calls) == 1
    assert p.timeline is not None and max(len(v) for v in p.timeline.series.values()) <= timeline.MAX_POINTS


@pytest.mark.subprocess
@pytest.mark.parametrize(
    ("env", "limit"),
    [("GPUFLAME_MAX_INFLATED_BYTES", "1000000"), ("GPUFLAME_MAX_PICKLE_CONTAINERS", "1000000")],
)
def test_the_list_bomb_stops_at_a_lowered_limit(env: str, limit: str) -> None:
    proc = report(HOSTILE / "list-bomb.pickle.gz", **{env: limit})
    assert_plain(proc, 2)
    assert env in proc.stderr and "1,000,000" in proc.stderr


def _gzip_of_repeats(head: bytes, unit: bytes, megabytes: int) -> bytes:
    """gzip of *head* then *unit* repeated to *megabytes* MiB, made in microseconds.

    One MiB is deflated once with a full flush (byte-aligned, no shared
    dictionary), so its bytes can be repeated as they are. The trailer's
    CRC is computed (a megabyte at a time) for files under the limit.
    """
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"

    def segment(data: bytes, mode: int) -> bytes:
        z = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
        return z.compress(data) + z.flush(mode)

    data = unit * ((1 << 20) // len(unit))
    block = segment(data, zlib.Z_FULL_FLUSH)
    crc = zlib.crc32(head)
    for _ in range(megabytes):
        crc = zlib.crc32(data, crc)
    size = (len(head) + len(data) * megabytes) & 0xFFFFFFFF
    trailer = crc.to_bytes(4, "little") + size.to_bytes(4, "little")
    return header + segment(head, zlib.Z_FULL_FLUSH) + block * megabytes + segment(b"", zlib.Z_FINISH) + trailer


@pytest.mark.subprocess
def test_the_issue_pickle_bomb_stops_at_the_container_limit(tmp_path):
    """EMPTY_LIST opcodes past the container limit (the 306 KB file of the issue used 18.6 GB)."""
    bomb = tmp_path / "bomb.pickle.gz"
    bomb.write_bytes(_gzip_of_repeats(b"\x80\x04", b"]", (limits.PICKLE_CONTAINERS.default >> 20) + 1))
    proc = report(bomb)
    assert_plain(proc, 2)
    assert "GPUFLAME_MAX_PICKLE_CONTAINERS" in proc.stderr


@pytest.mark.subprocess
def test_a_gzip_past_the_inflated_limit_stops_there(tmp_path):
    """Empty pprof samples past the default inflated-bytes limit: stopped at it, within 2 GiB."""
    bomb = tmp_path / "bomb.pb.gz"
    bomb.write_bytes(_gzip_of_repeats(b"", b"\x12\x00", (limits.INFLATED_BYTES.default >> 20) + 1))
    assert len(bomb.read_bytes()) < 2 << 20
    proc = report(bomb)
    assert_plain(proc, 2)
    assert "GPUFLAME_MAX_INFLATED_BYTES" in proc.stderr


def test_a_gzip_bomb_costs_the_inflated_limit_once(monkeypatch):
    """Inflated in steps: one bounded call joined its output at the end, twice the limit (2.1 GB for 1 GiB)."""
    import tracemalloc

    from gpuflame.formats import gzip_io

    cap = 64 << 20
    monkeypatch.setenv("GPUFLAME_MAX_INFLATED_BYTES", str(cap))
    monkeypatch.setattr(gzip_io, "INFLATE_STEP", 1 << 20)
    bomb = _gzip_of_repeats(b"\x0a", b"\0" * 1024, 2 * cap >> 20)
    tracemalloc.start()
    try:
        with pytest.raises(ProfileFormatError, match="GPUFLAME_MAX_INFLATED_BYTES"):
            gzip_io.gunzip(bomb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < cap * 1.25, f"{peak:,} bytes at once for a limit of {cap:,}"


@pytest.mark.subprocess
def test_endless_standard_input_stops_at_the_inflated_limit():
    """``gpuflame report - < /dev/zero`` read until memory ran out: now it stops at the limit, within 2 GiB."""
    with open("/dev/zero", "rb") as zeros:
        proc = subprocess.run(
            [sys.executable, "-c", CHILD.format(limit=ADDRESS_SPACE), "-"],
            stdin=zeros,
            capture_output=True,
            text=True,
            env={k: v for k, v in os.environ.items() if not k.startswith("GPUFLAME_")},
            timeout=600,
        )
    assert_plain(proc, 2)
    assert "standard input: past gpuflame's limit of 1,073,741,824 bytes" in proc.stderr
    assert "GPUFLAME_MAX_INFLATED_BYTES" in proc.stderr


def test_a_file_past_the_inflated_limit_is_refused_before_it_is_read(tmp_path, monkeypatch):
    path = tmp_path / "big.folded"
    path.write_bytes(b"a;b 1\n" * 200)  # 1,200 bytes
    loads(path.read_bytes())  # a good profile
    monkeypatch.setenv("GPUFLAME_MAX_INFLATED_BYTES", "1000")
    with pytest.raises(ProfileFormatError, match=f"{path}: past gpuflame's limit of 1,000 bytes .*MAX_INFLATED"):
        load(path)


@pytest.mark.subprocess
def test_a_bad_limit_variable_is_one_line(tmp_path):
    path = tmp_path / "p.folded"
    path.write_text("a;b 1\n")
    proc = report(path, GPUFLAME_MAX_SAMPLES="lots")
    assert_plain(proc, 2)
    assert "GPUFLAME_MAX_SAMPLES" in proc.stderr


def test_protocol_0_pickle_is_not_sniffed_as_folded():
    from gpuflame.formats import detect

    assert detect(pickle.dumps({"segments": []}, protocol=0)) == "torch-snapshot"
    assert detect(pickle.dumps({"segments": []}, protocol=1)) == "torch-snapshot"
    assert detect(pickle.dumps({"segments": []}, protocol=0) + b"\n") == "torch-snapshot"
    assert detect(gzip.compress(pickle.dumps([], protocol=1))) == "torch-snapshot"
    assert detect(b"(frame);b 12\n") == "folded"


def _pprof_of(samples: int, comments: int = 0) -> bytes:
    p = Profile(sample_types=[SampleType("inuse_space", "bytes")], comments=[f"c{i}" for i in range(comments)])
    for i in range(samples):
        p.add([Frame(f"f{i}", "a.py", i)], [i + 1])
    return pprof.encode(p)


@pytest.mark.parametrize(
    ("env", "data"),
    [
        ("GPUFLAME_MAX_SAMPLES", lambda: _pprof_of(11)),
        ("GPUFLAME_MAX_FRAMES", lambda: _pprof_of(11)),
        ("GPUFLAME_MAX_COMMENTS", lambda: _pprof_of(1, comments=11)),
        ("GPUFLAME_MAX_SAMPLES", lambda: b"".join(b"a;b %d\n" % i for i in range(11))),
        ("GPUFLAME_MAX_FRAMES", lambda: b"".join(b"a%d 1\n" % i for i in range(11))),
        ("GPUFLAME_MAX_STACK_DEPTH", lambda: b";".join([b"f"] * 11) + b" 1\n"),
        ("GPUFLAME_MAX_SAMPLES", lambda: dumps(_rich_enough(), "speedscope")),
        ("GPUFLAME_MAX_STACK_DEPTH", lambda: (FIXTURES / "handwritten_small_trace.pickle").read_bytes()),
        ("GPUFLAME_MAX_STACK_FRAMES", lambda: b"".join(b"a;b %d\n" % i for i in range(1, 7))),
        ("GPUFLAME_MAX_STACK_FRAMES", lambda: _pprof_of(11)),
        ("GPUFLAME_MAX_STACK_FRAMES", lambda: _pprof_of(5000)),  # the bulk reader's columns
        ("GPUFLAME_MAX_STACK_FRAMES", lambda: dumps(_rich_enough(), "speedscope")),
    ],
)
def test_each_limit_stops_its_reader_with_its_name(monkeypatch, env: str, data) -> None:  # type: ignore[no-untyped-def]
    raw = data()
    loads(raw)  # under the default limits it reads
    monkeypatch.setenv(env, "10" if env != "GPUFLAME_MAX_STACK_DEPTH" else "2")
    with pytest.raises(ProfileFormatError, match=env) as caught:
        loads(raw)
    assert "\n" not in str(caught.value)
    assert ": past gpuflame's limit of 10 " in str(caught.value) or env == "GPUFLAME_MAX_STACK_DEPTH"


def _rich_enough() -> Profile:
    p = Profile(sample_types=[SampleType("inuse_space", "bytes")])
    for i in range(11):
        p.add([Frame("a", "a.py", 1), Frame(f"f{i}", "a.py", i)], [i + 1])
    return p


def test_stacks_that_share_leaf_middle_and_root_frames_are_not_compared_pairwise(monkeypatch):
    """Such lists (a crafted snapshot) shared one bucket, each new one compared with all before it:
    8,000 blocks took 40 s. Each is now compared with at most a few."""
    from gpuflame.formats import snapshot_stacks

    made = []
    real_init = snapshot_stacks.Stacks.__init__

    def keep(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        real_init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(snapshot_stacks.Stacks, "__init__", keep)

    def frame(name: str, line: int) -> dict[str, object]:
        return {"filename": f"/x/{name}.py", "line": line, "name": name}

    a, m, b = frame("a", 1), frame("m", 2), frame("b", 3)
    n = 500
    blocks = [
        {
            "size": 512,
            "requested_size": 512,
            "state": "active_allocated",
            "address": 4096 + 512 * i,
            "frames": [a, frame(f"x{i}", i), m, frame(f"y{i}", i), b],
        }
        for i in range(n)
    ]
    segment = {
        "device": 0,
        "address": 4096,
        "total_size": 512 * n,
        "allocated_size": 512 * n,
        "active_size": 512 * n,
        "requested_size": 512 * n,
        "stream": 0,
        "segment_type": "large",
        "blocks": blocks,
    }
    p = loads(pickle.dumps({"segments": [segment], "device_traces": [[]]}))
    assert len(p.samples) == n
    assert made and max(len(bucket) for bucket in made[0]._by_shape.values()) <= snapshot_stacks.SHAPE_BUCKET


def test_comment_json_of_empty_lists_stops_at_the_values_limit(monkeypatch):
    """'[],' repeated: 3 bytes of JSON, 64 bytes of list each once parsed; counted before parsing."""
    import base64
    import zlib

    from gpuflame.model import timeline

    text = b'{"series":[{"labels":[],"t":[' + b"[]," * 1000 + b'1],"b":[1]}]}'
    comment = timeline.PREFIX + base64.b64encode(zlib.compress(text)).decode()
    p = Profile(sample_types=[SampleType("inuse_space", "bytes")], comments=[comment])
    p.add([Frame("a", "a.py", 1)], [1])
    data = pprof.encode(p)
    assert loads(data).comments  # damaged under the default limits (t holds lists): a note
    monkeypatch.setenv("GPUFLAME_MAX_COMMENT_DATA_VALUES", "1000")
    with pytest.raises(ProfileFormatError, match="GPUFLAME_MAX_COMMENT_DATA_VALUES"):
        loads(data)


def test_limits_have_one_owner_and_one_variable_each():
    found = [v for v in vars(limits).values() if isinstance(v, limits.Limit)]
    assert set(found) == set(limits.ALL) and len(found) == len(limits.ALL)
    names = [limit.env for limit in limits.ALL]
    assert len(set(names)) == len(names) and all(n.startswith("GPUFLAME_MAX_") for n in names)
    page = (REPO / "docs" / "formats.md").read_text()  # where users read of them
    assert "GPUFLAME_MAX_" in page and "src/gpuflame/limits.py" in page


@pytest.mark.parametrize(
    ("data", "read_as"),
    [(b"garbage\n", "folded stacks"), (b"{not json", "speedscope JSON"), (bytes(range(200, 256)), "")],
)
def test_a_gz_name_over_bytes_that_are_not_gzip_says_so(tmp_path: Path, data: bytes, read_as: str) -> None:
    """A text file saved as run.pb.gz was reported as 'folded stacks, line 1: missing count' alone (new-user trial)."""
    from gpuflame.formats import load

    path = tmp_path / "run.pb.gz"
    path.write_bytes(data)
    with pytest.raises(ProfileFormatError) as named_gz:
        load(path)
    assert str(named_gz.value).startswith(f"{path}: its name ends in .gz but it is not gzip data")
    assert (f"read as {read_as};" in str(named_gz.value)) == bool(read_as)
    with pytest.raises(ProfileFormatError) as named_plain:
        load(path.rename(tmp_path / "run.folded"))
    assert "its name" not in str(named_plain.value)


def _with_lone_surrogates(snapshot: dict) -> dict:  # type: ignore[type-arg]
    for segment in snapshot["segments"]:
        for block in segment["blocks"]:
            for frame in block.get("frames", []):
                frame["name"], frame["filename"] = "f\ud800", "/src/\udcff.py"
    return snapshot


LONE_SURROGATES = {
    # JSON escapes a lone surrogate as \ud800; a pickle carries one as the bytes UTF-8 would have for it
    "speedscope": lambda: (
        b'{"$schema":"https://www.speedscope.app/file-format-schema.json","shared":{"frames":'
        b'[{"name":"f\\ud800","file":"/src/\\udcff.py"}]},"profiles":[{"type":"sampled","name":"x\\udc80",'
        b'"unit":"bytes","startValue":0,"endValue":1,"samples":[[0]],"weights":[1]}]}'
    ),
    "snapshot": lambda: pickle.dumps(
        _with_lone_surrogates(pickle.loads((FIXTURES / "handwritten_small_trace.pickle").read_bytes()))
    ),
}


@pytest.mark.parametrize("source", sorted(LONE_SURROGATES))
def test_lone_surrogates_read_as_replacement_characters_every_writer_can_write(source: str) -> None:
    """Every writer encodes UTF-8: a lone surrogate from a file was 'internal error: UnicodeEncodeError' (exit 3)."""
    from gpuflame.render import writers
    from gpuflame.render.html import render_html

    profile = loads(LONE_SURROGATES[source]())
    names = {f.name for f in profile.frames} | {f.file for f in profile.frames}
    assert "f\ufffd" in names and "/src/\ufffd.py" in names
    assert not any("\ud800" <= c <= "\udfff" for name in names for c in name)
    for fmt in writers.FORMATS:
        assert writers.dumps(profile, fmt)
    assert render_html(profile, "t").encode("utf-8")
